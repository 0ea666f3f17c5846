"""Figures of the encoder's files (``bench``, the sweeps, the attention probe), and what every figure
module shares: colours per mode, :func:`figure` (page width, title), :func:`bars` and :func:`lines`,
which draw a wide DataFrame (a group or an x value per row, a series per column), and :class:`NoData`.
A figure takes one run's rows and returns a ``Figure`` built without ``pyplot`` (no GUI backend, no
global state)."""

from __future__ import annotations

import textwrap
from itertools import groupby

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..measure.floor import busy_over_wall as busy_exceeds_wall  # the one rule, under the plots' name
from ..measure.workloads import NXS
from .frames import is_default_config, one_per, pick_rows, workloads_of

MODE_ORDER = ("hf-eager", "compile", "compile-max", "lab-eager", "lab-graph", "lab-graph-fused")
MODE_COLORS = {"hf-eager": "#7f7f7f", "compile": "#9467bd", "compile-max": "#e377c2", "lab-eager": "#1f77b4",
               "lab-graph": "#2ca02c", "lab-graph-fused": "#d62728"}
MAX_WIDTH_IN = 12.0  # figures fit a page: at most this wide (inches; 1440 px at the report's 120 dpi)
BUSY_OVER_WALL = "busy > wall: the profiled call ran slower than the timed median"


class NoData(ValueError):
    """A figure has no data to draw (``report`` skips it and prints the reason)."""


def mode_key(mode: str) -> tuple:
    """Sort key of a mode: :data:`MODE_ORDER`, unknown modes last by name."""
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def page_width(wanted: float, least: float = 6.0) -> float:
    """A figure width (inches) between ``least`` and :data:`MAX_WIDTH_IN`."""
    return min(MAX_WIDTH_IN, max(least, wanted))


def set_title(fig: Figure, title: str | None) -> None:
    """The figure's title (it names the run: file and date, where the caller knows them), each line
    wrapped to the figure's width so that none is cut off (a file name is never split)."""
    if title:
        chars = int(12 * fig.get_figwidth())  # what fits at 10 pt
        fig.suptitle("\n".join(textwrap.fill(line, chars, break_on_hyphens=False) for line in title.splitlines()),
                     fontsize=10)


def figure(width: float, height: float, title: str | None, rows: int = 1, cols: int = 1, **kw):
    """A titled figure of ``rows`` × ``cols`` panels, at most a page wide: ``(fig, flat array of axes)``."""
    fig = Figure(figsize=(page_width(width), height), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw).ravel()
    set_title(fig, title)
    return fig, axes


def color_of(series, i: int):
    """A series' colour: its mode's (:data:`MODE_COLORS`), else the ``i``-th of matplotlib's cycle."""
    return MODE_COLORS.get(series, f"C{i % 10}")


def bars(ax, table: pd.DataFrame, fmt: str | None = "%.2f", err=None, labels: pd.DataFrame | None = None,
         colors: dict | None = None) -> None:
    """Grouped bars: a group per row of ``table`` (its index labels the x axis), a bar per column, each
    labelled ``fmt`` (or its cell of ``labels``); ``err``: ``(below, above)`` tables of whisker lengths;
    ``colors``: per column (default :func:`color_of`)."""
    width = 0.8 / len(table.columns)
    for i, col in enumerate(table.columns):
        vals, keep = table[col].to_numpy(float), table[col].notna().to_numpy()
        xs = np.arange(len(table)) + (i - (len(table.columns) - 1) / 2) * width
        yerr = None if err is None else [e[col].to_numpy(float)[keep] for e in err]
        drawn = ax.bar(xs[keep], vals[keep], width, yerr=yerr, capsize=2, label=str(col),
                       color=(colors or {}).get(col, color_of(col, i)))
        crowded = table.size > 16  # upright labels would overlap: turn them
        if fmt or labels is not None:
            ax.bar_label(drawn, fmt=fmt or "", labels=None if labels is None else labels[col][keep].tolist(),
                         fontsize=6 if crowded else 7, padding=1, rotation=90 if crowded else 0)
    ax.set_xticks(range(len(table)), [" ".join(map(str, i)) if isinstance(i, tuple) else str(i) for i in table.index],
                  fontsize=8)
    ax.margins(y=0.12)  # room for the labels


