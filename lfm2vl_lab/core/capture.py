"""Capture: the one recipe every graph in the kit is recorded with, and the way back after a failed one.

Recipe (``capture_graph``): run the function a few times on a side stream first — lazy kernel
loading, cuBLAS handles and autotuning must happen *before* capture, because capture records launches
and cannot allocate handles — then capture one call into a ``torch.cuda.CUDAGraph`` with a memory
pool (graphs that share a pool reuse each other's blocks, so many budgets cost little more than the
largest).

When a capture fails — a body that needs the host, a user's KeyboardInterrupt, memory running out —
``capture_failed`` puts the process back (stream, random generator, the failed capture's memory) and
says what happened in one line.
"""

from __future__ import annotations

import contextlib
import gc
import re
import traceback
from collections.abc import Callable

import torch

# Warm-up calls before a capture: the first compiles and autotunes, the second runs as the graph will.
WARMUP_ITERS = 2
# What other threads may do while a capture records: in "thread_local" mode only the capturing thread
# is barred from calls that would break it (a cudaMalloc, a synchronize), so another thread's encode
# or decode, with its allocations, may go on; in "global" mode (torch's default) they invalidate the
# capture. Inductor's cudagraph trees capture the same way. A device-wide torch.cuda.synchronize() in
# another thread still waits on the capturing stream, which no mode allows: on the H200 that capture
# failed with the one-line error and left no graph (data/results/nvidia-h200/probes/2026-12-02), so
# the kit's own phase clocks synchronize their stream, not the device.
CAPTURE_MODE = "thread_local"


@contextlib.contextmanager
def gc_paused():
    """Keep Python's cyclic garbage collector off until the block ends (a capture).

    A collection that runs inside a capture (it can start at any allocation, in any thread) may free
    an old graph that sits in a reference cycle, and destroying a graph while a capture is recording
    invalidates that capture ("operation not permitted when stream is capturing"; on the H200 with
    torch 2.11 the next cuBLAS call then failed). What the block leaves is collected after it, at the
    collector's next turn. No collection first: a full one costs a large process tens of ms or more on
    every capture call, which is why torch.cuda.graph no longer collects unless asked
    (``torch.compiler.config.force_cudagraph_gc``). Nested blocks do not turn the collector back on
    early."""
    if not gc.isenabled():  # an outer block paused it already
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def capture_graph(fn: Callable[[], object], pool=None, warmup: int = WARMUP_ITERS) -> torch.cuda.CUDAGraph:
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
    prepare_capture(torch.cuda.current_device())  # usually done already, when the manager was made
    graph = torch.cuda.CUDAGraph()
    try:
        with gc_paused(), torch.cuda.graph(graph, pool=pool, capture_error_mode=CAPTURE_MODE):
            fn()
    except BaseException as exc:
        if any(isinstance(e, torch.OutOfMemoryError) for e in _chain(exc)):
            keep_failed_graph(graph)
        raise
    return graph


# Graphs whose capture ran out of memory inside the captured region. There the allocator frees
# cached blocks, which invalidates the capture (pytorch/pytorch#159594), and on the H200 (torch 2.11)
# destroying such a graph later aborted the process, at the next garbage collection or at exit ("The
# graph should be registered to the state", thrown from its destructor). So they are never destroyed:
# each is referenced once more than Python knows. (A body that raises, or a KeyboardInterrupt, ends
# its capture normally, and its graph is freed as usual.)
FAILED_GRAPHS: list = []


def keep_failed_graph(graph) -> None:
    import ctypes

    FAILED_GRAPHS.append(graph)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(graph))  # outlives even the interpreter's own teardown


_SCRATCH: dict[int, torch.Tensor] = {}


