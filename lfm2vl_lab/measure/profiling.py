"""Profile any callable with torch.profiler and read the trace: kernels, launches, GPU-busy, gaps.

A CUDA graph pays off by removing host work between kernels: fewer launch API calls, shorter CPU
time in them, smaller idle gaps on the GPU. :func:`profile_callable` measures exactly that, from
the Chrome trace (the JSON that ``torch.profiler`` exports and Perfetto / chrome://tracing open)
read by :mod:`.trace_analysis`, whose names are importable from here too:

>>> rep = profile_callable(lambda: enc.encode(inputs), trace_path="out/eager.json")
>>> rep.kernels, rep.launch_calls, rep.gpu_busy_ms, rep.wall_ms, rep.gap_median_us

``profile_callable`` wraps each profiled call in ``record_function("lfm2vl_lab/call#i")``, so
``analyze_trace`` measures each call in its own window.

CPU-only machines: the profiler records no kernel and no runtime events there. The report stays
valid: ``kernels = 0``, ``launch_calls = 0``, ``gpu_busy_ms = 0``, no gaps, ``wall_ms`` measured
from the CPU events (annotations and top-level ``cpu_op`` events), and the timeline's CPU lane
shows top-level CPU operators instead of launch calls (``cpu_lane == "ops"``).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

from .profiler_log import quiet_profile
from .timing import percentile
from .trace_analysis import (
    CALL_PREFIX,
    COPY_NAME_PREFIXES,
    GRAPH_LAUNCH_PREFIXES,
    LAUNCH_PREFIXES,
    Gap,
    ProfileReport,
    analyze_trace,
    build_timeline,
    classify_events,
    idle_gaps,
    load_trace,
    merge_intervals,
    top_level,
)

__all__ = [
    "CALL_PREFIX", "COPY_NAME_PREFIXES", "GRAPH_LAUNCH_PREFIXES", "LAUNCH_PREFIXES", "Gap", "ProfileReport",
    "analyze_trace", "build_timeline", "classify_events", "hta_launch_stats", "idle_gaps", "load_trace",
    "merge_intervals", "percentile", "profile_callable", "top_level", "VIEW_OPS", "compute_ops",
]

# Top-level CPU operators that only make a new view of a tensor (shape, strides, offset): no arithmetic,
# so on a GPU they launch no kernel. ``aten::reshape`` copies only when a view is impossible.
VIEW_OPS = frozenset({
    "aten::view", "aten::reshape", "aten::transpose", "aten::permute", "aten::select", "aten::slice",
    "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::alias", "aten::unbind", "aten::t",
    "aten::as_strided", "aten::flatten", "aten::unflatten", "aten::narrow", "aten::split", "aten::chunk",
    "aten::detach", "aten::view_as", "aten::expand_as",
})

# --------------------------------------------------------------------------------------------
# Profiling a callable
# --------------------------------------------------------------------------------------------


def _resolve_device(device):
    import torch

    from .workloads import default_device

    return default_device() if device is None else torch.device(device)


def profile_callable(fn, warmup: int = 3, iters: int = 5, trace_path=None, device=None,
                     timeline_call: int | None = -1) -> ProfileReport:
    """Warm ``fn`` up, profile ``iters`` calls, export a Chrome trace and analyse it.

    Each call runs inside ``record_function("lfm2vl_lab/call#i")`` and is followed by a device
    synchronisation *outside* that annotation, so calls do not overlap and the per-call numbers
    are latencies. CUDA activity is recorded when ``device`` (default: CUDA if available) is a
    CUDA device. ``trace_path`` keeps the trace (open it in https://ui.perfetto.dev); otherwise
    it goes to a temporary file that is deleted afterwards. The timeline covers the last call by
    default (``timeline_call=-1``): the steady state, after the warm-up.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    dev = _resolve_device(device)
    cuda = dev.type == "cuda" and torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with warnings.catch_warnings():
        # One profiling cycle per call here, so torch's "clears events at the end of each cycle"
        # notice (printed from the second profiler of a process on) says nothing useful.
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        # the profiler's start and stop without Kineto's C++ log lines on fd 2 (profiler_log says which)
        with quiet_profile(profile(activities=activities)) as prof:
            for i in range(iters):
                with record_function(f"{CALL_PREFIX}{i}"):
                    fn()
                sync()
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        rep = analyze_trace(path, iters=iters, timeline_call=timeline_call)
        rep.trace_path = str(path)
        return rep
    fd, tmp = tempfile.mkstemp(suffix=".pt.trace.json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        return analyze_trace(tmp, iters=iters, timeline_call=timeline_call)
    finally:
        os.unlink(tmp)


def compute_ops(report: ProfileReport) -> dict[str, int]:
    """The top-level CPU operators of a CPU-only profile's timeline call that do arithmetic (not
    :data:`VIEW_OPS`), counted by name: on a machine without a GPU, what stands in for the kernels
    (each of them, ``aten::linear`` or ``aten::layer_norm``, is what a GPU would launch a kernel for).
    Raises ``ValueError`` on a profile whose CPU lane holds CUDA API calls instead of operators."""
    if report.cpu_lane != "ops":
        raise ValueError(f"compute_ops needs a CPU-only profile (cpu_lane 'ops'), got cpu_lane {report.cpu_lane!r}: "
                         "on a GPU count report.kernels instead")
    counts: dict[str, int] = {}
    for _, _, name in report.timeline.get("cpu", []):
        if name not in VIEW_OPS:
            counts[name] = counts.get(name, 0) + 1
    return counts


# --------------------------------------------------------------------------------------------
# Optional cross-check with HolisticTraceAnalysis
# --------------------------------------------------------------------------------------------


def hta_launch_stats(trace_dir, runtime_cutoff: int = 50, launch_delay_cutoff: int = 100) -> dict:
    """Launch statistics of the traces in ``trace_dir`` computed by HolisticTraceAnalysis (HTA).

    A cross-check of :func:`analyze_trace` by an independent implementation. Returns
    ``{rank: {"launches", "median_cpu_us", "median_gpu_us", "median_launch_delay_us", "frame"}}``
    where ``frame`` is HTA's DataFrame (one row per correlation id). HTA is optional:
    ``pip install HolisticTraceAnalysis``. Note that HTA matches launches to kernels by
    correlation id, so for a graph replay it sees one launch for many kernels.

    The two count launches differently: HTA counts ``cudaLaunchKernel`` and ``cudaMemcpyAsync``
    calls but not the ``cuLaunchKernelEx`` driver-API launches that cuBLAS uses for its GEMMs,
    which ``analyze_trace`` counts too (``LAUNCH_PREFIXES``); so expect HTA's number to be lower.
    """
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:  # not a dependency of this package on purpose
        raise ImportError(
            "hta_launch_stats needs HolisticTraceAnalysis, which lfm2vl_lab does not install: "
            "pip install HolisticTraceAnalysis (then pass a folder of torch.profiler traces)"
        ) from exc
    analyzer = TraceAnalysis(trace_dir=str(trace_dir))
    frames = analyzer.get_cuda_kernel_launch_stats(
        runtime_cutoff=runtime_cutoff, launch_delay_cutoff=launch_delay_cutoff, visualize=False
    )
    out = {}
    for rank, df in frames.items():
        def med(col, df=df):
            return float(df[col].median()) if col in df and len(df) else float("nan")

        out[rank] = {
            "launches": int(len(df)), "median_cpu_us": med("cpu_duration"), "median_gpu_us": med("gpu_duration"),
            "median_launch_delay_us": med("launch_delay"), "frame": df,
        }
    return out
