"""What the figure modules share: colours per mode, which row of a run a figure draws, and the checks
that keep a figure to one run.

A figure draws the rows of ONE result file (one run). :func:`pick_rows` chooses, within that file,
one row per (mode, workload): the default configuration's where the file holds several
configurations. Rows of two runs for the same (mode, workload) cannot be told apart by their fields,
so two candidates of equal standing are refused (:class:`MixedRuns`) rather than silently picked.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable

from matplotlib.figure import Figure

from ..measure.floor import busy_over_wall as busy_exceeds_wall  # noqa: F401  (the one rule, under the plots' name)
from ..measure.modes import row_labels
from ..measure.workloads import NXS

MODE_ORDER = ("hf-eager", "compile", "compile-max", "lab-eager", "lab-graph", "lab-graph-fused")
MODE_COLORS = {"hf-eager": "#7f7f7f", "compile": "#9467bd", "compile-max": "#e377c2", "lab-eager": "#1f77b4",
               "lab-graph": "#2ca02c", "lab-graph-fused": "#d62728"}
_DEFAULT_ROW = row_labels("lab-graph")  # how a row of the default settings names them
# preferred (budget_set, cu_rule, max_seqlen_mode) in figures: the defaults'
DEFAULT_GRAPH_CONFIG = tuple(_DEFAULT_ROW[k] for k in ("budget_set", "cu_rule", "max_seqlen_mode"))
DEFAULT_LAB_OPTIONS = (None, "auto", "varlen")  # attention backends that count as the default
# The kit's kernel options and their defaults; a row without the key ran before the option existed (off)
KERNEL_OPTIONS = {k: _DEFAULT_ROW[k] for k in ("fuse_qkv", "fuse_elementwise", "dense_graphs")}
MAX_WIDTH_IN = 12.0  # figures fit a page: at most this wide (inches; 1440 px at the report's 120 dpi)


class NoData(ValueError):
    """A figure has no data to draw (``report`` skips it and prints the reason)."""


class MixedRuns(ValueError):
    """The rows handed to a figure hold two candidates for one bar or point: rows of more than one
    run, which a figure must not mix (draw one result file's rows)."""


def mode_key(mode: str) -> tuple:
    """Sort key of a mode: :data:`MODE_ORDER`, unknown modes last by name."""
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _config(r: dict) -> tuple:
    return (r.get("budget_set"), r.get("cu_rule"), r.get("max_seqlen_mode"))


def is_default_config(row: dict, ignore=()) -> bool:
    """Whether a result row ran the kit's default configuration: for graph rows the automatic
    budgets, the safe ``cu_seqlens`` rule and tight ``max_seqlen`` (``DEFAULT_GRAPH_CONFIG``); a
    default attention backend (``DEFAULT_LAB_OPTIONS``); and, for the lab modes, each of
    ``KERNEL_OPTIONS`` at its default (``dense_graphs`` for ``lab-graph`` only). ``ignore`` names
    kernel options not to compare (for files recorded before and after a default changed); it may
    also name ``"budget_set"`` (any budget set counts)."""
    budgets_ok = "budget_set" in ignore or row.get("budget_set") in (None, DEFAULT_GRAPH_CONFIG[0])
    graph_ok = row.get("budget_set") is None or (budgets_ok and _config(row)[1:] == DEFAULT_GRAPH_CONFIG[1:])
    lab = row.get("mode") in ("lab-eager", "lab-graph", "lab-graph-fused")
    opts_ok = not lab or all(bool(row.get(k, False)) == v for k, v in KERNEL_OPTIONS.items()
                             if k not in ignore and (k != "dense_graphs" or row.get("mode") == "lab-graph"))
    return graph_ok and opts_ok and row.get("attention") in DEFAULT_LAB_OPTIONS


def one_per(rows: Iterable[dict], key: Callable[[dict], tuple], what: str, rank=None) -> list[dict]:
    """One row per ``key(row)``, in first-seen order: the row of highest ``rank(row)`` (default: all
    equal). Two rows of the same key and the same, highest, rank raise :class:`MixedRuns` naming the
    key: within one run the rank tells its rows apart, so a tie means rows of several runs."""
    best: dict = {}
    tied: set = set()
    for r in rows:
        k, score = key(r), rank(r) if rank else ()
        cur = best.get(k)
        if cur is None or score > cur[0]:
            best[k] = (score, r)
            tied.discard(k)
        elif score == cur[0]:
            tied.add(k)
    if tied:
        raise MixedRuns(f"{what}: several rows of equal standing for {sorted(tied, key=str)[0]}: rows of more "
                        "than one run, or several configurations and none the default? draw one run's rows")
    return [r for _, r in best.values()]


def _pick_rank(r: dict) -> tuple:
    # the default configuration; else the default graph settings (rows recorded before a kernel option
    # existed carry none of them); then a profiled row
    return (is_default_config(r), is_default_config(r, ignore=tuple(KERNEL_OPTIONS)), r.get("gpu_busy_ms") is not None)


def pick_rows(rows: list[dict]) -> list[dict]:
    """One row per (mode, workload) of one run's rows: the default configuration's
    (:func:`is_default_config`) where the run holds several configurations, else the one with the
    default graph settings (budgets, ``cu_seqlens`` rule, ``max_seqlen``), and of those a profiled
    row (it has the GPU-busy floor and a timeline). Rows without ``median_ms`` are left out.

    Raises :class:`MixedRuns` where two rows of equal standing share a (mode, workload), e.g. the
    default rows of two files: a figure draws one run, never a pick across runs."""
    return one_per((r for r in rows if r.get("median_ms") is not None), lambda r: (r.get("mode"), r.get("workload")),
                   "pick_rows", rank=_pick_rank)


def count_nxs_workloads(rows: list[dict]) -> int:
    """How many distinct ``NxS`` workloads (N images of S px) the rows have: the speedup figure
    draws a line over them, so it needs at least two."""
    return len({r["workload"] for r in rows if NXS.fullmatch(str(r.get("workload")))})


def workloads_of(rows) -> list[str]:
    """The rows' workloads in first-seen order."""
    return list(dict.fromkeys(r["workload"] for r in rows))


def modes_of(rows) -> list[str]:
    """The rows' modes in :data:`MODE_ORDER`."""
    return sorted({r["mode"] for r in rows}, key=mode_key)


def page_width(wanted: float, least: float = 6.0) -> float:
    """A figure width (inches) between ``least`` and :data:`MAX_WIDTH_IN`."""
    return min(MAX_WIDTH_IN, max(least, wanted))


def set_title(fig: Figure, title: str | None) -> None:
    """The figure's title (it names the run: file and date, where the caller knows them), each line
    wrapped to the figure's width so that none is cut off."""
    if title:
        chars = int(12 * fig.get_figwidth())  # what fits at 10 pt
        fig.suptitle("\n".join(textwrap.fill(line, chars) for line in title.splitlines()), fontsize=10)
