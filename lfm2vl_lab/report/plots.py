"""Figures of the encoder's files (``bench``, the sweeps, the attention probe), and what every figure
module shares: colours per mode, page widths, titles, :class:`NoData`. A figure takes one run's
rows and returns a ``Figure`` built without ``pyplot`` (no GUI backend, no global state)."""

from __future__ import annotations

import textwrap
from collections import Counter
from itertools import groupby

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..measure.floor import busy_over_wall as busy_exceeds_wall  # the one rule, under the plots' name
from ..measure.workloads import NXS
from .frames import is_default_config, one_per, pick_rows, workloads_of

MODE_ORDER = ("hf-eager", "compile", "compile-max", "lab-eager", "lab-graph", "lab-graph-fused")
MODE_COLORS = {"hf-eager": "#7f7f7f", "compile": "#9467bd", "compile-max": "#e377c2", "lab-eager": "#1f77b4",
               "lab-graph": "#2ca02c", "lab-graph-fused": "#d62728"}
MAX_WIDTH_IN = 12.0  # figures fit a page: at most this wide (inches; 1440 px at the report's 120 dpi)


class NoData(ValueError):
    """A figure has no data to draw (``report`` skips it and prints the reason)."""


def mode_key(mode: str) -> tuple:
    """Sort key of a mode: :data:`MODE_ORDER`, unknown modes last by name."""
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def count_nxs_workloads(rows: list[dict]) -> int:
    """How many distinct ``NxS`` workloads (N images of S px) the rows have: the speedup figure
    draws a line over them, so it needs at least two."""
    return len({r["workload"] for r in rows if NXS.fullmatch(str(r.get("workload")))})


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


BUSY_OVER_WALL = "busy > wall: the profiled call ran slower than the timed median"


