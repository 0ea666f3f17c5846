"""What the recorded files say: the reference set and its frames, the pages' generated parts, the
figures and the notebooks' helpers. Public names load lazily (``import lfm2vl_lab.report`` imports no
pandas, matplotlib or torch); every module is reachable the same way."""

import importlib
import pkgutil

# The public names, by the module that defines each: the one list of them (``__all__`` is read off it).
API = {
    "notebook": ("live_or_recorded", "load_first_version", "load_recorded", "setup", "show"),
    "frames": ("is_default_config",),
    "plots": ("MODE_ORDER", "NoData", "latency_figure", "timeline_figure"),
    "plots_ttft": ("TTFT_MODES", "ttft_breakdown_figure", "ttft_case", "ttft_grid_figure"),
    "plots_roofline": ("roofline_figure",),
    "vllm_report": ("vllm_breakdown_figure",),
}
API_NAMES = {name: module for module, names in API.items() for name in names}
__all__ = sorted(API_NAMES)
# this package's modules, read off its folder (importing none of them)
MODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))


def __getattr__(name: str):
    """``lfm2vl_lab.report.load_recorded`` loads ``lfm2vl_lab.report.notebook`` (:data:`API`);
    ``lfm2vl_lab.report.ttft_summary`` loads that module."""
    if name in API_NAMES:
        value = getattr(importlib.import_module(f".{API_NAMES[name]}", __name__), name)
        globals()[name] = value  # the next lookup finds it without this function
        return value
    if name in MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API_NAMES, *MODULES})
