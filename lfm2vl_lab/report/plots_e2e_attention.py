"""Figures of the end-to-end file (``python -m lfm2vl_lab e2e``) and the attention probe
(``python -m lfm2vl_lab attention``); :mod:`lfm2vl_lab.report.plots` re-exports both, which is where
notebooks import them from.

* :func:`e2e_figure`       — time to first token, transformers' image path vs the graphed encoder
* :func:`attention_figure` — attention per layer inside CUDA graphs, per backend, on a log axis
"""

from __future__ import annotations

from itertools import groupby

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from .plots_common import MODE_COLORS, NoData, one_per, page_width, set_title

E2E_MODES = ("hf-eager", "lab-graph", "lab-eager")  # transformers' image path, the graphed encoder (or its eager run)


def _e2e_lab_mode(rows: list[dict]) -> str:
    # the graphed encoder's rows say "lab-eager" where nothing was captured (e2e on a CPU)
    return "lab-graph" if any(r["mode"] == "lab-graph" for r in rows) else "lab-eager"


def _darker(color: str, by: float = 0.55) -> tuple:
    return tuple(by * c for c in to_rgb(color))


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
            ax.bar(x, r["encoder_ms"], 0.36, color=_darker(color), label=f"{mode}: its encoder part" if first else None)
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
        xs, ys = [], []
        for j, k in enumerate(keys):
            r = by.get((*k, mode))
            if r is not None:
                xs.append(j + (i - 0.5) * 0.38)
                ys.append(100 * r.get("encoder_share_of_ttft", r["encoder_ms"] / r["ttft_ms"]))
        bars = ax.bar(xs, ys, 0.36, color=MODE_COLORS.get(mode), label=mode)
        ax.bar_label(bars, fmt="%.0f%%", fontsize=7, padding=1)
    ax.margins(y=0.15)  # room for the labels
    ax.set_ylabel("encoder share of TTFT (%)")
    ax.legend(fontsize=8)


def e2e_figure(rows: list[dict], title: str | None = None, share: bool = False) -> Figure:
    """Time to first token per (preset, image, requests): transformers' image path vs the graphed
    encoder, with the encoder's own time drawn inside each bar and the TTFT change labelled.
    ``share=True`` adds a panel below with the encoder's share of TTFT per mode. ``rows``: one run's
    (two rows for one bar raise :class:`~lfm2vl_lab.report.plots.MixedRuns`)."""
    rows = [r for r in rows if r.get("ttft_ms") is not None and r.get("mode") in E2E_MODES]
    if not rows:
        raise NoData("e2e_figure: no end-to-end rows (python -m lfm2vl_lab e2e on a GPU)")
    rows = one_per(rows, lambda r: (r["preset"], r["image"], r["requests"], r["mode"]), "e2e_figure")
    keys = list(dict.fromkeys((r["preset"], r["image"], r["requests"]) for r in rows))
    by = {(r["preset"], r["image"], r["requests"], r["mode"]): r for r in rows}
    lab = _e2e_lab_mode(rows)
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
    """Attention time per layer inside a CUDA graph, per backend and packed layout (attention probe),
    one panel per preset. The axis is logarithmic (``log``), because one slow backend is tens of times
    the others; layouts are written short (``2×1024+576+64`` rows). Backends that produced no time
    (an error on every layout) are named under the panels."""
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