def latency_figure(rows: list[dict], title: str | None = None, log: bool = False) -> Figure:
    """Median latency (ms) per mode, bars grouped by workload; the whisker reaches p90. ``rows``:
    one run's (:func:`~lfm2vl_lab.report.frames.pick_rows` chooses one per mode and workload)."""
    rows = pick_rows(rows)
    if not rows:
        raise NoData("latency_figure: no rows with median_ms")
    workloads, modes = workloads_of(rows), modes_of(rows)
    by = {(r["mode"], r["workload"]): r for r in rows}
    fig = Figure(figsize=(page_width(1.5 * len(workloads) + 2), 4.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(modes)
    crowded = len(modes) * len(workloads) > 16  # upright labels would overlap: turn them
    for i, mode in enumerate(modes):
        mine = [(j + (i - (len(modes) - 1) / 2) * width, r) for j, w in enumerate(workloads)
                if (r := by.get((mode, w)))]
        errs = [max(0.0, (r.get("p90_ms") or r["median_ms"]) - r["median_ms"]) for _, r in mine]
        bars = ax.bar([x for x, _ in mine], [r["median_ms"] for _, r in mine], width, yerr=[[0] * len(errs), errs],
                      label=mode, color=MODE_COLORS.get(mode), capsize=2)
        ax.bar_label(bars, fmt="%.2f", fontsize=6 if crowded else 7, padding=2, rotation=90 if crowded else 0)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("median latency per call (ms)")
    ax.set_xlabel("workload (images per call × side in px; tiled: one tiled image; stream: mixed requests)")
    if log:
        ax.set_yscale("log")
    ax.margins(y=0.12)  # room for the labels
    ax.legend(fontsize=8, ncols=min(len(modes), 5), title="mode (whisker: p90)", title_fontsize=8)
    set_title(fig, title or "Encoder latency per mode (whisker: p90)")
    return fig


def _nxs(workload: str) -> tuple[int, int]:
    n, s = NXS.fullmatch(workload).groups()
    return int(n), int(s)


def speedup_figure(rows: list[dict], side: int | None = None, title: str | None = None) -> Figure:
    """Speedup over hf-eager against the number of images, for the ``NxS`` workloads of one side
    ``S`` (default: the side with the most image counts). ``rows``: one run's."""
    rows = [r for r in pick_rows(rows) if r.get("speedup_vs_hf") and NXS.fullmatch(str(r.get("workload")))]
    if side is None:
        sides = Counter(s for _, s in dict.fromkeys(_nxs(r["workload"]) for r in rows))  # image counts per side
        if not sides:
            raise NoData("speedup_figure: no NxS rows with speedup_vs_hf")
        side = max(sides, key=sides.get)
    rows = [r for r in rows if _nxs(r["workload"])[1] == side and r["mode"] != "hf-eager"]
    if not rows:
        raise NoData(f"speedup_figure: no rows for {side} px images")
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for mode in modes_of(rows):
        pts = sorted((_nxs(r["workload"])[0], r["speedup_vs_hf"]) for r in rows if r["mode"] == mode)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode, color=MODE_COLORS.get(mode))
    ax.axhline(1.0, color=MODE_COLORS["hf-eager"], ls="--", lw=1, label="hf-eager (1×)")
    ax.set_xscale("log", base=2)
    ns = sorted({_nxs(r["workload"])[0] for r in rows})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel(f"images per call ({side}×{side} px)")
    ax.set_ylabel("speedup over hf-eager (×, median over median)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    set_title(fig, title or "Speedup over transformers' eager path vs batch size")
    return fig


def _floor_bars(ax, rows: list[dict]) -> bool:
    """The floor-share bars; returns whether any row was drawn as busy > wall."""
    over = {id(r) for r in busy_exceeds_wall(rows)}
    for i, r in enumerate(rows):
        color, med = MODE_COLORS.get(r["mode"], "C0"), r["median_ms"]
        if id(r) in over:  # the whole median is "busy", and the note says why that is not 100%
            ax.barh(i, med, color=color, hatch="////", edgecolor="black", lw=0.5)
            ax.text(med, i, f" busy {r['gpu_busy_ms']:.2f} ms > median {med:.2f} ms (profiled call slower)",
                    va="center", fontsize=7, color="#b00000")
            continue
        busy = r["gpu_busy_ms"]
        ax.barh(i, busy, color=color)
        ax.barh(i, med - busy, left=busy, color="#dddddd")
        ax.text(med, i, f" {100 * busy / med:.0f}% busy", va="center", fontsize=7)
    return bool(over)


def floor_share_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Each median split into the GPU-busy floor and the rest (host overhead, gaps, syncs), labelled
    busy / median. A row busy longer than its median (the profile is a separate call) is hatched and
    labelled with both numbers, never drawn as "100% busy"."""
    rows = [r for r in pick_rows(rows) if r.get("gpu_busy_ms")]
    if not rows:
        raise NoData("floor_share_figure: no rows with gpu_busy_ms (run bench with --profile on a GPU)")
    order = workloads_of(rows)
    rows.sort(key=lambda r: (order.index(r["workload"]), mode_key(r["mode"])))
    fig = Figure(figsize=(8, 0.27 * len(rows) + 2.3), layout="constrained")
    ax = fig.add_subplot()
    flagged = _floor_bars(ax, rows)
    ax.set_yticks(range(len(rows)), [f"{r['workload']}  {r['mode']}" for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first workload on top
    ax.set_xlim(0, (1.6 if flagged else 1.18) * max(r["median_ms"] for r in rows))  # room for the labels
    ax.set_xlabel("ms per call (median of the timed calls)")
    handles = [Patch(color=MODE_COLORS.get(m, "C0"), label=f"{m}: GPU busy (the floor)") for m in modes_of(rows)]
    handles.append(Patch(color="#dddddd", label="rest: host overhead, launch gaps, syncs"))
    if flagged:
        handles.append(Patch(facecolor="white", hatch="////", edgecolor="black", label=BUSY_OVER_WALL))
    for i in range(1, len(rows)):  # a thin line between workloads
        if rows[i]["workload"] != rows[i - 1]["workload"]:
            ax.axhline(i - 0.5, color="#bbbbbb", lw=0.6)
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=3)
    set_title(fig, title or "Share of each call spent at the GPU-busy floor")
    return fig


TIMELINE_COLORS = {"launch": "#ff7f0e", "other": "#999999", "gpu": "#2ca02c"}
TIMELINE_LABELS = {"launch": "CPU: kernel / graph launch calls",
                   "other": "CPU: other CUDA calls (copies, syncs, queries) or CPU operators",
                   "gpu": "GPU: kernels and copies"}


def _timeline_lanes(ax, tl: dict, seen: set) -> float:
    """Draw one timeline's two lanes; returns where its last event ends (µs)."""
    from ..measure.profiling import LAUNCH_PREFIXES

    end = 0.0
    for lane, y in (("cpu", 1), ("gpu", 0)):
        events = tl.get(lane, [])
        spans = [(float(s), max(float(d), 0.05)) for s, d, *_ in events]
        kinds = ["gpu"] * len(events) if lane == "gpu" else [
            "launch" if str(e[2] if len(e) > 2 else "").startswith(LAUNCH_PREFIXES) else "other" for e in events]
        ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=[TIMELINE_COLORS[k] for k in kinds], lw=0)
        seen.update(kinds)
        end = max([end] + [s + d for s, d in spans])
    return end


def timeline_figure(timelines: dict, title: str | None = None, max_us: float | None = None) -> Figure:
    """One panel per timeline (``{"cpu": [(start_us, dur_us, name)], "gpu": [...]}``): CPU launch calls
    above GPU kernels on a shared µs axis, so the panels compare directly."""
    if not timelines:
        raise NoData("timeline_figure: no timelines")
    fig = Figure(figsize=(10, 1.5 * len(timelines) + 1.2), layout="constrained")
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False)[:, 0]
    end, seen = 0.0, set()
    for ax, (label, tl) in zip(axes, timelines.items(), strict=True):
        end = max(end, _timeline_lanes(ax, tl, seen))
        n_cpu, n_gpu = len(tl.get("cpu", [])), len(tl.get("gpu", []))
        ax.set_yticks([0, 1], [f"GPU ({n_gpu})", f"CPU ({n_cpu})"], fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1].set_xlim(0, max_us or end * 1.02 or 1)
    axes[-1].set_xlabel("µs from the first event of the call (in brackets: events per lane)")
    handles = [Patch(color=TIMELINE_COLORS[k], label=TIMELINE_LABELS[k]) for k in TIMELINE_COLORS if k in seen]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    set_title(fig, title or "One call: CPU launch calls vs GPU kernels")
    return fig