def lines(ax, table: pd.DataFrame, styles: dict | None = None, colors: dict | None = None) -> None:
    """A line per column of ``table`` over its index (numbers: a log-2 axis ticked at each), points marked."""
    for i, col in enumerate(table.columns):
        s = table[col].dropna()
        ax.plot(s.index.tolist(), s.tolist(), "o", ls=(styles or {}).get(col, "-"),
                color=(colors or {}).get(col, color_of(col, i)), label=str(col))
    ax.set_xscale("log", base=2)
    ax.set_xticks(table.index.tolist(), [str(x) for x in table.index])
    ax.minorticks_off()


def stack(ax, y: int, parts: list[tuple[str, float, str]], seen: set, hatched: str | None = None) -> float:
    """One horizontal bar of ``(label, ms, colour)`` parts, left to right (a label's first part enters the
    legend); the part labelled ``hatched`` is hatched. Returns where the bar ends."""
    left = 0.0
    for label, ms, color in parts:
        if ms is None or ms <= 0:
            continue
        ax.barh(y, ms, 0.7, left=left, color=color, hatch="///" if label == hatched else None,
                edgecolor="#999999" if label == hatched else "white", lw=0.5, label=None if label in seen else label)
        seen.add(label)
        left += ms
    return left


def latency_figure(rows: list[dict], title: str | None = None, log: bool = False) -> Figure:
    """Median latency (ms) per mode, bars grouped by workload; the whisker reaches p90. ``rows``:
    one run's (:func:`~lfm2vl_lab.report.frames.pick_rows` chooses one per mode and workload)."""
    df = pd.DataFrame(pick_rows(rows))
    if df.empty:
        raise NoData("latency_figure: no rows with median_ms")
    order = dict(index=workloads_of(df.to_dict("records")), columns=sorted(set(df["mode"]), key=mode_key))
    med = df.pivot(index="workload", columns="mode", values="median_ms").reindex(**order)
    p90 = df.assign(p90_ms=df.get("p90_ms", df["median_ms"]).fillna(df["median_ms"])).pivot(
        index="workload", columns="mode", values="p90_ms").reindex(**order)
    fig, (ax,) = figure(1.5 * len(med) + 2, 4.2, title or "Encoder latency per mode (whisker: p90)")
    bars(ax, med, err=(0 * med, (p90 - med).clip(lower=0)))
    ax.set(ylabel="median latency per call (ms)", yscale="log" if log else "linear",
           xlabel="workload (images per call × side in px; tiled: one tiled image; stream: mixed requests)")
    ax.legend(fontsize=8, ncols=min(len(med.columns), 5), title="mode (whisker: p90)", title_fontsize=8)
    return fig