def prepare_capture(device: int | torch.device) -> torch.Tensor:
    """Once per device, before memory can run short: two floats that the repair after a failed
    capture writes (so it allocates nothing), and one trivial graph captured, which makes torch
    allocate the random generator's per-graph state. Under memory pressure that first allocation
    failed *inside* ``capture_begin`` on the H200 and left a half-registered graph whose destructor
    aborted the process. The managers call this when they are made."""
    if isinstance(device, torch.device):
        device = device.index if device.index is not None else torch.cuda.current_device()
    if device not in _SCRATCH:
        buf = torch.zeros(2, device=torch.device("cuda", device))
        first = torch.cuda.CUDAGraph()
        with gc_paused(), torch.cuda.graph(first, capture_error_mode=CAPTURE_MODE):
            buf.add_(0)
        del first
        _SCRATCH[device] = buf
    return _SCRATCH[device]


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
    device = target.device.index if target.device.index is not None else torch.cuda.current_device()
    buf = _SCRATCH.get(device)
    if buf is None:  # never prepared: the repair has to allocate (and may itself run out of memory)
        buf = torch.zeros(2, device=torch.device("cuda", device))
    # Captured by hand, not through torch.cuda.graph, whose __enter__ empties the allocator's cache:
    # under memory pressure the cached blocks are what capture_begin's own small tensors fit into.
    reset = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream(device)):
        try:
            reset.capture_begin(capture_error_mode=CAPTURE_MODE)
        except torch.OutOfMemoryError:
            keep_failed_graph(reset)  # half registered: destroying it would abort the process
            raise
        try:
            buf.add_(1)  # in place: the repair allocates nothing (memory may be what ran out)
        finally:
            reset.capture_end()
    del reset
    torch.cuda.synchronize()
    buf.normal_()  # a random op, in place: raises here, not later in the user's code, if still broken
    return {"cuda": True, "stream_restored": was != target, "rng_ok": True}


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, then the exception it was raised while handling, and so on (at most 8)."""
    out: list[BaseException] = []
    while exc is not None and all(exc is not e for e in out) and len(out) < 8:
        out.append(exc)
        exc = exc.__context__
    return out


def _frames(exc: BaseException) -> set:
    tb, out = exc.__traceback__, set()
    while tb is not None:
        out.add(tb.tb_frame)
        tb = tb.tb_next
    return out


def release_frames(exc: BaseException) -> None:
    """Drop the locals of the finished frames a failed capture raised through.

    A notebook keeps the last traceback (``sys.last_traceback``), and a traceback keeps every frame's
    locals: the half-captured graphs, their buffers and the activations of the body, so the graph
    pool would stay reserved and the memory never come back. The exceptions ``exc`` was raised while
    handling are cleared too, as long as they were raised inside the same capture (they share a frame)."""
    seen = _frames(exc)
    for e in _chain(exc):
        mine = _frames(e)
        if e is not exc and not mine & seen:
            break  # raised before the capture began: the caller's own, not ours
        seen |= mine
        traceback.clear_frames(e.__traceback__)


_SIZE = r"([\d.]+ (?:bytes|[KMGT]iB))"
_OOM_NUMBERS = (("tried to allocate {}", rf"Tried to allocate {_SIZE}"),
                ("{} free on the device", rf"of which {_SIZE} is free"),
                ("{} allowed to this process", rf"{_SIZE} allowed"))


def oom_message(what: str, oom: BaseException, advice: str) -> str:
    """One line for a capture that ran out of memory: what, the numbers torch's message gives
    (asked, free, the process's limit), and what to do."""
    text = str(oom)
    found = [label.format(m.group(1)) for label, rx in _OOM_NUMBERS if (m := re.search(rx, text))]
    numbers = "; ".join(found) or (text.strip().splitlines() or ["no details"])[0][:160]
    return (f"capturing {what} ran out of GPU memory ({numbers}). No graph of this capture is used; "
            f"the eager path still works. {advice}")


def capture_failed(exc: BaseException, what: str, stream=None, cuda: bool = True, message=None,
                   advice: str = "Free GPU memory first.") -> BaseException:
    """After a capture of ``what`` raised ``exc``: put the process back and return what to raise.

    The frames' locals go (:func:`release_frames`), then, with ``cuda``,
    :func:`recover_from_failed_capture` restores ``stream`` and the random generator. Returned:
    ``exc`` itself when it is no ``Exception`` (a ``KeyboardInterrupt`` stays a stop); a
    ``torch.OutOfMemoryError`` with :func:`oom_message` when memory ran out anywhere in the chain
    (``capture_end`` may raise its own error after the body's); else ``message(exc)`` as a
    ``RuntimeError`` when ``message`` is given, or ``exc``. Raise it ``from exc`` when it is not ``exc``.
    """
    release_frames(exc)
    repair = ""
    if cuda and torch.cuda.is_available():
        # no empty_cache() here: the repair allocates nothing, and the failed capture's cached blocks
        # are what the eager path reuses next (the allocator frees cached blocks itself when it must)
        try:
            recover_from_failed_capture(stream)
        except torch.OutOfMemoryError as again:
            repair = (" The repair after it ran out of memory too: free memory, then call "
                      "lab.recover_from_failed_capture() before the next random op on the GPU.")
            exc = exc if isinstance(exc, torch.OutOfMemoryError) or not isinstance(exc, Exception) else again
    if not isinstance(exc, Exception):
        return exc
    oom = next((e for e in _chain(exc) if isinstance(e, torch.OutOfMemoryError)), None)
    if oom is not None:
        return torch.OutOfMemoryError(oom_message(what, oom, advice) + repair)
    return RuntimeError(message(exc)) if message is not None else exc


def encoder_capture_failure(budget: int, exc: BaseException) -> str:
    """The message of a failed capture. When the body raised inside ``torch.cuda.graph``,
    ``capture_end()`` raises too, and the body's error is its context: name that one."""
    cause = exc.__context__ if exc.__context__ is not None else exc
    first_line = (str(cause).strip().splitlines() or [""])[0][:200]
    return (f"capturing the {budget}-token encoder graph failed ({type(cause).__name__}: {first_line}). "
            "No graphs are installed; encode() runs the eager path. Usually something in the encoder body "
            "needs the host during capture (a .item(), .tolist() or a CPU tensor).")
