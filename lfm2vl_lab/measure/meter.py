"""Measuring a capture from outside: time per budget, the graph pool's memory, a progress bar.

The technique's ``capture(hook=...)`` calls a hook around each budget's capture and knows nothing
of timing or memory; :class:`CaptureMeter` is that hook. ``measured_capture(genc)`` is the usual
way in: it captures, and returns ``capture_info`` rows with ``capture_s``, ``pool_mb`` and
``total_mb`` added (pool plus the budget's persistent buffers).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def pool_bytes(segments: list[dict], pool) -> int:
    """Bytes the caching allocator holds for ``pool`` (a ``graph_pool_handle()``), from the segment
    list of ``torch.cuda.memory_snapshot()``: the memory the graphs captured into that pool keep.

    Why not a difference of ``memory_reserved()`` around each capture: the allocator frees and
    reuses cached blocks of the default pool at the same time (the warm-up's activations, earlier
    budgets' leftovers), so such deltas mix two pools and can go negative. A private pool only
    grows while its graphs live, so its own segments are the honest number.
    """
    pool = tuple(pool)
    return sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == pool)


class CaptureMeter:
    """A capture hook: wall time of each budget's capture (warm-up included) and the growth of the
    shared pool it caused, with an optional ``tqdm`` bar over ``total`` budgets."""

    def __init__(self, progress: bool = True, total: int | None = None):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="capturing encoder graphs", unit="graph", disable=not progress)
        self.pool_seen = 0  # bytes the pool held after the previous budget (a fresh pool holds none)

    def __call__(self, budget: int, pool, run: Callable[[], None]) -> dict:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        now = pool_bytes(torch.cuda.memory_snapshot(), pool)
        grown, self.pool_seen = now - self.pool_seen, now
        self.bar.update(1)
        return {"capture_s": seconds, "pool_mb": grown / 2**20}

    def close(self) -> None:
        self.bar.close()


def measured_capture(genc, progress: bool = True, warmup_iters: int = 2) -> list[dict]:
    """``genc.capture()`` through a :class:`CaptureMeter`; rows gain ``capture_s``, ``pool_mb`` and
    ``total_mb`` (pool + buffers), so the rows add up to what the graphs hold on the device."""
    meter = CaptureMeter(progress=progress, total=len(getattr(genc.config, "graph_budgets", genc.config.budgets)))
    try:
        rows = genc.capture(hook=meter, warmup_iters=warmup_iters)
    finally:
        meter.close()
    return [dict(r, total_mb=r["pool_mb"] + r["buffers_mb"]) for r in rows]


def graph_memory(rows: list[dict]) -> dict:
    """What the captured graphs hold on the device, in MiB, from :func:`measured_capture` rows: the
    shared pool (activations and workspaces baked into the graphs), the persistent buffers, the
    total, and ``per_budget`` (the rows themselves)."""
    pool, buffers = sum(r["pool_mb"] for r in rows), sum(r["buffers_mb"] for r in rows)
    return {"pool_mb": pool, "buffers_mb": buffers, "total_mb": pool + buffers, "per_budget": rows}
