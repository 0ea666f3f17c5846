"""Figures from benchmark results (the JSON that :mod:`lfm2vl_lab.tools.bench` writes).

Every figure function takes plain data (result rows, timelines, capture-info rows) and returns a
``matplotlib.figure.Figure``. Figures are built without ``pyplot``, so nothing depends on a GUI
backend or global state (safe on headless machines and in tests); in a notebook a returned Figure
displays itself. :func:`lfm2vl_lab.tools.report.report` regenerates every figure the stored
results have data for.

* :func:`latency_figure`      — median latency per mode, bars grouped by workload (p90 whisker)
* :func:`speedup_figure`      — speedup over hf-eager vs number of images (``NxS`` workloads)
* :func:`floor_share_figure`  — median split into GPU-busy floor and everything else
* :func:`timeline_figure`     — CPU launch lane vs GPU kernel lane, eager vs graph
* :func:`padding_waste_figure`— padded / real tokens per budget set
* :func:`graph_memory_figure` — graph memory and capture time per budget
* :func:`e2e_figure`          — time to first token, transformers' image path vs the graphed encoder
* :func:`attention_figure`    — attention per layer inside CUDA graphs, per backend
"""

from __future__ import annotations

from collections import OrderedDict

from matplotlib.figure import Figure

from ..core.encoder import FUSE_ELEMENTWISE, FUSE_QKV
from ..core.graphs import DENSE_GRAPHS
from .workloads import NXS

MODE_ORDER = ("hf-eager", "compile", "lab-eager", "lab-graph", "lab-graph-fused")
MODE_COLORS = {"hf-eager": "#7f7f7f", "compile": "#9467bd", "lab-eager": "#1f77b4", "lab-graph": "#2ca02c",
               "lab-graph-fused": "#d62728"}
DEFAULT_GRAPH_CONFIG = ("auto", "safe", "tight")  # preferred (budget_set, cu_rule, max_seqlen_mode) in figures
DEFAULT_LAB_OPTIONS = (None, "auto", "varlen")  # attention backends that count as the default
# The kit's kernel options and their defaults; a row without the key ran before the option existed (off)
KERNEL_OPTIONS = {"fuse_qkv": FUSE_QKV, "fuse_elementwise": FUSE_ELEMENTWISE, "dense_graphs": DENSE_GRAPHS}


class NoData(ValueError):
    """A figure has no data to draw (``report`` skips it and prints the reason)."""


def _mode_key(mode: str) -> tuple:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _config(r: dict) -> tuple:
    return (r.get("budget_set"), r.get("cu_rule"), r.get("max_seqlen_mode"))


def is_default_config(row: dict, ignore=()) -> bool:
    """Whether a result row ran the kit's default configuration: for graph rows the automatic
    budgets, the safe ``cu_seqlens`` rule and tight ``max_seqlen`` (``DEFAULT_GRAPH_CONFIG``); a
    default attention backend (``DEFAULT_LAB_OPTIONS``); and, for the lab modes, each of
    ``KERNEL_OPTIONS`` at its default (``dense_graphs`` for ``lab-graph`` only). ``ignore`` names
    kernel options not to compare (for files recorded before and after a default changed)."""
    graph_ok = row.get("budget_set") is None or _config(row) == DEFAULT_GRAPH_CONFIG
    lab = row.get("mode") in ("lab-eager", "lab-graph", "lab-graph-fused")
    opts_ok = not lab or all(bool(row.get(k, False)) == v for k, v in KERNEL_OPTIONS.items()
                             if k not in ignore and (k != "dense_graphs" or row.get("mode") == "lab-graph"))
    return graph_ok and opts_ok and row.get("attention") in DEFAULT_LAB_OPTIONS


def pick_rows(rows: list[dict]) -> list[dict]:
    """One row per (mode, workload): prefer the default config (:func:`is_default_config`), then a
    profiled row (it has the GPU-busy floor and a timeline), then the newest (rows come oldest first)."""
    best: dict = OrderedDict()
    for r in rows:
        if r.get("median_ms") is None:
            continue
        key = (r.get("mode"), r.get("workload"))
        rank = (is_default_config(r), r.get("gpu_busy_ms") is not None)
        cur = best.get(key)
        if cur is None or rank >= cur[0]:
            best[key] = (rank, r)
    return [r for _, r in best.values()]


def count_nxs_workloads(rows: list[dict]) -> int:
    """How many distinct ``NxS`` workloads (N images of S px) the rows have: :func:`speedup_figure`
    draws a line over them, so it needs at least two."""
    return len({r["workload"] for r in rows if NXS.fullmatch(str(r.get("workload")))})


def _workloads(rows) -> list[str]:
    return list(dict.fromkeys(r["workload"] for r in rows))


