"""Figures of the TTFT grid (``python -m lfm2vl_lab ttft``, :mod:`lfm2vl_lab.measure.ttft`).

The grid's rows carry ``preset``, ``image``, ``requests``, ``mode`` (one of :data:`TTFT_MODES`),
``ttft_ms`` (processor excluded), ``phases_ms`` (processor, h2d, encoder, merge, prefill, sample)
and ``decode_ms_per_token``. Like :mod:`lfm2vl_lab.report.plots`, every function takes plain rows and
returns a ``matplotlib.figure.Figure`` built without ``pyplot``; rows without the data a figure needs
raise :class:`~lfm2vl_lab.report.plots.NoData`, whose message says what is missing and what is there.

* :func:`ttft_breakdown_figure` — one request batch's first token, phase by phase: a stacked bar per mode
* :func:`ttft_grid_figure`      — TTFT against requests, one line per mode, one panel per (preset, image)
* :func:`decode_figure`         — decode ms per token against requests, laid out the same way
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from ..measure.ttft import mode_name
from ..serving.pipeline import MODES
from .plots_common import NoData, one_per, set_title

TTFT_MODES = tuple(mode_name(t, e) for t in MODES for e in MODES)  # all eager first, both graphed last
PROCESSOR = "processor"  # runs on the CPU before the pipeline; outside the TTFT target
TTFT_PHASES = ("h2d", "encoder", "merge", "prefill", "sample")  # the phases TTFT covers, in order
PHASE_COLORS = {"h2d": "#8c564b", "encoder": "#2ca02c", "merge": "#bcbd22", "prefill": "#1f77b4",
                "sample": "#ff7f0e", PROCESSOR: "#e8e8e8"}
TTFT_MODE_COLORS = dict(zip(TTFT_MODES, ("#7f7f7f", "#98df8a", "#1f77b4", "#2ca02c")))
TTFT_MODE_STYLES = {m: "--" if m.startswith(mode_name("eager", "")) else "-" for m in TTFT_MODES}  # text eager dashed
NO_ROWS = "no TTFT grid rows (python -m lfm2vl_lab ttft on a GPU records them)"


def ttft_rows(rows: list[dict]) -> list[dict]:
    """The TTFT grid's rows among ``rows`` (one run's): one per (preset, image, requests, mode). Two
    rows of one case and mode are rows of two runs, which a figure or table must not mix: they raise
    :class:`~lfm2vl_lab.report.plots.MixedRuns`."""
    return one_per((r for r in rows if r.get("ttft_ms") is not None and r.get("mode") in TTFT_MODES),
                   lambda r: (r.get("preset"), r.get("image"), r.get("requests"), r["mode"]), "ttft_rows")


def recorded_cases(rows: list[dict]) -> str:
    """What the rows cover, for messages: ``"lfm2-vl-450m 1x512 x1, lfm2-vl-450m 1x512 x4"``."""
    cases = dict.fromkeys(f"{r.get('preset')} {r.get('image')} x{r.get('requests')}" for r in ttft_rows(rows))
    return ", ".join(cases) or "nothing"


def ttft_case(rows: list[dict], preset: str, image: str, requests: int) -> dict[str, dict]:
    """``{mode: row}`` of one (preset, image, requests), in :data:`TTFT_MODES` order; empty if none."""
    by = {r["mode"]: r for r in ttft_rows(rows) if (r.get("preset"), r.get("image"), r.get("requests")) ==
          (preset, image, requests)}
    return {m: by[m] for m in TTFT_MODES if m in by}


def phase_order(phases: dict) -> list[str]:
    """The phases of ``phases_ms`` in the order they are drawn: TTFT's own (in pipeline order, then any
    other but decode), then the processor, which the TTFT target leaves out."""
    inside = [p for p in TTFT_PHASES if p in phases]
    inside += [p for p in phases if p not in TTFT_PHASES and p not in (PROCESSOR, "decode")]
    return inside + ([PROCESSOR] if PROCESSOR in phases else [])


def bar_note(row: dict) -> str:
    """The label at the end of a mode's bar: TTFT, the encoder graphs' cut, decode per token."""
    note = f" TTFT {row['ttft_ms']:.2f} ms"
    if row.get("encoder_graph_cut") is not None:
        note += f" (encoder graphs cut {100 * row['encoder_graph_cut']:.0f}%)"
    if row.get("decode_ms_per_token") is not None:
        note += f"\n decode {row['decode_ms_per_token']:.2f} ms/token"
    if row.get("same_first_tokens") is False:
        note += " · first tokens differ from eager's"
    return note


def _breakdown_panel(ax, by: dict, label: str, seen: set) -> None:
    """One stacked horizontal bar per mode (a "not recorded" note where a mode has no row)."""
    right = 0.0
    for i, mode in enumerate(TTFT_MODES):
        r = by.get(mode)
        if r is None:
            ax.text(0, i, " not recorded", va="center", fontsize=8, color="#888888")
            continue
        phases, left = r.get("phases_ms") or {}, 0.0
        for name in phase_order(phases):
            ms = float(phases[name])
            outside = name == PROCESSOR
            ax.barh(i, ms, 0.7, left=left, color=PHASE_COLORS.get(name, "#c5b0d5"), hatch="///" if outside else None,
                    edgecolor="#999999" if outside else "white", lw=0.5,
                    label=(f"{name} (CPU, not in TTFT)" if outside else name) if name not in seen else None)
            seen.add(name)
            left += ms
        ax.text(left, i, bar_note(r), va="center", fontsize=7)
        right = max(right, left)
    ax.set_yticks(range(len(TTFT_MODES)), TTFT_MODES, fontsize=8)
    ax.set_ylim(len(TTFT_MODES) - 0.5, -0.5)  # first mode on top, every mode's row shown
    ax.set_xlim(0, 1.7 * right or 1)  # room for the notes
    ax.set_title(label, fontsize=9, loc="left")


def ttft_breakdown_figure(rows: list[dict], preset: str | None = None, image: str = "1x512", requests: int = 1,
                          title: str | None = None) -> Figure:
    """Where the first token's time goes in each of the four modes, for one image and request count:
    a stacked bar per mode, one segment per phase (``phases_ms``, medians), the processor hatched at
    the end because the TTFT target leaves it out. Each bar is labelled with the measured ``ttft_ms``
    (the median of whole calls less their processor time, so it can differ a little from the sum of
    the phase medians), the encoder graphs' paired cut where the row has one, and decode ms per token.
    ``preset=None``: one panel per preset recorded at ``image`` x ``requests``."""
    rows = ttft_rows(rows)
    if not rows:
        raise NoData(f"ttft_breakdown_figure: {NO_ROWS}")
    presets = [preset] if preset else list(dict.fromkeys(r["preset"] for r in rows))
    cases = {p: ttft_case(rows, p, image, requests) for p in presets}
    cases = {p: by for p, by in cases.items() if by}
    if not cases:
        raise NoData(f"ttft_breakdown_figure: no rows for {preset or 'any preset'} {image} x{requests}; "
                     f"recorded: {recorded_cases(rows)}")
    fig = Figure(figsize=(10, 0.9 + 2.0 * len(cases)), layout="constrained")
    axes = fig.subplots(len(cases), 1, squeeze=False)[:, 0]
    seen: set = set()
    for ax, (p, by) in zip(axes, cases.items()):
        _breakdown_panel(ax, by, f"{p}, {image} x{requests}", seen)
    axes[-1].set_xlabel("ms per call (medians of each phase; hatched: the processor, outside the TTFT target)")
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=7)
    set_title(fig, title or "Time to first token, phase by phase, per mode")
    return fig


def _panel_lines(ax, mine: list[dict], metric: str) -> list[str]:
    """One line per mode over the request counts; returns the modes with no value in this panel."""
    missing = []
    for mode in TTFT_MODES:
        pts = sorted((r["requests"], r[metric]) for r in mine if r["mode"] == mode and r.get(metric) is not None)
        if not pts:
            missing.append(mode)
            continue
        ax.plot([n for n, _ in pts], [v for _, v in pts], "o", ls=TTFT_MODE_STYLES[mode],
                color=TTFT_MODE_COLORS[mode], label=mode)
    return missing


def _per_request_figure(rows: list[dict], metric: str, ylabel: str, title: str, presets, images,
                        log: bool) -> Figure:
    """``metric`` against requests, one line per mode, one panel per (preset, image), two columns."""
    every = ttft_rows(rows)
    if not every:
        raise NoData(NO_ROWS)
    rows = [r for r in every if (presets is None or r.get("preset") in presets)
            and (images is None or r.get("image") in images)]
    if not any(r.get(metric) is not None for r in rows):
        raise NoData(f"no {metric} in the TTFT rows asked for (presets {presets or 'any'}, images {images or 'any'}); "
                     f"recorded: {recorded_cases(every)}")
    panels = list(dict.fromkeys((r["preset"], r["image"]) for r in rows))
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.2 * ncols + 0.5, 3.4 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (p, im) in zip(axes, panels):
        mine = [r for r in rows if (r["preset"], r["image"]) == (p, im)]
        missing = _panel_lines(ax, mine, metric)
        if missing:
            ax.text(0.01, 0.01, "not recorded: " + ", ".join(missing), transform=ax.transAxes, fontsize=6,
                    color="#888888", va="bottom")
        ns = sorted({r["requests"] for r in mine})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_title(f"{p}, {im}", fontsize=9, loc="left")
        ax.set_xlabel("requests per call")
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    h, lab = max((ax.get_legend_handles_labels() for ax in fig.axes), key=lambda hl: len(hl[1]))
    fig.legend(h, lab, loc="outside lower center", ncols=min(len(lab), 2 * ncols), fontsize=7)
    set_title(fig, title)
    return fig


def ttft_grid_figure(rows: list[dict], presets=None, images=None, title: str | None = None,
                     log: bool = False) -> Figure:
    """TTFT (ms, processor excluded) against requests per call: one line per mode (text eager dashed,
    text graphed solid), one panel per (preset, image); ``presets``/``images`` restrict the panels."""
    return _per_request_figure(rows, "ttft_ms", "time to first token (ms)",
                               title or "Time to first token per mode against requests", presets, images, log)


def decode_figure(rows: list[dict], presets=None, images=None, title: str | None = None,
                  log: bool = False) -> Figure:
    """Decode ms per token against requests, laid out like :func:`ttft_grid_figure`. Decode never runs
    the encoder, so at one text mode the two encoder modes should draw the same line."""
    return _per_request_figure(rows, "decode_ms_per_token", "decode (ms per token)",
                               title or "Decode time per token per mode against requests", presets, images, log)
