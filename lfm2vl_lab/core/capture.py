"""Capture: the one recipe every graph in the kit is recorded with, and the way back after a failed one.

Recipe (``capture_graph``): run the function a few times on a side stream first — lazy kernel
loading, cuBLAS handles and autotuning must happen *before* capture, because capture records launches
and cannot allocate handles — then capture one call into a ``torch.cuda.CUDAGraph`` with a memory
pool (graphs that share a pool reuse each other's blocks, so many budgets cost little more than the
largest).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture_graph(fn: Callable[[], object], pool=None, warmup: int = 2) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream ``warmup`` times, then capture one call of it into ``pool``.

    ``fn`` must read and write only persistent tensors (the graph replays the recorded addresses),
    so a body that returns a new tensor should copy it into an output buffer inside ``fn``.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


class EagerStandIn:
    """What a graph does, without one: ``replay()`` runs the recorded function again on the same
    persistent buffers. Lets the whole replay path (padding, slicing, order, stats) run on a CPU."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn

    def replay(self) -> None:
        self.fn()


def eager_stand_in(fn: Callable[[], object], pool=None, warmup: int = 0) -> EagerStandIn:
    """A drop-in for :func:`capture_graph` where there is no GPU (tests, teaching on a laptop). Like
    a capture it runs ``fn`` once now, so a body that fails, fails at capture time."""
    fn()
    return EagerStandIn(fn)


def recover_from_failed_capture(stream: torch.cuda.Stream | None = None) -> dict:
    """Put torch's CUDA state back after a ``torch.cuda.graph`` block raised; return what was done.

    When a capture fails, ``torch.cuda.graph.__exit__`` raises from ``capture_end()`` before it
    leaves the capture side stream, and before the CUDA random generator leaves capture mode. Two
    things then go wrong later in the same process: work keeps running on the side stream, and the
    next random op on the device raises "Offset increment outside graph capture encountered
    unexpectedly" (torch 2.11 on the H200: notebook 02 hit this in ``build_model``). So we restore
    ``stream`` (the default stream if ``None``), then capture one tiny graph that ends normally:
    a clean capture_begin/capture_end pair takes the generator out of capture mode again.
    """
    if not torch.cuda.is_available():
        return {"cuda": False}
    was = torch.cuda.current_stream()
    target = stream if stream is not None else torch.cuda.default_stream()
    torch.cuda.set_stream(target)
    scratch = torch.zeros(1, device=target.device)
    reset = torch.cuda.CUDAGraph()
    with torch.cuda.graph(reset):
        scratch.add_(1)
    del reset
    torch.cuda.synchronize()
    torch.randn(1, device=target.device)  # raises here, not later in the user's code, if still broken
    return {"cuda": True, "stream_restored": was != target, "rng_ok": True}
