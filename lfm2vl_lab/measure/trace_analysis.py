"""Reading a torch.profiler Chrome trace: kernels, launches, GPU-busy time, gaps, a timeline.

The trace is parsed here rather than through ``prof.key_averages()``, because the event layout of
the in-memory API changes between torch versions while the exported JSON has stayed stable:

* GPU work: ``cat`` ``kernel`` (older kineto: ``Kernel``), ``gpu_memcpy`` and ``gpu_memset``
  (counted apart from kernels; ``gpu_user_annotation`` lanes are ignored)
* host launch API calls: ``cat`` ``cuda_runtime`` / ``cuda_driver`` with a launch-type name
  (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cuLaunchKernel``, ``cudaGraphLaunch``,
  ``cudaMemcpyAsync``, ``cudaMemsetAsync``, …); other runtime calls (``cudaStreamSynchronize``,
  ``cudaEventRecord``) stay on the CPU timeline but are not counted as launches
* kernels and the API call that launched them share ``args.correlation``. When a CUDA graph is
  replayed, *every* kernel of the graph carries the correlation id of its one ``cudaGraphLaunch``,
  so kernels are counted from kernel events and launches from API events, never by matching ids.

When the trace holds ``lfm2vl_lab/call#i`` annotations (``profiling.profile_callable`` adds them),
:func:`analyze_trace` measures wall time and gaps *per call window* (so the synchronisation and the
Python loop between calls are not counted as idle GPU time) and divides counts by the number of
windows. Without them it divides by ``iters``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import NamedTuple

from .timing import percentile

CALL_PREFIX = "lfm2vl_lab/call#"

KERNEL_CATS = {"kernel"}
MEMCPY_CATS = {"gpu_memcpy", "memcpy"}
MEMSET_CATS = {"gpu_memset", "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
CPU_CATS = {"cpu_op", "operator", "user_annotation"}
# Prefixes of API calls that put work on a stream. Prefixes (not exact names) so that suffixed
# variants (``_ptsz``, ``_v2``, ``ExC``) are covered too.
LAUNCH_PREFIXES = (
    "cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch",
    "cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset",
)
GRAPH_LAUNCH_PREFIXES = ("cudaGraphLaunch", "cuGraphLaunch")
# How kineto names GPU copies and sets ("Memcpy HtoD (Pinned -> Device)", "Memset (Device)"). A
# timeline keeps only names, not categories, so this is how :func:`idle_gaps` tells them from kernels.
COPY_NAME_PREFIXES = ("Memcpy", "Memset")
KERNEL_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch")  # cudaLaunchKernel, and cuLaunchKernelEx (cuBLAS's GEMMs)
# The calls that make a CUDA graph, in the order they happen (prefixes: torch may call
# cudaGraphInstantiateWithFlags, CUDA may add _ptsz / _v2 suffixes)
GRAPH_APIS = ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cudaGraphLaunch")
PHASE_PREFIX = "graph_apis/"  # record_function names that mark the phases of a profiled run (phase_calls)
UNNAMED = "INVALID"  # kineto's name for an API call it has no name for


@dataclass
class ProfileReport:
    """What one profiled run says, with counts and times **per call** (averaged over ``calls``).

    * ``kernels`` — GPU kernel executions (a graph replay counts each of its kernels)
    * ``memcpys`` / ``memsets`` — GPU copy and set operations (not part of ``kernels``)
    * ``launch_calls`` — host launch API calls (kernel, graph, memcpy, memset launches)
    * ``launch_cpu_ms`` — host time spent inside those calls
    * ``graph_launches`` — ``cudaGraphLaunch`` calls
    * ``gpu_busy_ms`` — union of kernel intervals (overlapping kernels count once): the floor a
      perfect host could reach with these kernels
    * ``wall_ms`` — first CPU event of a call → max(last CPU event, last kernel end) of that call
    * ``gaps`` — every idle gap (µs) between consecutive busy kernel intervals inside a call
    * ``gap_count`` / ``gap_total_us`` per call; ``gap_median_us`` / ``gap_p90_us`` over all gaps
    * ``timeline`` — ``{"cpu": [(start_us, dur_us, name)], "gpu": [...]}`` relative to its first
      event; ``cpu_lane`` says whether the CPU lane holds CUDA API calls (``"runtime"``) or, on a
      trace without them, top-level CPU operators (``"ops"``); ``timeline_call`` names the call
      it covers (``None`` = the whole trace; for one call, only host events inside the call's
      annotation, so the synchronisation after it is left out)
    """

    calls: int = 1
    kernels: float = 0.0
    memcpys: float = 0.0
    memsets: float = 0.0
    launch_calls: float = 0.0
    launch_cpu_ms: float = 0.0
    graph_launches: float = 0.0
    gpu_busy_ms: float = 0.0
    kernel_sum_ms: float = 0.0
    memcpy_ms: float = 0.0
    wall_ms: float = 0.0
    gaps: list[float] = field(default_factory=list)
    gap_count: float = 0.0
    gap_median_us: float = 0.0
    gap_p90_us: float = 0.0
    gap_total_us: float = 0.0
    has_gpu: bool = False
    cpu_lane: str = "runtime"
    timeline_call: int | None = None
    timeline: dict = field(default_factory=lambda: {"cpu": [], "gpu": []})
    trace_path: str | None = None

    def as_dict(self, timeline: bool = True, gaps: bool = True) -> dict:
        """Plain JSON-ready dict; ``timeline=False`` / ``gaps=False`` drop the bulky lists."""
        d = asdict(self)
        d["timeline"] = {k: [list(e) for e in v] for k, v in self.timeline.items()}
        if not timeline:
            d.pop("timeline")
        if not gaps:
            d.pop("gaps")
        return d

    def summary(self) -> str:
        return (
            f"{self.kernels:.0f} kernels, {self.launch_calls:.0f} launch calls ({self.launch_cpu_ms:.3f} ms CPU), "
            f"{self.graph_launches:.0f} graph launches, GPU-busy {self.gpu_busy_ms:.3f} ms, "
            f"wall {self.wall_ms:.3f} ms, "
            f"{self.gap_count:.0f} gaps (median {self.gap_median_us:.1f} µs) per call"
        )


# --------------------------------------------------------------------------------------------
# Trace parsing
# --------------------------------------------------------------------------------------------


@dataclass
class _Ev:
    start: float
    dur: float
    name: str
    corr: int | None = None
    tid: object = None

    @property
    def end(self) -> float:
        return self.start + self.dur


def load_trace(trace) -> list[dict]:
    """The event list of a Chrome trace given as a dict, a list, or a path to a JSON file."""
    if isinstance(trace, (str, os.PathLike)):
        with open(trace) as fh:
            trace = json.load(fh)
    if isinstance(trace, dict):
        trace = trace.get("traceEvents", [])
    if not isinstance(trace, list):
        raise TypeError(f"expected a Chrome trace (dict with traceEvents, list, or path), got {type(trace).__name__}")
    return trace


def _num(x, default=0.0) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def classify_events(events: list[dict]) -> dict[str, list[_Ev]]:
    """Split complete (``ph == "X"``) events into kernel / memcpy / memset / launch / runtime / cpu."""
    kinds = ("kernel", "memcpy", "memset", "launch", "runtime", "cpu", "annotation")
    out: dict[str, list[_Ev]] = {k: [] for k in kinds}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        args = e.get("args") or {}
        corr = args.get("correlation")
        ev = _Ev(_num(e.get("ts")), max(0.0, _num(e.get("dur"))), name, int(corr) if corr is not None else None,
                 (e.get("pid"), e.get("tid")))
        if cat in KERNEL_CATS:
            out["kernel"].append(ev)
        elif cat in MEMCPY_CATS:
            out["memcpy"].append(ev)
        elif cat in MEMSET_CATS:
            out["memset"].append(ev)
        elif cat in RUNTIME_CATS:
            out["runtime"].append(ev)
            if name.startswith(LAUNCH_PREFIXES):
                out["launch"].append(ev)
        elif cat in CPU_CATS:
            out["cpu"].append(ev)
            if cat == "user_annotation" and name.startswith(CALL_PREFIX):
                out["annotation"].append(ev)
    for evs in out.values():
        evs.sort(key=lambda ev: (ev.start, -ev.dur))
    return out


def merge_intervals(intervals) -> list[tuple[float, float]]:
    """Union of (start, end) intervals as sorted, disjoint (start, end) pairs."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def top_level(events: list[_Ev]) -> list[_Ev]:
    """Events not nested inside an earlier event of the same thread (the outermost CPU ops)."""
    out, open_end = [], {}
    for ev in sorted(events, key=lambda ev: (ev.start, -ev.dur)):
        if ev.start >= open_end.get(ev.tid, float("-inf")):
            out.append(ev)
            open_end[ev.tid] = ev.end
    return sorted(out, key=lambda ev: ev.start)