def _modes(rows) -> list[str]:
    return sorted({r["mode"] for r in rows}, key=_mode_key)


def _title(fig: Figure, title: str | None) -> None:
    if title:
        fig.suptitle(title, fontsize=10)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def latency_figure(rows: list[dict], title: str | None = None, log: bool = False) -> Figure:
    """Median latency (ms) per mode, bars grouped by workload; the whisker reaches p90."""
    rows = pick_rows(rows)
    if not rows:
        raise NoData("latency_figure: no rows with median_ms")
    workloads, modes = _workloads(rows), _modes(rows)
    by = {(r["mode"], r["workload"]): r for r in rows}
    fig = Figure(figsize=(max(6, 1.6 * len(workloads) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs, ys, errs = [], [], []
        for j, w in enumerate(workloads):
            r = by.get((mode, w))
            if r is None:
                continue
            xs.append(j + (i - (len(modes) - 1) / 2) * width)
            ys.append(r["median_ms"])
            errs.append(max(0.0, (r.get("p90_ms") or r["median_ms"]) - r["median_ms"]))
        bars = ax.bar(xs, ys, width, yerr=[[0] * len(errs), errs], label=mode, color=MODE_COLORS.get(mode), capsize=2)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("median latency per call (ms)")
    ax.set_xlabel("workload")
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8, ncols=min(len(modes), 5))
    _title(fig, title or "Encoder latency per mode (whisker: p90)")
    return fig


def speedup_figure(rows: list[dict], side: int | None = None, title: str | None = None) -> Figure:
    """Speedup over hf-eager against the number of images, for the ``NxS`` workloads of one side
    ``S`` (default: the side with the most image counts)."""
    rows = [r for r in pick_rows(rows) if r.get("speedup_vs_hf") and NXS.fullmatch(str(r.get("workload")))]
    if side is None:
        sides: dict[int, set] = {}
        for r in rows:
            n, s = map(int, NXS.fullmatch(r["workload"]).groups())
            sides.setdefault(s, set()).add(n)
        if not sides:
            raise NoData("speedup_figure: no NxS rows with speedup_vs_hf")
        side = max(sides, key=lambda s: len(sides[s]))
    rows = [r for r in rows if int(NXS.fullmatch(r["workload"])[2]) == side and r["mode"] != "hf-eager"]
    if not rows:
        raise NoData(f"speedup_figure: no rows for {side} px images")
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for mode in _modes(rows):
        pts = sorted((int(NXS.fullmatch(r["workload"])[1]), r["speedup_vs_hf"]) for r in rows if r["mode"] == mode)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode, color=MODE_COLORS.get(mode))
    ax.axhline(1.0, color=MODE_COLORS["hf-eager"], ls="--", lw=1, label="hf-eager")
    ax.set_xscale("log", base=2)
    ns = sorted({int(NXS.fullmatch(r["workload"])[1]) for r in rows})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel(f"images per call ({side}×{side} px)")
    ax.set_ylabel("speedup over hf-eager (×)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    _title(fig, title or "Speedup over transformers' eager path vs batch size")
    return fig


def floor_share_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Each median split into the GPU-busy floor (kernels running) and the rest (host overhead,
    launch gaps, syncs); the label is busy / median, i.e. how close the call runs to its floor."""
    rows = [r for r in pick_rows(rows) if r.get("gpu_busy_ms")]
    if not rows:
        raise NoData("floor_share_figure: no rows with gpu_busy_ms (run bench with --profile on a GPU)")
    order = _workloads(rows)
    rows.sort(key=lambda r: (order.index(r["workload"]), _mode_key(r["mode"])))
    labels = [f"{r['workload']}  {r['mode']}" for r in rows]
    busy = [min(r["gpu_busy_ms"], r["median_ms"]) for r in rows]
    rest = [max(0.0, r["median_ms"] - b) for r, b in zip(rows, busy, strict=True)]
    fig = Figure(figsize=(7, 0.35 * len(rows) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    y = range(len(rows))
    ax.barh(y, busy, color=[MODE_COLORS.get(r["mode"], "C0") for r in rows])
    ax.barh(y, rest, left=busy, color="#dddddd")
    for i, r in enumerate(rows):
        ax.text(r["median_ms"], i, f" {100 * busy[i] / r['median_ms']:.0f}% busy", va="center", fontsize=7)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.18 * max(r["median_ms"] for r in rows))  # room for the labels
    ax.set_xlabel("ms per call (coloured: GPU busy = the floor; grey: host overhead, launch gaps, syncs)")
    _title(fig, title or "Share of each call spent at the GPU-busy floor")
    return fig


def timeline_figure(timelines: dict, title: str | None = None, max_us: float | None = None) -> Figure:
    """One panel per timeline (e.g. ``{"lab-eager": tl, "lab-graph": tl}``): a CPU lane (CUDA API
    calls: launches orange, others such as syncs grey) above a GPU lane (kernels and copies), on
    a shared µs axis so the panels compare directly.

    A timeline is ``{"cpu": [(start_us, dur_us, name)], "gpu": [...]}`` as in
    :class:`profiling.ProfileReport`.
    """
    if not timelines:
        raise NoData("timeline_figure: no timelines")
    fig = Figure(figsize=(9, 1.5 * len(timelines) + 0.8), layout="constrained")
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False)[:, 0]
    end = 0.0
    from .profiling import LAUNCH_PREFIXES

    for ax, (label, tl) in zip(axes, timelines.items(), strict=True):
        for lane, y in (("cpu", 1), ("gpu", 0)):
            events = tl.get(lane, [])
            spans = [(float(s), max(float(d), 0.05)) for s, d, *_ in events]
            if lane == "gpu":
                colors = ["#2ca02c"] * len(events)
            else:  # launch calls orange; other API calls (syncs, queries) grey
                names = [str(e[2] if len(e) > 2 else "") for e in events]
                colors = ["#ff7f0e" if n.startswith(LAUNCH_PREFIXES) else "#999999" for n in names]
            ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=colors, lw=0)
            end = max([end] + [s + d for s, d in spans])
        n_launch, n_kernel = len(tl.get("cpu", [])), len(tl.get("gpu", []))
        ax.set_yticks([0, 1], [f"GPU ({n_kernel})", f"CPU ({n_launch})"], fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1].set_xlim(0, max_us or end * 1.02 or 1)
    axes[-1].set_xlabel("µs from the first event of the call")
    _title(fig, title or "One call: CPU launch calls vs GPU kernels")
    return fig


def padding_waste_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Padded tokens / real tokens of graph replays per budget set (bars grouped by workload);
    the hit rate is printed on each bar."""
    rows = [r for r in rows if r.get("padding_waste") is not None and r.get("budget_set") is not None]
    if not rows:
        raise NoData("padding_waste_figure: no graph rows with padding_waste")
    if any(r["workload"] == "stream" for r in rows):  # the mixed stream is what budgets are chosen for
        rows = [r for r in rows if r["workload"] == "stream"]
    last = OrderedDict(((r["mode"], r["workload"], r["budget_set"]), r) for r in rows)
    rows = list(last.values())
    sets = list(dict.fromkeys(r["budget_set"] for r in rows))
    series = list(dict.fromkeys((r["mode"], r["workload"]) for r in rows))
    fig = Figure(figsize=(max(6, 1.4 * len(sets) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (mode, w) in enumerate(series):
        pts = [(sets.index(r["budget_set"]), r) for r in rows if (r["mode"], r["workload"]) == (mode, w)]
        xs = [j + (i - (len(series) - 1) / 2) * width for j, _ in pts]
        bars = ax.bar(xs, [100 * r["padding_waste"] for _, r in pts], width, label=f"{mode} · {w}")
        if len(series) <= 3:  # more labels than that overlap
            hits = [f"hit {100 * r['hit_rate']:.0f}%" if r.get("hit_rate") is not None else "" for _, r in pts]
            ax.bar_label(bars, labels=hits, fontsize=7, padding=1)
    ax.set_xticks(range(len(sets)), sets, fontsize=8)
    ax.set_xlabel("budget set (output tokens per graph)")
    ax.set_ylabel("padding waste (% of real tokens)")
    ax.legend(fontsize=8)
    _title(fig, title or "Padding waste per budget set")
    return fig


def graph_memory_figure(capture_info, title: str | None = None) -> Figure:
    """What each budget's graphs hold (MiB, stacked: its growth of the shared graph pool, then its
    persistent buffers) and capture time, from :func:`lfm2vl_lab.tools.meter.measured_capture` rows;
    pass a list, or ``{label: rows}`` for several runs. The bars add up to ``graph_memory(rows)["total_mb"]``.
    Rows recorded in the old format (a reserved-memory delta per capture, which could be negative)
    carry no pool/buffer split and are refused rather than drawn."""
    groups = capture_info if isinstance(capture_info, dict) else {"graphs": capture_info}
    groups = {k: v for k, v in groups.items() if v and all("pool_mb" in r for r in v)}
    if not groups:
        raise NoData("graph_memory_figure: no capture_info rows with pool_mb/buffers_mb")
    budgets = sorted({int(r["budget"]) for rows in groups.values() for r in rows})
    fig = Figure(figsize=(max(6, 0.9 * len(budgets) * len(groups) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    width = 0.8 / len(groups)
    for i, (label, rows) in enumerate(groups.items()):
        by = {int(r["budget"]): r for r in rows}
        xs = [budgets.index(b) + (i - (len(groups) - 1) / 2) * width for b in by]
        pool = [r["pool_mb"] for r in by.values()]
        total = sum(r["total_mb"] for r in by.values())
        ax.bar(xs, pool, width, label=f"{label}: graph pool", alpha=0.85)
        ax.bar(xs, [r["buffers_mb"] for r in by.values()], width, bottom=pool,
               label=f"{label}: buffers (all budgets together: {total:.0f} MiB)", alpha=0.6)
        ax2.plot(xs, [r.get("capture_s", 0) for r in by.values()], "kx", ms=6)
    ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
    ax.set_xlabel("budget (output tokens), captured largest first: smaller ones reuse the pool's blocks")
    ax.set_ylabel("memory held (MiB)")
    ax2.set_ylabel("capture time (s, × markers)")
    ax2.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    _title(fig, title or "Graph memory and capture time per budget")
    return fig


E2E_MODES = ("hf-eager", "lab-graph", "lab-eager")  # transformers' image path, the graphed encoder (or its eager run)


def _e2e_lab_mode(rows: list[dict]) -> str:
    # the graphed encoder's rows say "lab-eager" where nothing was captured (e2e on a CPU)
    return "lab-graph" if any(r["mode"] == "lab-graph" for r in rows) else "lab-eager"


def _e2e_ttft_bars(ax, keys: list, by: dict, lab: str) -> None:
    """TTFT bars per mode, the encoder's part drawn inside, each labelled with its TTFT change."""
    for i, mode in enumerate(("hf-eager", lab)):
        for j, k in enumerate(keys):
            r = by.get((*k, mode))
            if r is None:
                continue
            x = j + (i - 0.5) * 0.38
            ax.bar(x, r["ttft_ms"], 0.36, color=MODE_COLORS.get(mode), label=mode if j == 0 else None)
            part = "encoder part" if (i, j) == (0, 0) else None
            ax.bar(x, r["encoder_ms"], 0.36, color="black", alpha=0.35, label=part)
            base = by.get((*k, "hf-eager"))
            note = f"{r['ttft_ms']:.1f}" if mode == "hf-eager" or base is None else \
                f"{r['ttft_ms']:.1f}\n({100 * (r['ttft_ms'] / base['ttft_ms'] - 1):+.0f}%)"
            ax.text(x, r["ttft_ms"], note, ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("time to first token (ms)")
    ax.legend(fontsize=8)


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
    ``share=True`` adds a panel below with the encoder's share of TTFT per mode."""
    rows = [r for r in rows if r.get("ttft_ms") is not None and r.get("mode") in E2E_MODES]
    if not rows:
        raise NoData("e2e_figure: no end-to-end rows (python -m lfm2vl_lab e2e on a GPU)")
    keys = list(dict.fromkeys((r["preset"], r["image"], r["requests"]) for r in rows))
    by = {(r["preset"], r["image"], r["requests"], r["mode"]): r for r in rows}
    lab = _e2e_lab_mode(rows)
    fig = Figure(figsize=(max(6, 1.3 * len(keys) + 2), 6.5 if share else 4), layout="constrained")
    if share:
        ax, ax_share = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
        _e2e_share_bars(ax_share, keys, by, lab)
    else:
        ax = ax_share = fig.add_subplot()
    _e2e_ttft_bars(ax, keys, by, lab)
    ax_share.set_xticks(range(len(keys)), [f"{p}\n{im} x{n}" for p, im, n in keys], fontsize=8)
    _title(fig, title or "Time to first token: transformers' image path vs the graphed encoder")
    return fig


def attention_figure(rows: list[dict], title: str | None = None) -> Figure:
    """Attention time per layer inside a CUDA graph, per backend and packed layout (attention probe)."""
    rows = [r for r in rows if r.get("graph_ms_per_layer") is not None]
    if not rows:
        raise NoData("attention_figure: no attention-probe rows (python -m lfm2vl_lab attention on a GPU)")
    cases = list(dict.fromkeys((r["preset"], tuple(r["layout"])) for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    by = {(r["preset"], tuple(r["layout"]), r["backend"]): r for r in rows}
    fig = Figure(figsize=(max(6, 1.4 * len(cases) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        xs, ys = [], []
        for j, c in enumerate(cases):
            r = by.get((*c, b))
            if r is not None:
                xs.append(j + (i - (len(backends) - 1) / 2) * width)
                ys.append(1000 * r["graph_ms_per_layer"])
        bars = ax.bar(xs, ys, width, label=b)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    ax.set_xticks(range(len(cases)), [f"{p}\n{'+'.join(map(str, lay))} rows" for p, lay in cases], fontsize=7)
    ax.set_ylabel("µs per layer (graph replay)")
    ax.legend(fontsize=8)
    _title(fig, title or "Capturable attention kernels, timed inside CUDA graphs")
    return fig