def _padding_rows(rows: list[dict]) -> list[dict]:
    """Graph rows with padding waste, one per (mode, workload, budget set): the default configuration's
    apart from the budget set, where one run holds several."""
    rows = [r for r in rows if r.get("padding_waste") is not None and r.get("budget_set") is not None]
    return one_per(rows, lambda r: (r["mode"], r["workload"], r["budget_set"]), "padding_waste_figure",
                   rank=lambda r: is_default_config(r, ignore=("budget_set",)))


def padding_waste_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Padding waste of graph replays with each bar's hit rate: one group per budget set (the ``stream``
    only, what budgets are chosen for) where the rows hold several, else one per workload."""
    rows = _padding_rows(rows)
    if not rows:
        raise NoData("padding_waste_figure: no graph rows with padding_waste")
    sets = list(dict.fromkeys(r["budget_set"] for r in rows))
    if len(sets) > 1 and any(r["workload"] == "stream" for r in rows):
        rows = [r for r in rows if r["workload"] == "stream"]
    per_set = len(sets) > 1
    group, other = ("budget_set", "workload") if per_set else ("workload", "budget_set")
    groups = sets if per_set else workloads_of(rows)
    series = list(dict.fromkeys((r["mode"], r[other]) for r in rows))
    fig = Figure(figsize=(page_width(1.1 * len(groups) + 2.5, least=7), 4.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (mode, value) in enumerate(series):
        mine = [r for r in rows if (r["mode"], r[other]) == (mode, value)]
        xs = [groups.index(r[group]) + (i - (len(series) - 1) / 2) * width for r in mine]
        label = f"{mode} · {value}" if per_set else f"{mode}, budget set {value}"
        bars = ax.bar(xs, [100 * r["padding_waste"] for r in mine], width, label=label)
        if len(series) <= 3:  # more labels than that overlap
            notes = [f"{100 * r['padding_waste']:.1f}%" + (f", hit {100 * r['hit_rate']:.0f}%"
                                                           if r.get("hit_rate") is not None else "") for r in mine]
            ax.bar_label(bars, labels=notes, fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_xlabel("budget set (output tokens per graph)" if per_set else "workload")
    ax.set_ylabel("padding waste (% of real tokens)")
    ax.margins(y=0.12)
    ax.legend(fontsize=8, title="hit: share of calls served by a graph", title_fontsize=7)
    set_title(fig, title or "Padding waste per budget set")
    return fig


def _memory_totals(groups: dict) -> str:
    """One line per group: what all its budgets hold together (what ``graph_memory(rows)`` reports)."""
    lines = []
    for label, rows in groups.items():
        pool, buffers = sum(r["pool_mb"] for r in rows), sum(r["buffers_mb"] for r in rows)
        lines.append(f"{label}: all budgets together {pool + buffers:.0f} MiB "
                     f"(graph pool {pool:.0f} + buffers {buffers:.0f})")
    return "\n".join(lines)


def graph_memory_figure(capture_info, title: str | None = None) -> Figure:
    """Each budget's graph memory (MiB, stacked: its growth of the shared pool, then its buffers) and
    capture time; ``capture_info``: a list, or ``{label: rows}``. Rows of the old format (no pool and
    buffer split) are refused, not drawn."""
    groups = capture_info if isinstance(capture_info, dict) else {"graphs": capture_info}
    groups = {k: v for k, v in groups.items() if v and all("pool_mb" in r for r in v)}
    if not groups:
        raise NoData("graph_memory_figure: no capture_info rows with pool_mb/buffers_mb")
    budgets = sorted({int(r["budget"]) for rows in groups.values() for r in rows})
    fig = Figure(figsize=(page_width(0.9 * len(budgets) * len(groups) + 3), 4.6), layout="constrained")
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    width = 0.8 / len(groups)
    for i, (label, rows) in enumerate(groups.items()):
        by = {int(r["budget"]): r for r in rows}
        xs = [budgets.index(b) + (i - (len(groups) - 1) / 2) * width for b in by]
        pool = [r["pool_mb"] for r in by.values()]
        ax.bar(xs, pool, width, label=f"{label}: graph pool (growth)", alpha=0.85)
        top = ax.bar(xs, [r["buffers_mb"] for r in by.values()], width, bottom=pool, label=f"{label}: buffers",
                     alpha=0.6)
        ax.bar_label(top, labels=[f"{r['pool_mb'] + r['buffers_mb']:.0f}" for r in by.values()], fontsize=7, padding=1)
        ax2.plot(xs, [r.get("capture_s", 0) for r in by.values()], "kx", ms=6,
                 label="capture time (right axis)" if i == 0 else None)
    ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
    ax.set_xlabel("budget (output tokens), captured largest first: smaller ones reuse the pool's blocks")
    ax.set_ylabel("memory held (MiB; on each bar: pool + buffers)")
    ax.margins(y=0.1)
    ax2.set_ylabel("capture time (s, × markers)")
    ax2.set_ylim(bottom=0)
    ax.set_title(_memory_totals(groups), fontsize=8, loc="left")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=9, loc="upper left")
    set_title(fig, title or "Graph memory and capture time per budget")
    return fig


def layout_label(layout) -> str:
    """A packed layout in short: ``[1024, 1024, 576, 64]`` → ``"2×1024+576+64"``; 16 × 256 → ``"16×256"``."""
    return "+".join(f"{len(run)}×{n}" if len(run) > 1 else str(n)
                    for n, run in ((n, list(g)) for n, g in groupby(layout)))


def _attention_panel(ax, rows: list[dict], backends: list[str]) -> None:
    """One preset's bars: one group per layout, one bar per backend (µs per layer, log axis)."""
    layouts = list(dict.fromkeys(tuple(r["layout"]) for r in rows))
    by = {(tuple(r["layout"]), r["backend"]): r for r in rows}
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        pts = [(j + (i - (len(backends) - 1) / 2) * width, 1000 * by[lay, b]["graph_ms_per_layer"])
               for j, lay in enumerate(layouts) if (lay, b) in by]
        bars = ax.bar([x for x, _ in pts], [y for _, y in pts], width, label=b, color=f"C{i}")
        ax.bar_label(bars, fmt="%.0f", fontsize=6, padding=1)
    ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.set_xticks(range(len(layouts)), [layout_label(lay) for lay in layouts], fontsize=8)
    ax.set_ylabel("µs per layer (log)")