def _windows(annotations: list[_Ev]) -> list[tuple[float, float]]:
    """Call windows [start_i, start_{i+1}) from the call annotations; the last one is open-ended."""
    starts = [a.start for a in annotations]
    return [(s, starts[i + 1] if i + 1 < len(starts) else float("inf")) for i, s in enumerate(starts)]


def _window_of(t: float, windows) -> int | None:
    for i, (s, e) in enumerate(windows):
        if s <= t < e:
            return i
    return None


def _assign_gpu(gpu: list[_Ev], launches_by_corr: dict[int, _Ev], windows) -> list[int | None]:
    """Window index of each GPU event: through its launch call (correlation id) when known, else by
    its own start time. Kernels start after their launch, possibly after the window's CPU side ends,
    so correlation is the reliable link; graph-replayed kernels all map to their one graph launch."""
    out = []
    for ev in gpu:
        launch = launches_by_corr.get(ev.corr) if ev.corr is not None else None
        out.append(_window_of(launch.start if launch is not None else ev.start, windows))
    return out


def _busy_gaps_wall(kernel_groups, cpu_groups) -> tuple[float, list[float], float]:
    """GPU-busy µs (union of kernel intervals), idle gaps (µs) and wall µs, summed over call groups."""
    busy_us, gaps, wall_us = 0.0, [], 0.0
    for kgroup, cgroup in zip(kernel_groups, cpu_groups, strict=True):
        merged = merge_intervals((k.start, k.end) for k in kgroup)
        busy_us += sum(e - s for s, e in merged)
        gaps += [b[0] - a[1] for a, b in pairwise(merged) if b[0] > a[1]]
        starts = [e.start for e in cgroup] + [s for s, _ in merged]
        ends = [e.end for e in cgroup] + [e for _, e in merged]
        if starts:
            wall_us += max(ends) - min(starts)
    return busy_us, gaps, wall_us


