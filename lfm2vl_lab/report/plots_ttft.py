"""Figures of the request past the encoder, as :mod:`.plots` draws them: the TTFT grid (``ttft``), TTFT
inside ``generate`` (``e2e``), the text model's peers (``engine``); and the grid's rows as a frame."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from ..measure.engine_peers import MODES as PEER_MODES
from ..measure.ttft import mode_name
from ..serving.pipeline import MODES
from .frames import need, one_per
from .plots import MODE_COLORS, NoData, page_width, set_title

TTFT_MODES = tuple(mode_name(t, e) for t in MODES for e in MODES)  # all eager first, both graphed last
PROCESSOR = "processor"  # runs on the CPU before the pipeline; outside the TTFT target
TTFT_PHASES = ("h2d", "encoder", "merge", "prefill", "sample")  # the phases TTFT covers, in order
PHASE_COLORS = {"h2d": "#8c564b", "encoder": "#2ca02c", "merge": "#bcbd22", "prefill": "#1f77b4",
                "sample": "#ff7f0e", PROCESSOR: "#e8e8e8"}
TTFT_MODE_COLORS = dict(zip(TTFT_MODES, ("#7f7f7f", "#98df8a", "#1f77b4", "#2ca02c")))
TTFT_MODE_STYLES = {m: "--" if m.startswith(mode_name("eager", "")) else "-" for m in TTFT_MODES}  # text eager dashed
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


def ttft_cases(rows: list[dict]) -> list[tuple]:
    """The ``(preset, image, requests)`` cases of a TTFT grid's rows, in the order they were recorded."""
    return list(dict.fromkeys((r.get("preset"), r.get("image"), r.get("requests")) for r in ttft_rows(rows)))


def case_name(case: tuple) -> str:
    """``("lfm2-vl-450m", "1x512", 4)`` → ``"lfm2-vl-450m 1x512 x4"``."""
    return f"{case[0]} {case[1]} x{case[2]}"


def recorded_cases(rows: list[dict]) -> str:
    """What the rows cover, for messages: ``"lfm2-vl-450m 1x512 x1, lfm2-vl-450m 1x512 x4"``."""
    return ", ".join(map(case_name, ttft_cases(rows))) or "nothing"


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
    """Where the first token's time goes in each mode at one image and request count: stacked phase
    medians, the processor (outside TTFT) hatched last. ``preset=None``: one panel per preset."""
    rows = ttft_rows(rows)
    if not rows:
        raise NoData(f"ttft_breakdown_figure: {NO_ROWS}")
    presets = [preset] if preset else list(dict.fromkeys(r["preset"] for r in rows))
    cases = {p: by for p in presets if (by := ttft_case(rows, p, image, requests))}  # the presets with the case
    if not cases:
        raise NoData(f"ttft_breakdown_figure: no rows for {preset or 'any preset'} {image} x{requests}; "
                     f"recorded: {recorded_cases(rows)}")
    fig = Figure(figsize=(10, 0.9 + 2.0 * len(cases)), layout="constrained")
    axes = fig.subplots(len(cases), 1, squeeze=False)[:, 0]
    seen: set = set()
    for ax, (p, by) in zip(axes, cases.items()):
        _breakdown_panel(ax, by, f"{p}, {image} x{requests}", seen)
    axes[-1].set_xlabel("ms per call (medians of each phase; hatched: the processor, outside the TTFT target)")
    labels = [lab for ax in axes for lab in ax.get_legend_handles_labels()[1]]
    fig.legend(loc="outside lower center", ncols=len(labels), fontsize=7)  # every panel's entries, in order
    set_title(fig, title or "Time to first token, phase by phase, per mode")
    return fig


def _panel_lines(ax, mine: pd.DataFrame, metric: str) -> list[str]:
    """One line per mode over the request counts; returns the modes with no value in this panel."""
    missing = []
    for mode in TTFT_MODES:
        pts = mine[mine["mode"] == mode].dropna(subset=[metric]).sort_values("requests")
        if pts.empty:
            missing.append(mode)
            continue
        ax.plot(pts.requests.tolist(), pts[metric].tolist(), "o", ls=TTFT_MODE_STYLES[mode],
                color=TTFT_MODE_COLORS[mode], label=mode)
    return missing


