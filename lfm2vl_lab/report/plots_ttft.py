"""The TTFT grid (``ttft``) past the encoder: its rows as a frame, and its two figures, drawn with
:mod:`.plots`' helpers (each other number of the grid is a DataFrame of :mod:`.ttft_summary`)."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from ..measure.ttft import mode_name
from ..serving.pipeline import MODES
from .frames import need, one_per
from .plots import NoData, figure, rank, stacks

TTFT_MODES = tuple(mode_name(t, e) for t in MODES for e in MODES)  # all eager first, both graphed last
PROCESSOR = "processor"  # runs on the CPU before the pipeline; outside the TTFT target
TTFT_PHASES = ("h2d", "encoder", "merge", "prefill", "sample")  # the phases TTFT covers, in order
PHASE_COLORS = {"h2d": "#8c564b", "encoder": "#2ca02c", "merge": "#bcbd22", "prefill": "#1f77b4",
                "sample": "#ff7f0e", PROCESSOR: "#e8e8e8"}
TTFT_MODE_COLORS = dict(zip(TTFT_MODES, ("#7f7f7f", "#98df8a", "#1f77b4", "#2ca02c")))
NO_ROWS = "no TTFT grid rows (python -m lfm2vl_lab ttft on a GPU records them)"
CASE = ["preset", "image", "requests"]


def ttft_rows(rows: list[dict]) -> list[dict]:
    """The TTFT grid's rows among one run's rows, one per case and mode (two are two runs: :class:`MixedRuns`)."""
    return one_per((r for r in rows if r.get("ttft_ms") is not None and r.get("mode") in TTFT_MODES),
                   lambda r: (r.get("preset"), r.get("image"), r.get("requests"), r["mode"]), "ttft_rows")


def ttft_frame(rows: list[dict]) -> pd.DataFrame:
    """The TTFT grid's rows (:func:`ttft_rows`) as a frame, phases as dotted columns, every column the pages read."""
    return need(pd.json_normalize(ttft_rows(rows)), *CASE, "mode", "ttft_ms", "decode_ms_per_token",
                "encoder_graph_cut", "decode_drift")


def per_case(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """``value`` per case (rows, in recorded order) and TTFT mode (columns, :data:`TTFT_MODES`)."""
    order = pd.MultiIndex.from_frame(df[CASE].drop_duplicates())
    return df.pivot(index=CASE, columns="mode", values=value).reindex(index=order, columns=list(TTFT_MODES))


def case_name(case: tuple) -> str:
    """``("lfm2-vl-450m", "1x512", 4)`` → ``"lfm2-vl-450m 1x512 x4"``."""
    return f"{case[0]} {case[1]} x{case[2]}"


def ttft_case(rows: list[dict], preset: str, image: str, requests: int) -> dict[str, dict]:
    """``{mode: row}`` of one (preset, image, requests), in :data:`TTFT_MODES` order; empty if none."""
    by = {r["mode"]: r for r in ttft_rows(rows) if (r.get("preset"), r.get("image"), r.get("requests")) ==
          (preset, image, requests)}
    return {m: by[m] for m in TTFT_MODES if m in by}


def ttft_breakdown_figure(rows: list[dict], image: str = "1x512", requests: int = 1, title: str | None = None
                          ) -> Figure:
    """Where the first token's time goes in each mode at one image and request count, a panel per preset:
    stacked phase medians in pipeline order, the processor (outside TTFT) hatched last; each bar's note
    gives TTFT, the encoder graphs' cut and decode per token."""
    rows = ttft_rows(rows)
    if not rows:
        raise NoData(f"ttft_breakdown_figure: {NO_ROWS}")
    cases = {p: by for p in dict.fromkeys(r["preset"] for r in rows) if (by := ttft_case(rows, p, image, requests))}
    if not cases:
        seen = ", ".join(dict.fromkeys(case_name([r.get(k) for k in CASE]) for r in rows))
        raise NoData(f"ttft_breakdown_figure: no rows for {image} x{requests}; recorded: {seen}")
    fig, axes = figure(10, 0.9 + 2.0 * len(cases), title or "Time to first token, phase by phase, per mode",
                       rows=len(cases))
    outside, seen = f"{PROCESSOR} (CPU, not in TTFT)", set()
    for ax, (p, by) in zip(axes, cases.items()):
        bars = []
        for mode in TTFT_MODES:
            if (r := by.get(mode)) is None:
                bars.append((mode, None, ""))
                continue
            phases, cut, dec = r.get("phases_ms") or {}, r.get("encoder_graph_cut"), r.get("decode_ms_per_token")
            order = sorted((n for n in phases if n != "decode"), key=lambda n: (n == PROCESSOR, rank(TTFT_PHASES, n)))
            note = f" TTFT {r['ttft_ms']:.2f} ms" + ("" if cut is None else f" (encoder graphs cut {100 * cut:.0f}%)")
            note += "" if dec is None else f"\n decode {dec:.2f} ms/token"
            note += " · first tokens differ from eager's" if r.get("same_first_tokens") is False else ""
            bars.append((mode, [(outside if n == PROCESSOR else n, float(phases[n]), PHASE_COLORS.get(n, "#c5b0d5"))
                                for n in order], note))
        stacks(ax, bars, seen, hatched=outside)
        ax.set_title(f"{p}, {image} x{requests}", fontsize=9, loc="left")
    axes[-1].set_xlabel("ms per call (medians of each phase; hatched: the processor, outside the TTFT target)")
    fig.legend(loc="outside lower center", ncols=len(seen), fontsize=7)  # every panel's entries, in order
    return fig


def ttft_grid_figure(rows: list[dict], title: str | None = None) -> Figure:
    """TTFT (ms, processor excluded) against requests per call: one line per mode (text eager dashed,
    text graphed solid), one panel per (preset, image)."""
    df = ttft_frame(rows)
    if df.empty:
        raise NoData(NO_ROWS)
    panels = df.groupby(["preset", "image"], sort=False)
    cols, nrows = min(2, panels.ngroups), math.ceil(panels.ngroups / 2)
    fig, axes = figure(5.2 * cols + 0.5, 3.4 * nrows + 0.9, title or "Time to first token per mode against requests",
                       rows=nrows, cols=cols)
    for ax, ((p, im), mine) in zip(axes, panels):
        table = mine.pivot(index="requests", columns="mode", values="ttft_ms").reindex(columns=TTFT_MODES)
        for mode in table.columns[table.notna().any()]:  # text eager dashed, text graphed solid
            s = table[mode].dropna()
            ax.plot(s.index.tolist(), s.tolist(), "o", ls="--" if mode.startswith(mode_name("eager", "")) else "-",
                    color=TTFT_MODE_COLORS[mode], label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(table.index.tolist(), [str(x) for x in table.index])
        ax.minorticks_off()
        if missing := [m for m in TTFT_MODES if table[m].isna().all()]:
            ax.text(0.01, 0.01, "not recorded: " + ", ".join(missing), transform=ax.transAxes, fontsize=6,
                    color="#888888", va="bottom")
        ax.set_xlabel("requests per call")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("time to first token (ms)", fontsize=8)
        ax.set_title(f"{p}, {im}", fontsize=9, loc="left")
    for ax in axes[panels.ngroups:]:
        fig.delaxes(ax)
    h, lab = max((ax.get_legend_handles_labels() for ax in fig.axes), key=lambda hl: len(hl[1]))
    fig.legend(h, lab, loc="outside lower center", ncols=min(len(lab), 2 * cols), fontsize=7)
    return fig