def _call_timeline(ev: dict, windows, idx: int, gpu_events: list[_Ev]) -> tuple[list[_Ev], list[_Ev]]:
    """The CPU lane and GPU events of call window ``idx`` only."""
    runtime, cpu = ev["runtime"], ev["cpu"]
    by_corr = {e.corr: e for e in runtime if e.corr is not None}
    g_win = _assign_gpu(gpu_events, by_corr, windows)
    gpu_events = [g for g, w in zip(gpu_events, g_win, strict=True) if w == idx]
    ann = ev["annotation"][idx]

    # Only host events inside the call's annotation: the synchronisation that profile_callable
    # runs after each call (a long cudaDeviceSynchronize) is not part of the call.
    def inside(e):
        return ann.start <= e.start <= ann.end

    if runtime:
        return [e for e in runtime if inside(e)], gpu_events
    # without runtime events the call's own annotation is the top-level "op"; show what it ran
    return top_level([e for e in cpu if inside(e) and e is not ann]), gpu_events


def analyze_trace(trace, iters: int = 1, timeline_call: int | None = None) -> ProfileReport:
    """Analyse a Chrome trace (dict, event list, or JSON path); see :class:`ProfileReport`.

    ``iters``: the number of calls the trace holds, used to average when it carries no
    ``lfm2vl_lab/call#i`` annotations (with annotations, their count wins).
    ``timeline_call``: restrict the timeline to that call window (e.g. ``-1`` = the last call);
    ``None`` keeps the whole trace.
    """
    ev = classify_events(load_trace(trace))
    kernels, memcpys, memsets = ev["kernel"], ev["memcpy"], ev["memset"]
    launches, runtime, cpu = ev["launch"], ev["runtime"], ev["cpu"]
    windows = _windows(ev["annotation"])
    n = len(windows) if windows else max(1, int(iters))

    # Per-window groups (one group = the whole trace when there are no call annotations). Wall time
    # spans CPU ops and launch calls, not other runtime calls: a trailing cudaStreamSynchronize
    # only waits for the last kernel, which the kernel end already accounts for.
    if windows:
        by_corr = {e.corr: e for e in runtime if e.corr is not None}
        k_win = _assign_gpu(kernels, by_corr, windows)
        kernel_groups = [[k for k, w in zip(kernels, k_win, strict=True) if w == i] for i in range(n)]
        cpu_groups = [[e for e in cpu + launches if _window_of(e.start, windows) == i] for i in range(n)]
    else:
        kernel_groups, cpu_groups = [kernels], [cpu + launches]
    busy_us, gaps, wall_us = _busy_gaps_wall(kernel_groups, cpu_groups)

    gpu_events = sorted(kernels + memcpys + memsets, key=lambda e: e.start)
    rep = ProfileReport(
        calls=n, kernels=len(kernels) / n, memcpys=len(memcpys) / n, memsets=len(memsets) / n,
        launch_calls=len(launches) / n, launch_cpu_ms=sum(e.dur for e in launches) / n / 1e3,
        graph_launches=sum(e.name.startswith(GRAPH_LAUNCH_PREFIXES) for e in launches) / n,
        gpu_busy_ms=busy_us / n / 1e3, kernel_sum_ms=sum(k.dur for k in kernels) / n / 1e3,
        memcpy_ms=sum(m.dur for m in memcpys) / n / 1e3, wall_ms=wall_us / n / 1e3,
        gaps=gaps, gap_count=len(gaps) / n, gap_median_us=percentile(gaps, 50), gap_p90_us=percentile(gaps, 90),
        gap_total_us=sum(gaps) / n, has_gpu=bool(gpu_events), cpu_lane="runtime" if runtime else "ops",
    )
    cpu_lane = runtime if runtime else top_level(cpu)
    if timeline_call is not None and windows:
        rep.timeline_call = range(n)[timeline_call]  # raises IndexError for a window that does not exist
        cpu_lane, gpu_events = _call_timeline(ev, windows, rep.timeline_call, gpu_events)
    rep.timeline = build_timeline(cpu_lane, gpu_events)
    return rep