def _per_request_figure(rows: list[dict], metric: str, ylabel: str, title: str, presets, images,
                        log: bool) -> Figure:
    """``metric`` against requests, one line per mode, one panel per (preset, image), two columns."""
    every = ttft_frame(rows)
    if every.empty:
        raise NoData(NO_ROWS)
    df = every[every.preset.isin(every.preset if presets is None else presets)
               & every.image.isin(every.image if images is None else images)]
    if df[metric].isna().all():
        raise NoData(f"no {metric} in the TTFT rows asked for (presets {presets or 'any'}, images {images or 'any'}); "
                     f"recorded: {recorded_cases(rows)}")
    panels = df.groupby(["preset", "image"], sort=False)
    ncols = min(2, panels.ngroups)
    nrows = math.ceil(panels.ngroups / ncols)
    fig = Figure(figsize=(5.2 * ncols + 0.5, 3.4 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, ((p, im), mine) in zip(axes, panels):
        missing = _panel_lines(ax, mine, metric)
        if missing:
            ax.text(0.01, 0.01, "not recorded: " + ", ".join(missing), transform=ax.transAxes, fontsize=6,
                    color="#888888", va="bottom")
        ns = sorted(mine.requests.unique().tolist())
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
    for ax in axes[panels.ngroups:]:
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


E2E_MODES = ("hf-eager", "lab-graph", "lab-eager")  # transformers' image path, the graphed encoder (or its eager run)


def _e2e_ttft_bars(ax, keys: list, by: dict, lab: str) -> None:
    """TTFT bars per mode, the encoder's part drawn inside in a darker shade of the mode's colour
    (its own legend entry, the same colour), each bar labelled with its TTFT change."""
    for i, mode in enumerate(("hf-eager", lab)):
        color = MODE_COLORS.get(mode, "C0")
        for j, k in enumerate(keys):
            r = by.get((*k, mode))
            if r is None:
                continue
            x = j + (i - 0.5) * 0.38
            first = j == 0  # one legend entry per mode and part
            ax.bar(x, r["ttft_ms"], 0.36, color=color, label=f"{mode}: time to first token" if first else None)
            ax.bar(x, r["encoder_ms"], 0.36, color=tuple(0.55 * c for c in to_rgb(color)),  # darker: the encoder's part
                   label=f"{mode}: its encoder part" if first else None)
            base = by.get((*k, "hf-eager"))
            note = f"{r['ttft_ms']:.1f}" if mode == "hf-eager" or base is None else \
                f"{r['ttft_ms']:.1f}\n({100 * (r['ttft_ms'] / base['ttft_ms'] - 1):+.0f}%)"
            ax.text(x, r["ttft_ms"], note, ha="center", va="bottom", fontsize=7)
    ax.margins(y=0.12)
    ax.set_ylabel("time to first token (ms)")
    ax.legend(fontsize=8, loc="upper left")


def _e2e_share_bars(ax, keys: list, by: dict, lab: str) -> None:
    """The encoder's share of TTFT per mode (``encoder_share_of_ttft``, else encoder / TTFT)."""
    for i, mode in enumerate(("hf-eager", lab)):
        mine = [(j + (i - 0.5) * 0.38, r) for j, k in enumerate(keys) if (r := by.get((*k, mode)))]
        bars = ax.bar([x for x, _ in mine], [100 * r.get("encoder_share_of_ttft", r["encoder_ms"] / r["ttft_ms"])
                                             for _, r in mine], 0.36, color=MODE_COLORS.get(mode), label=mode)
        ax.bar_label(bars, fmt="%.0f%%", fontsize=7, padding=1)
    ax.margins(y=0.15)  # room for the labels
    ax.set_ylabel("encoder share of TTFT (%)")
    ax.legend(fontsize=8)


def e2e_figure(rows: list[dict], title: str | None = None, share: bool = False) -> Figure:
    """TTFT per case, transformers' image path against the graphed encoder, the encoder's own time
    inside each bar; ``share=True`` adds the encoder's share of TTFT below."""
    rows = [r for r in rows if r.get("ttft_ms") is not None and r.get("mode") in E2E_MODES]
    if not rows:
        raise NoData("e2e_figure: no end-to-end rows (python -m lfm2vl_lab e2e on a GPU)")
    rows = one_per(rows, lambda r: (r["preset"], r["image"], r["requests"], r["mode"]), "e2e_figure")
    keys = list(dict.fromkeys((r["preset"], r["image"], r["requests"]) for r in rows))
    by = {(r["preset"], r["image"], r["requests"], r["mode"]): r for r in rows}
    # the graphed encoder's rows say "lab-eager" where nothing was captured (e2e on a CPU)
    lab = "lab-graph" if any(r["mode"] == "lab-graph" for r in rows) else "lab-eager"
    fig = Figure(figsize=(page_width(1.2 * len(keys) + 2), 6.5 if share else 4.5), layout="constrained")
    if share:
        ax, ax_share = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
        _e2e_share_bars(ax_share, keys, by, lab)
    else:
        ax = ax_share = fig.add_subplot()
    _e2e_ttft_bars(ax, keys, by, lab)
    ax_share.set_xticks(range(len(keys)), [f"{p}\n{im} ×{n} requests" for p, im, n in keys], fontsize=8)
    set_title(fig, title or "Time to first token: transformers' image path vs the graphed encoder")
    return fig


PEER_COLORS = dict(zip(PEER_MODES, ("#7f7f7f", "#9467bd", "#8c564b", "#2ca02c", "#d62728")))


def run_title(result: dict) -> str:
    """Which run a figure draws: GPU, date and file (where the file was loaded from one)."""
    p = result.get("provenance", {})
    where = f" ({Path(result['_path']).name})" if result.get("_path") else ""
    return f"{p.get('gpu', '?')}, {str(p.get('date', ''))[:10]}{where}"


def _decode_rows(result: dict, preset: str) -> list[dict]:
    return [r for r in result.get("rows", []) if r.get("preset") == preset and r.get("requests") == 1]


def decode_vs_floor(result: dict, title: str | None = None) -> Figure:
    """Decode ms per token per mode (one request) against the bandwidth floor, a panel per preset.
    A mode recorded with an error has no bar; its label says "error"."""
    presets = [s["preset"] for s in result.get("setup", []) if _decode_rows(result, s["preset"])]
    if not presets:
        raise NoData("no decode rows in this file (python -m lfm2vl_lab engine records them)")
    fig = Figure(figsize=(page_width(4.2 * len(presets) + 1), 4.2), layout="constrained")
    axes = fig.subplots(1, len(presets), squeeze=False)[0]
    floors = {s["preset"]: s["floor"] for s in result["setup"]}
    for ax, preset in zip(axes, presets):
        rows = _decode_rows(result, preset)
        labels = [r["mode"] + ("\n(error)" if "error" in r else "") for r in rows]
        vals = [r.get("decode_ms_per_token") or 0.0 for r in rows]
        err = [max(0.0, (r.get("decode_p90_ms_per_token") or v) - v) for r, v in zip(rows, vals)]
        x = range(len(rows))
        ax.bar(x, vals, yerr=[[0.0] * len(err), err], capsize=3, label="decode, median (whisker: p90)",
               color=[PEER_COLORS.get(r["mode"], "#1f77b4") for r in rows])
        fl = floors[preset]
        ax.axhline(fl["floor_ms"], color="black", linestyle="--", linewidth=1,
                   label=f"bandwidth floor {fl['floor_ms']:.3f} ms ({fl['param_bytes'] / 1e9:.2f} GB at "
                         f"{fl['bandwidth_B_per_s'] / 1e12:.1f} TB/s)")
        for i, v in zip(x, vals):  # each bar's value, and how far above the floor it is
            if v > 0:
                ax.annotate(f"{v:.2f} ms\n{v / fl['floor_ms']:.1f}× floor", (i, v), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=7)
        ax.set_yscale("log")  # generate's eager step is ~100x the floor, the engines' a few times it
        ax.set_ylim(fl["floor_ms"] / 2, max(vals + [fl["floor_ms"]]) * 4)
        ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per decode token (one request, log scale)")
        ax.set_title(preset, fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
    set_title(fig, title or f"Decode per token against the bandwidth floor: {run_title(result)}")
    return fig
