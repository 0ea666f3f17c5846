"""The measuring instrument: timing, profiling, workloads and modes, the benchmark, the correctness check,
end-to-end TTFT and whole requests, the text engine's peers, vLLM driven from outside, results with
provenance, and the reference run (``record``). It runs the technique; nothing in the technique imports it.

The names below are the helpers a learner calls (``from lfm2vl_lab.measure import time_calls, idle_gaps``);
every module is reachable the same way (``from lfm2vl_lab.measure import bench``). Each loads on first
use: ``import lfm2vl_lab.measure`` imports no torch and none of its modules.
"""

import importlib
import pkgutil
from typing import TYPE_CHECKING

# The public names, by module (where each is defined). The same names under TYPE_CHECKING below are
# what type checkers and editors read; tests/test_public_api.py keeps the two lists equal.
API = {
    "capture_breaks": ("EMPTY_GRAPH", "meta_errors", "meta_outcome", "to_meta"),
    "engine_measure": ("summary_lines",),
    "meter": ("graph_memory", "measured_capture"),
    "profiling": ("compute_ops", "profile_callable"),
    "results": ("recorded_tag",),
    "timing": ("percentile", "time_calls", "time_paired"),
    "trace_analysis": ("COPY_NAME_PREFIXES", "GRAPH_LAUNCH_PREFIXES", "Gap", "LAUNCH_PREFIXES", "analyze_trace",
                       "idle_gaps"),
    "workloads": ("load_sample_images", "random_processor_output", "stream_requests", "synthetic_image",
                  "synthetic_workload"),
}
API_NAMES = {name: module for module, names in API.items() for name in names}
# this package's modules, read off its folder (importing none of them)
MODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))

if TYPE_CHECKING:
    from .capture_breaks import EMPTY_GRAPH, meta_errors, meta_outcome, to_meta
    from .engine_measure import summary_lines
    from .meter import graph_memory, measured_capture
    from .profiling import compute_ops, profile_callable
    from .results import recorded_tag
    from .timing import percentile, time_calls, time_paired
    from .trace_analysis import (
        COPY_NAME_PREFIXES,
        GRAPH_LAUNCH_PREFIXES,
        LAUNCH_PREFIXES,
        Gap,
        analyze_trace,
        idle_gaps,
    )
    from .workloads import (
        load_sample_images,
        random_processor_output,
        stream_requests,
        synthetic_image,
        synthetic_workload,
    )

__all__ = [
    "analyze_trace", "compute_ops", "COPY_NAME_PREFIXES", "EMPTY_GRAPH", "Gap", "GRAPH_LAUNCH_PREFIXES",
    "graph_memory", "idle_gaps", "LAUNCH_PREFIXES", "load_sample_images", "measured_capture", "meta_errors",
    "meta_outcome", "percentile", "profile_callable", "random_processor_output", "recorded_tag", "stream_requests",
    "summary_lines", "synthetic_image", "synthetic_workload", "time_calls", "time_paired", "to_meta",
]


def __getattr__(name: str):
    """``lfm2vl_lab.measure.idle_gaps`` loads ``lfm2vl_lab.measure.trace_analysis`` (:data:`API`);
    ``lfm2vl_lab.measure.bench`` loads that module."""
    if name in API_NAMES:
        value = getattr(importlib.import_module(f".{API_NAMES[name]}", __name__), name)
        globals()[name] = value  # the next lookup finds it without this function
        return value
    if name in MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API_NAMES, *MODULES})