def build_timeline(cpu: list[_Ev], gpu: list[_Ev]) -> dict:
    """Both lanes as (start_us, dur_us, name) tuples relative to the earliest event of either lane."""
    t0 = min([e.start for e in cpu] + [e.start for e in gpu], default=0.0)

    def lane(evs):
        return [(round(e.start - t0, 3), round(e.dur, 3), e.name) for e in sorted(evs, key=lambda e: e.start)]

    return {"cpu": lane(cpu), "gpu": lane(gpu)}


class Gap(NamedTuple):
    """One idle stretch of a timeline's GPU lane: where it starts (µs from the timeline's start), how
    long the GPU waited, and the GPU events that end (``before``) and start (``after``) it."""

    start_us: float
    dur_us: float
    before: str
    after: str


def idle_gaps(timeline: dict, kernels_only: bool = True) -> list[Gap]:
    """The idle gaps of a timeline's GPU lane (:attr:`ProfileReport.timeline`, or a recorded row's
    ``timeline``), in time order: where the GPU waited for work, and between which events.

    Overlapping events count as one busy stretch, as in ``gpu_busy_ms``. ``kernels_only`` (default)
    leaves copies and sets out, as the report's ``gap_*`` fields do, so for one call's timeline the
    gaps are the ones those fields summarise; ``kernels_only=False`` counts them as busy too. A lane
    without GPU events (the profiler on a CPU-only machine) has no gaps.
    """
    events = sorted(tuple(e) for e in timeline.get("gpu", [])
                    if not (kernels_only and e[2].startswith(COPY_NAME_PREFIXES)))
    gaps: list[Gap] = []
    busy_until, last = None, None  # end of the busy stretch so far, and the event that ends it
    for start, dur, name in events:
        if busy_until is not None and start > busy_until:
            gaps.append(Gap(round(busy_until, 3), round(start - busy_until, 3), last, name))
        if busy_until is None or start + dur > busy_until:
            busy_until, last = start + dur, name
    return gaps