def speedup_figure(rows: list[dict], side: int | None = None, title: str | None = None) -> Figure:
    """Speedup over hf-eager against the number of images, for the ``NxS`` workloads of one side ``S``
    (default: the side with the most image counts); a line needs two image counts. ``rows``: one run's."""
    df = pd.DataFrame([r for r in pick_rows(rows) if r.get("speedup_vs_hf") and NXS.fullmatch(str(r["workload"]))])
    if df.empty:
        raise NoData("speedup_figure: no NxS rows with speedup_vs_hf")
    df[["n", "side"]] = df["workload"].str.extract(NXS.pattern).astype(int).to_numpy()
    side = side or df.drop_duplicates("workload")["side"].value_counts().idxmax()
    df = df[(df.side == side) & (df["mode"] != "hf-eager")]
    if df["n"].nunique() < 2:
        raise NoData(f"speedup_figure: needs at least two image counts of {side} px (e.g. --workload 1..16x512)")
    fig, (ax,) = figure(6.5, 4.2, title or "Speedup over transformers' eager path vs batch size")
    table = df.pivot(index="n", columns="mode", values="speedup_vs_hf")
    lines(ax, table[sorted(table.columns, key=mode_key)])
    ax.axhline(1.0, color=MODE_COLORS["hf-eager"], ls="--", lw=1, label="hf-eager (1×)")
    ax.set(xlabel=f"images per call ({side}×{side} px)", ylabel="speedup over hf-eager (×, median over median)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig


def floor_share_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Each median split into the GPU-busy floor and the rest (host overhead, gaps, syncs), labelled
    busy / median. A row busy longer than its median (the profile is a separate call) is hatched and
    labelled with both numbers, never drawn as "100% busy"."""
    rows = [r for r in pick_rows(rows) if r.get("gpu_busy_ms")]
    if not rows:
        raise NoData("floor_share_figure: no rows with gpu_busy_ms (run bench with --profile on a GPU)")
    order = workloads_of(rows)
    rows.sort(key=lambda r: (order.index(r["workload"]), mode_key(r["mode"])))
    over = [id(r) for r in busy_exceeds_wall(rows)]
    fig, (ax,) = figure(8, 0.27 * len(rows) + 2.3, title or "Share of each call spent at the GPU-busy floor")
    for i, r in enumerate(rows):
        busy, med, color = r["gpu_busy_ms"], r["median_ms"], MODE_COLORS.get(r["mode"], "C0")
        if id(r) in over:  # the whole median is "busy", and the note says why that is not 100%
            ax.barh(i, med, color=color, hatch="////", edgecolor="black", lw=0.5)
            note = f" busy {busy:.2f} ms > median {med:.2f} ms (profiled call slower)"
        else:
            ax.barh(i, busy, color=color)
            ax.barh(i, med - busy, left=busy, color="#dddddd")
            note = f" {100 * busy / med:.0f}% busy"
        ax.text(med, i, note, va="center", fontsize=7, color="#b00000" if id(r) in over else "black")
        if i and r["workload"] != rows[i - 1]["workload"]:  # a thin line between workloads
            ax.axhline(i - 0.5, color="#bbbbbb", lw=0.6)
    ax.set_yticks(range(len(rows)), [f"{r['workload']}  {r['mode']}" for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first workload on top
    ax.set_xlim(0, (1.6 if over else 1.18) * max(r["median_ms"] for r in rows))  # room for the labels
    ax.set_xlabel("ms per call (median of the timed calls)")
    handles = [Patch(color=MODE_COLORS.get(m, "C0"), label=f"{m}: GPU busy (the floor)")
               for m in sorted({r["mode"] for r in rows}, key=mode_key)]
    handles.append(Patch(color="#dddddd", label="rest: host overhead, launch gaps, syncs"))
    if over:
        handles.append(Patch(facecolor="white", hatch="////", edgecolor="black", label=BUSY_OVER_WALL))
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=3)
    return fig


TIMELINE_COLORS = {"launch": "#ff7f0e", "other": "#999999", "gpu": "#2ca02c"}
TIMELINE_LABELS = {"launch": "CPU: kernel / graph launch calls",
                   "other": "CPU: other CUDA calls (copies, syncs, queries) or CPU operators",
                   "gpu": "GPU: kernels and copies"}


def timeline_figure(timelines: dict, title: str | None = None, max_us: float | None = None) -> Figure:
    """One panel per timeline (``{"cpu": [(start_us, dur_us, name)], "gpu": [...]}``): CPU launch calls
    above GPU kernels on a shared µs axis, so the panels compare directly."""
    from ..measure.profiling import LAUNCH_PREFIXES

    if not timelines:
        raise NoData("timeline_figure: no timelines")
    fig, axes = figure(10, 1.5 * len(timelines) + 1.2, title or "One call: CPU launch calls vs GPU kernels",
                       rows=len(timelines), sharex=True)
    end, seen = 0.0, set()
    for ax, (label, tl) in zip(axes, timelines.items(), strict=True):
        for lane, y in (("cpu", 1), ("gpu", 0)):
            events = tl.get(lane, [])
            spans = [(float(e[0]), max(float(e[1]), 0.05)) for e in events]
            kinds = ["gpu" if lane == "gpu" else "launch" if str(e[2] if len(e) > 2 else "").startswith(
                LAUNCH_PREFIXES) else "other" for e in events]
            ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=[TIMELINE_COLORS[k] for k in kinds], lw=0)
            seen.update(kinds)
            end = max([end] + [s + d for s, d in spans])
        ax.set_yticks([0, 1], [f"GPU ({len(tl.get('gpu', []))})", f"CPU ({len(tl.get('cpu', []))})"], fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1].set_xlim(0, max_us or end * 1.02 or 1)
    axes[-1].set_xlabel("µs from the first event of the call (in brackets: events per lane)")
    handles = [Patch(color=TIMELINE_COLORS[k], label=TIMELINE_LABELS[k]) for k in TIMELINE_COLORS if k in seen]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    return fig


def padding_waste_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Padding waste of graph replays (%, each bar's hit rate in its label): one group per budget set
    (the ``stream`` only, what budgets are chosen for) where the rows hold several, else one per workload."""
    rows = one_per([r for r in rows if r.get("padding_waste") is not None and r.get("budget_set") is not None],
                   lambda r: (r["mode"], r["workload"], r["budget_set"]), "padding_waste_figure",
                   rank=lambda r: is_default_config(r, ignore=("budget_set",)))  # the default apart from its budgets
    if not rows:
        raise NoData("padding_waste_figure: no graph rows with padding_waste")
    df = pd.DataFrame(rows)
    per_set = df["budget_set"].nunique() > 1
    if per_set and (df["workload"] == "stream").any():
        df = df[df["workload"] == "stream"]
    group, other = ("budget_set", "workload") if per_set else ("workload", "budget_set")
    hits = df["hit_rate"] if "hit_rate" in df else [None] * len(df)
    df = df.assign(series=df["mode"] + (" · " if per_set else ", budget set ") + df[other].astype(str),
                   waste=100 * df["padding_waste"],
                   note=[f"{100 * w:.1f}%" + ("" if pd.isna(h) else f", hit {100 * h:.0f}%")
                         for w, h in zip(df["padding_waste"], hits)])
    order = dict(index=list(dict.fromkeys(df[group])), columns=list(dict.fromkeys(df["series"])))
    table = df.pivot(index=group, columns="series", values="waste").reindex(**order)
    fig, (ax,) = figure(1.1 * len(table) + 2.5, 4.2, title or "Padding waste per budget set")
    bars(ax, table, fmt=None, labels=df.pivot(index=group, columns="series", values="note").reindex(**order)
         if len(table.columns) <= 3 else None)  # more labels than that overlap
    ax.set(xlabel="budget set (output tokens per graph)" if per_set else "workload",
           ylabel="padding waste (% of real tokens)")
    ax.legend(fontsize=8, title="hit: share of calls served by a graph", title_fontsize=7)
    return fig


def graph_memory_figure(capture_info, title: str | None = None) -> Figure:
    """Each budget's graph memory (MiB, stacked: its growth of the shared pool, then its buffers) and
    capture time; ``capture_info``: a list, or ``{label: rows}``. Rows of the old format (no pool and
    buffer split) are refused, not drawn."""
    groups = capture_info if isinstance(capture_info, dict) else {"graphs": capture_info}
    groups = {k: pd.DataFrame(v).set_index("budget") for k, v in groups.items() if v and all("pool_mb" in r for r in v)}
    if not groups:
        raise NoData("graph_memory_figure: no capture_info rows with pool_mb/buffers_mb")
    budgets = sorted({b for g in groups.values() for b in g.index})
    fig, (ax,) = figure(0.9 * len(budgets) * len(groups) + 3, 4.6, title or "Graph memory and capture time per budget")
    right, width = ax.twinx(), 0.8 / len(groups)
    for i, (label, g) in enumerate(groups.items()):
        xs = [budgets.index(b) + (i - (len(groups) - 1) / 2) * width for b in g.index]
        ax.bar(xs, g.pool_mb, width, label=f"{label}: graph pool (growth)", alpha=0.85)
        top = ax.bar(xs, g.buffers_mb, width, bottom=g.pool_mb, label=f"{label}: buffers", alpha=0.6)
        ax.bar_label(top, labels=[f"{t:.0f}" for t in g.pool_mb + g.buffers_mb], fontsize=7, padding=1)
        right.plot(xs, g.get("capture_s", 0 * g.pool_mb), "kx", ms=6, label=None if i else "capture time (right axis)")
    ax.set_xticks(range(len(budgets)), budgets)
    right.set(ylabel="capture time (s, × markers)", ylim=(0, None))
    ax.set(xlabel="budget (output tokens), captured largest first: smaller ones reuse the pool's blocks",
           ylabel="memory held (MiB; on each bar: pool + buffers)")
    ax.set_title("\n".join(f"{k}: all budgets together {g.pool_mb.sum() + g.buffers_mb.sum():.0f} MiB (graph pool "
                           f"{g.pool_mb.sum():.0f} + buffers {g.buffers_mb.sum():.0f})" for k, g in groups.items()),
                 fontsize=8, loc="left")
    ax.legend(*[a + b for a, b in zip(ax.get_legend_handles_labels(), right.get_legend_handles_labels())],
              fontsize=9, loc="upper left")
    return fig


def layout_label(layout) -> str:
    """A packed layout in short: ``[1024, 1024, 576, 64]`` → ``"2×1024+576+64"``; 16 × 256 → ``"16×256"``."""
    return "+".join(f"{len(run)}×{n}" if len(run) > 1 else str(n)
                    for n, run in ((n, list(g)) for n, g in groupby(layout)))


def attention_figure(rows: list[dict], title: str | None = None, log: bool = True) -> Figure:
    """Attention µs per layer inside a CUDA graph per backend and layout, one panel per preset, on a
    log axis (one slow backend is tens of times the others); backends that never timed are named."""
    timed = [r for r in rows if r.get("graph_ms_per_layer") is not None]
    if not timed:
        raise NoData("attention_figure: no attention-probe rows (python -m lfm2vl_lab attention on a GPU)")
    timed = one_per(timed, lambda r: (r["preset"], tuple(r["layout"]), r["backend"]), "attention_figure")
    df = pd.DataFrame(timed).assign(layout=lambda d: d["layout"].map(layout_label),
                                    us=lambda d: 1000 * d["graph_ms_per_layer"])
    backends = list(dict.fromkeys(df["backend"]))
    panels = df.groupby("preset", sort=False)
    fig, axes = figure(1.5 * df.groupby("preset")["layout"].nunique().max() + 2.5, 2.9 * panels.ngroups + 1.1,
                       title or "Capturable attention kernels, timed inside CUDA graphs", rows=panels.ngroups)
    for ax, (preset, mine) in zip(axes, panels):
        bars(ax, mine.pivot(index="layout", columns="backend", values="us").reindex(
            index=list(dict.fromkeys(mine["layout"])), columns=backends), fmt="%.0f")
        ax.set(yscale="log" if log else "linear", ylabel="µs per layer" + (" (log)" if log else ""))
        ax.set_title(preset, fontsize=9, loc="left")
    axes[-1].set_xlabel("packed layout (rows per item; N×S: N items of S rows)")
    untimed = sorted({r.get("backend") for r in rows} - set(backends) - {None})
    note = f" · no time (failed on every layout): {', '.join(untimed)}" if untimed else ""
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(backends), fontsize=8,
               title=f"backend (timed inside a CUDA graph){note}", title_fontsize=8)
    return fig
