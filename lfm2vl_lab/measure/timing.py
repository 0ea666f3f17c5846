"""Timing: one call from an idle device, repeated calls, alternatives timed in turns, and the
statistics the benchmark reports (one ``percentile`` for the whole package).

On CUDA a call is timed with CUDA events, on the CPU with ``perf_counter``. Every call starts from
an idle device, so a measurement never includes the tail of earlier work.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch


def sync(device) -> None:
    """Wait for every kernel queued on ``device`` (no-op off CUDA)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device) -> tuple[float, Any]:
    """One call from an idle device, in ms, and its result: CUDA events on CUDA (host launch time
    included, since the start event fires at once on an idle stream), ``perf_counter`` on the CPU."""
    device = torch.device(device)
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int, device) -> list[float]:
    """``warmup`` untimed calls, then ``repeats`` timed calls (ms each)."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    return [time_call(fn, device)[0] for _ in range(repeats)]


def time_paired(calls: dict, repeats: int, warmup: int, device) -> dict[str, list[float]]:
    """Time several alternatives in turns: ``calls`` maps a name to ``fn`` or ``(fn, context)``.

    Round ``i`` times each alternative once, in the given order on even rounds and reversed on odd
    ones. A drift in the machine (clocks, a busy host) then lands on every alternative alike,
    instead of on whichever ran second, and sample ``i`` of one is paired with sample ``i`` of
    another. ``context`` (a context-manager factory, e.g. ``GraphedEncoder.installed``) is entered
    around each call but outside its timing. Returns ms per call, per name, in round order.

    A control for what pairing cannot remove: in ``e2e``, the decode steps never call the image
    encoder, so their per-token time should match between the alternatives; where it does not
    (``e2e.DECODE_DRIFT_WARN``), the process was disturbed during one of them.
    """
    device = torch.device(device)
    norm = {k: (v if isinstance(v, tuple) else (v, None)) for k, v in calls.items()}

    def timed(fn, ctx):
        with (ctx or contextlib.nullcontext)():
            return time_call(fn, device)[0]

    for fn, ctx in norm.values():
        for _ in range(warmup):
            timed(fn, ctx)
    out: dict[str, list[float]] = {k: [] for k in norm}
    names = list(norm)
    for i in range(repeats):
        for k in names if i % 2 == 0 else names[::-1]:
            out[k].append(timed(*norm[k]))
    return out


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0.0 for an empty list."""
    vals = sorted(values)
    if not vals:
        return 0.0
    pos = (len(vals) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


SUMMARY_KEYS = ("median_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "std_ms")


def summarize(times_ms: list[float]) -> dict:
    """median / p90 / p99 / mean / min / max / std of a list of timings (ms); all None if empty."""
    n = len(times_ms)
    if n == 0:
        return dict.fromkeys(SUMMARY_KEYS)
    mean = sum(times_ms) / n
    return {
        "median_ms": percentile(times_ms, 50), "p90_ms": percentile(times_ms, 90),
        "p99_ms": percentile(times_ms, 99), "mean_ms": mean, "min_ms": min(times_ms), "max_ms": max(times_ms),
        "std_ms": math.sqrt(sum((t - mean) ** 2 for t in times_ms) / n),
    }