def attention_figure(rows: list[dict], title: str | None = None, log: bool = True) -> Figure:
    """Attention µs per layer inside a CUDA graph per backend and layout, one panel per preset, on a
    log axis (one slow backend is tens of times the others); backends that never timed are named."""
    timed = [r for r in rows if r.get("graph_ms_per_layer") is not None]
    if not timed:
        raise NoData("attention_figure: no attention-probe rows (python -m lfm2vl_lab attention on a GPU)")
    timed = one_per(timed, lambda r: (r["preset"], tuple(r["layout"]), r["backend"]), "attention_figure")
    presets = list(dict.fromkeys(r["preset"] for r in timed))
    backends = list(dict.fromkeys(r["backend"] for r in timed))
    most = max(len({tuple(r["layout"]) for r in timed if r["preset"] == p}) for p in presets)
    fig = Figure(figsize=(page_width(1.5 * most + 2.5), 2.9 * len(presets) + 1.1), layout="constrained")
    axes = fig.subplots(len(presets), 1, squeeze=False)[:, 0]
    for ax, p in zip(axes, presets, strict=True):
        _attention_panel(ax, [r for r in timed if r["preset"] == p], backends)
        ax.set_title(p, fontsize=9, loc="left")
        if not log:
            ax.set_yscale("linear")
    axes[-1].set_xlabel("packed layout (rows per item; N×S: N items of S rows)")
    untimed = sorted({r.get("backend") for r in rows if r.get("graph_ms_per_layer") is None} - set(backends) - {None})
    note = f" · no time (failed on every layout): {', '.join(untimed)}" if untimed else ""
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(backends), fontsize=8,
               title=f"backend (timed inside a CUDA graph){note}", title_fontsize=8)
    set_title(fig, title or "Capturable attention kernels, timed inside CUDA graphs")
    return fig
