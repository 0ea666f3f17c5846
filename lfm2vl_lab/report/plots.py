"""Figures of the encoder's ``bench`` file, and what every figure shares: colours per mode, :func:`figure`,
the stacked bars :func:`stacks`, and :class:`NoData`. A figure returns a ``Figure`` built without
``pyplot`` (no GUI backend, no global state)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .frames import pick_rows

MODE_ORDER = ("hf-eager", "compile", "compile-max", "lab-eager", "lab-graph", "lab-graph-fused")
MODE_COLORS = {"hf-eager": "#7f7f7f", "compile": "#9467bd", "compile-max": "#e377c2", "lab-eager": "#1f77b4",
               "lab-graph": "#2ca02c", "lab-graph-fused": "#d62728"}
MAX_WIDTH_IN = 12.0  # figures fit a page: at most this wide (inches; 1440 px at the report's 120 dpi)


class NoData(ValueError):
    """A figure has no data to draw (``report`` skips it and prints the reason)."""


def rank(order, x) -> int:
    """Where ``x`` stands in ``order``, unknown values last."""
    return order.index(x) if x in order else len(order)


def figure(width: float, height: float, title: str | None, rows: int = 1, cols: int = 1, **kw):
    """``(fig, flat array of axes)`` of ``rows`` × ``cols`` panels, 6 inches to a page (:data:`MAX_WIDTH_IN`)
    wide; each line of the title is wrapped to that width, never inside a file name."""
    fig = Figure(figsize=(min(MAX_WIDTH_IN, max(6.0, width)), height), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw).ravel()
    if title:
        chars = int(12 * fig.get_figwidth())  # what fits at 10 pt
        fig.suptitle("\n".join(textwrap.fill(t, chars, break_on_hyphens=False) for t in title.splitlines()),
                     fontsize=10)
    return fig, axes


def stacks(ax, bars: list[tuple], seen: set, hatched: str | None = None, room: float = 1.7) -> None:
    """Horizontal bars, top to bottom, one per ``(label, parts, note)``: ``parts`` are ``(name, ms, colour)``
    left to right (a name's first part enters the legend; the part named ``hatched`` is hatched) and ``note``
    follows the bar, ``room`` times the longest bar leaving space for it; parts None: ``not recorded``."""
    right = 0.0
    for y, (_, parts, note) in enumerate(bars):
        left = 0.0
        for name, ms, color in parts or []:
            if ms is not None and ms > 0:
                ax.barh(y, ms, 0.7, left=left, color=color, hatch="///" if name == hatched else None, lw=0.5,
                        edgecolor="#999999" if name == hatched else "white", label=None if name in seen else name)
                seen.add(name)
                left += ms
        ax.text(left, y, " not recorded" if parts is None else note, va="center", fontsize=7,
                color="#888888" if parts is None else "black")
        right = max(right, left)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylim(len(bars) - 0.5, -0.5)  # the first bar on top, every bar's row shown
    ax.set_xlim(0, room * right or 1)


def latency_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Median latency (ms) per mode, bars grouped by workload; the whisker reaches p90. ``rows``:
    one run's (:func:`~lfm2vl_lab.report.frames.pick_rows` chooses one per mode and workload)."""
    df = pd.DataFrame(pick_rows(rows))
    if df.empty:
        raise NoData("latency_figure: no rows with median_ms")
    df["p90_ms"] = df.get("p90_ms", df["median_ms"]).fillna(df["median_ms"])
    order = dict(index=df["workload"].unique(), columns=sorted(set(df["mode"]), key=lambda m: (rank(MODE_ORDER, m), m)))
    med, p90 = (df.pivot(index="workload", columns="mode", values=v).reindex(**order) for v in ("median_ms", "p90_ms"))
    fig, (ax,) = figure(1.5 * len(med) + 2, 4.2, title or "Encoder latency per mode (whisker: p90)")
    width, crowded = 0.8 / len(med.columns), med.size > 16  # crowded: upright labels would overlap
    for i, mode in enumerate(med.columns):  # a group of bars per workload, a bar per mode in its colour
        keep, up = med[mode].notna().to_numpy(), (p90 - med)[mode].clip(lower=0).to_numpy(float)
        xs = np.arange(len(med)) + (i - (len(med.columns) - 1) / 2) * width
        drawn = ax.bar(xs[keep], med[mode].to_numpy(float)[keep], width, yerr=[0 * up[keep], up[keep]], capsize=2,
                       label=str(mode), color=MODE_COLORS.get(mode, f"C{i % 10}"))
        ax.bar_label(drawn, fmt="%.2f", fontsize=6 if crowded else 7, padding=1, rotation=90 if crowded else 0)
    ax.set_xticks(range(len(med)), [str(w) for w in med.index], fontsize=8)
    ax.margins(y=0.12)  # room for the labels
    ax.set(ylabel="median latency per call (ms)",
           xlabel="workload (images per call × side in px; tiled: one tiled image; stream: mixed requests)")
    ax.legend(fontsize=8, ncols=min(len(med.columns), 5), title="mode (whisker: p90)", title_fontsize=8)
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