def collapse(names: list[str]) -> list[list]:
    """Runs of the same name as ``[name, count]``: ``[a, a, b]`` → ``[[a, 2], [b, 1]]``."""
    out: list[list] = []
    for name in names:
        if out and out[-1][0] == name:
            out[-1][1] += 1
        else:
            out.append([name, 1])
    return out


def phase_calls(trace, prefix: str = PHASE_PREFIX) -> list[dict]:
    """Per ``record_function(prefix + phase)`` window of a Chrome trace, in time order: the CUDA
    runtime and driver API calls made inside it (``calls``: ``[name, count]`` runs, in order;
    ``counts``: per name; ``kernel_launches`` and ``graph_launches``: how many launch kernels and
    graphs; ``captured_launches``: the kernel launches between ``cudaStreamBeginCapture`` and
    ``cudaStreamEndCapture``) and the GPU kernels those calls started (``kernels``, and
    ``kernel_names`` in time order, runs collapsed; matched by correlation id: a replay's kernels all
    carry its one ``cudaGraphLaunch``'s id). Calls kineto could not name ("INVALID") are only
    counted, in ``unnamed``."""
    ev = classify_events(load_trace(trace))
    windows = sorted((e for e in ev["cpu"] if e.name.startswith(prefix)), key=lambda e: e.start)
    out = []
    for w in windows:
        calls = [e for e in ev["runtime"] if w.start <= e.start <= w.end]
        ids = {e.corr for e in calls if e.corr is not None}
        names = [e.name for e in calls if e.name != UNNAMED]
        begin = next((i for i, n in enumerate(names) if n.startswith(GRAPH_APIS[0])), len(names))
        end = next((i for i, n in enumerate(names) if n.startswith(GRAPH_APIS[1])), len(names))
        kernels = sorted((k for k in ev["kernel"] if k.corr in ids), key=lambda k: k.start)
        out.append({"phase": w.name[len(prefix):], "calls": collapse(names),
                    "counts": {n: names.count(n) for n in dict.fromkeys(names)}, "unnamed": len(calls) - len(names),
                    "kernel_launches": sum(n.startswith(KERNEL_LAUNCH_PREFIXES) for n in names),
                    "graph_launches": sum(n.startswith(GRAPH_LAUNCH_PREFIXES) for n in names),
                    "captured_launches": sum(n.startswith(KERNEL_LAUNCH_PREFIXES) for n in names[begin:end]),
                    "kernels": len(kernels), "kernel_names": collapse([k.name for k in kernels])})
    return out
