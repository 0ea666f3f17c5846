"""How a ``vllm`` result reads, with the kit's ``pipeline`` file beside it (:func:`with_pipeline`): the
terminal's summary, the A/B as a DataFrame, the row lookup the pages' tables share, and two figures."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..measure.vllm_ab import ARMS, CASES, TOKENS, case_name
from .plots import NoData, bars, figure, stack
from .ttft_summary import PR_CLAIM

ENGINES = {"vllm": "vLLM", "kit": "kit's pipeline"}
SIZES = ("lfm2-vl-450m", "lfm2-vl-1.6b", "lfm2-vl-3b")  # smallest model first


def rank(order, x) -> int:
    """Where ``x`` stands in ``order``, unknown values last."""
    return order.index(x) if x in order else len(order)


def find(result: dict, engine: str, preset: str, case: str, tokens: int, arm: str) -> dict | None:
    return next((r for r in result["rows"] if (r.get("engine"), r["preset"], r["case"], r["tokens"], r["arm"])
                 == (engine, preset, case, tokens, arm)), None)


def with_pipeline(vllm_res: dict | None, kit_res: dict | None) -> dict | None:
    """vLLM's A/B (role ``vllm``) with the kit's pipeline on the same cases (role ``pipeline``): both files'
    rows for the presets vLLM's file holds (the others named in ``kit_left_out``), ``files`` naming both.
    Each row's cuts are paired within its own file, never across them. None without a ``vllm`` file."""
    if vllm_res is None:
        return None
    out = {**vllm_res, "rows": list(vllm_res["rows"]), "files": [vllm_res]}
    out["settings"] = {"kit_repeats": 0, **vllm_res.get("settings", {})}
    out["presets"] = {p: dict(sec) for p, sec in vllm_res["presets"].items()}
    if kit_res is not None:
        out["rows"] += [r for r in kit_res["rows"] if r["preset"] in out["presets"]]
        # the kit's presets without a vLLM section yet: not set beside nothing, and named (kit_left_out)
        out["kit_left_out"] = sorted(set(kit_res["presets"]) - set(out["presets"]))
        out["settings"]["kit_repeats"] = kit_res["settings"]["repeats"]
        for p, sec in out["presets"].items():
            sec["kit_repeats"] = kit_res["presets"].get(p, {}).get("repeats", 0)
        out["files"].append(kit_res)
    return out


def ab_frame(res: dict) -> pd.DataFrame:
    """The A/B as a table: per preset, case, output length and engine, each arm's median TTFT and e2e ms and
    the graphed arms' paired cuts in % with their 95% interval; a repeated row counts as its first."""
    rows = {}
    for r in res["rows"]:
        key = (r["preset"], r["case"], r["tokens"], ENGINES.get(r.get("engine"), r.get("engine")))
        cells = rows.setdefault(key, {})
        if f"TTFT ms, {r['arm']}" in cells:
            continue
        cells[f"TTFT ms, {r['arm']}"], cells[f"e2e ms, {r['arm']}"] = r["ttft_ms"], r["e2e_ms"]
        for what in ("TTFT", "e2e"):
            c = r.get(f"{what.lower()}_cut")
            if c:
                cells[f"{what} cut %, {r['arm']}"] = 100 * c["cut"]
                cells[f"{what} cut 95%, {r['arm']}"] = f"{100 * c['ci'][0]:.1f} to {100 * c['ci'][1]:.1f}"
    cases, engines = [case_name(*c) for c in CASES], list(ENGINES.values())
    rows = dict(sorted(rows.items(), key=lambda kv: (rank(SIZES, kv[0][0]), rank(cases, kv[0][1]), kv[0][2],
                                                       rank(engines, kv[0][3]))))  # smallest first
    df = pd.DataFrame.from_dict(rows, orient="index").round(1)
    df.index.names = ["preset", "case", "tokens", "engine"]
    order = [f"{m}, {a}" for m in ("TTFT ms", "e2e ms") for a in ARMS] + \
        [f"{m}, {a}" for m in ("TTFT cut %", "TTFT cut 95%", "e2e cut %", "e2e cut 95%") for a in ARMS if a != "off"]
    return df[[c for c in order if c in df.columns]]


def parity_line(preset: str, sec: dict) -> str:
    """One line per preset: does each arm pass the kit's parity rule on the shared weights (vLLM's file:
    how far from float32, how many tokens on float32's path, whether the prompt ids are the kit's)."""
    bits = []
    for arm, cases in sec.get("parity", {}).items():
        if "logits_ok" in cases:  # the pipeline file: one case per key
            bits.append(f"{arm} {'ok' if cases['logits_ok'] else 'FAILED'}")
            continue
        ok, same = all(c["logits_ok"] for c in cases.values()), all(c["same_prompt_ids"] for c in cases.values())
        bits.append(f"{arm} {'ok' if ok else 'FAILED'} (logits {max(c['rel_err_vs_fp32'] for c in cases.values()):.1e} "
                    f"from float32, {min(c['as_fp32'] for c in cases.values())}+ tokens on float32's path"
                    f"{'' if same else ', prompt ids differ from the kit'})")
    return f"{preset} parity: " + "; ".join(bits)


def summary_lines(result: dict) -> list[str]:
    """The terminal's summary of a ``vllm`` or a ``pipeline`` result: per preset, start-up and parity;
    then the A/B as :func:`ab_frame` shows it (each arm's medians, the graphed arms' paired cuts), and
    the errors."""
    out = []
    for preset, sec in result["presets"].items():
        if "engines" in sec:
            out.append(f"{preset}: engines started in "
                       + ", ".join(f"{a} {e['start_s']:.0f} s" for a, e in sec["engines"].items()))
        out.append(parity_line(preset, sec))
    if result.get("rows"):
        out += ab_frame(result).to_string().splitlines()
    return out + [f"error: {e['error']}" for e in result.get("errors") or []]


ARM_LABELS = {"off": "encoder eager", "pr": "encoder graphs, PR config", "kit": "encoder graphs, kit config"}
SERIES = {("vllm", "pr"): ("vLLM, PR config", "#1f77b4"), ("vllm", "kit"): ("vLLM, kit config", "#aec7e8"),
          ("kit", "pr"): ("kit's pipeline, PR config", "#2ca02c"),
          ("kit", "kit"): ("kit's pipeline, kit config", "#98df8a")}
VLLM_PARTS = (("processor_ms", "processor (host)", "#e8e8e8"), ("queue_ms", "wait for a step", "#c5b0d5"),
              ("encoder_gpu_ms", "encoder (GPU stream)", "#2ca02c"),
              ("step_rest", "rest of vLLM's step: prefill, sampling", "#3b5b92"),
              ("rest_ms_composed", "frontend and pipe (composed)", "#ff7f0e"))
KIT_PARTS = (("processor", "processor (host)", "#e8e8e8"), ("h2d", "upload", "#8c564b"),
             ("encoder", "encoder (GPU stream)", "#2ca02c"), ("merge", "merge", "#bcbd22"),
             ("prefill", "prefill", "#1f77b4"), ("sample", "sampling", "#17becf"))
# A few paired intervals of six kit repeats reach far below zero (one disturbed round); the axis stops
# here so the medians stay readable, and a marker on the floor shows each interval that goes on.
Y_FLOOR = -50.0


def _presets(res: dict) -> list[str]:
    presets = list(res.get("presets", {}))
    if not presets or not res.get("rows"):
        raise NoData("no vLLM A/B in this file (python -m lfm2vl_lab vllm on a GPU with vLLM records it)")
    return presets


def _cut_bars(ax, df: pd.DataFrame, groups: list[str]) -> None:
    """One panel's cuts (``group``, ``series``, ``cut``, ``lo``, ``hi`` in %): bars with their interval,
    clipped at :data:`Y_FLOOR` (a median below it drawn to it, its whisker from there up), and a marker
    on the floor under each bar whose interval or median goes on below."""
    order = dict(index=groups, columns=[label for label, _ in SERIES.values() if label in set(df["series"])])
    cut, lo, hi = (df.pivot(index="group", columns="series", values=v).reindex(**order) for v in ("cut", "lo", "hi"))
    ys = cut.clip(lower=Y_FLOOR)
    bars(ax, ys, fmt=None, err=(ys - lo.clip(lower=Y_FLOOR), hi.clip(lower=Y_FLOOR) - ys),
         colors=dict(SERIES.values()))
    width = 0.8 / len(ys.columns)  # where bars() puts each bar
    below = [g + (i - (len(ys.columns) - 1) / 2) * width for i, col in enumerate(ys) for g, low in enumerate(lo[col])
             if low < Y_FLOOR]
    ax.plot(below, [Y_FLOOR + 2] * len(below), "v", color="#444444", ms=4,
            label=f"interval (or median) reaches below {Y_FLOOR:.0f}%")


def vllm_cuts_figure(res: dict, title: str | None = None) -> Figure:
    """The encoder graphs' TTFT and whole-request cuts (%) per preset, case and token count, a bar per
    :data:`SERIES` with its 95% interval; a bar or interval below :data:`Y_FLOOR` stops there, marked."""
    presets = _presets(res)
    groups = [(case_name(im, n), t) for im, n in CASES for t in TOKENS]
    fig, axes = figure(4.2 * len(presets), 7.2, title, rows=2, cols=len(presets), sharey="row")
    names = [f"{c}\n{t} tok" for c, t in groups]
    for k, ax in enumerate(axes):
        preset, row = presets[k % len(presets)], k // len(presets)
        key, what = (("ttft_cut", "TTFT"), ("e2e_cut", "whole request"))[row]
        if key == "e2e_cut":
            ax.axhspan(100 * PR_CLAIM[0], 100 * PR_CLAIM[1], color="#ffdd99", alpha=0.5,
                       label="the PR's claim: 10-20% (e2e, low batch)")
        df = pd.DataFrame([{"group": name, "series": SERIES[s][0], "cut": 100 * c["cut"], "lo": 100 * c["ci"][0],
                            "hi": 100 * c["ci"][1]} for s in SERIES for name, g in zip(names, groups)
                           if (r := find(res, s[0], preset, *g, s[1])) and (c := r.get(key))])
        if not df.empty:
            _cut_bars(ax, df, names)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylim(bottom=Y_FLOOR)
        ax.tick_params(labelleft=True)  # every panel keeps its own scale readable
        ax.set_title(f"{preset}: {what}", fontsize=10)
        ax.set_ylabel(f"{what} cut by encoder graphs (%)\n(whisker: 95% interval)" if k % len(presets) == 0 else "")
        ax.grid(axis="y", alpha=0.3)
    legend = {}  # label -> handle, over every panel (the floor's marker shows where something is below it)
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if len(getattr(h, "get_xdata", lambda: [1])()):
                legend.setdefault(lab, h)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncols=3, fontsize=8)
    return fig


def one_request(res: dict, preset: str) -> list[tuple[str, str, dict]]:
    """``(engine, arm, measures)`` of one 512 px request of ``preset``: vLLM's breakdown per arm (its
    own timestamps), then the kit's row per arm where it has phases."""
    vllm = res["presets"][preset].get("breakdown", {})
    kit = [(arm, find(res, "kit", preset, "1x512", TOKENS[0], arm)) for arm in ARMS]
    return ([("vllm", arm, vllm[f"{arm}/1x512"]) for arm in ARMS if vllm.get(f"{arm}/1x512")]
            + [("kit", arm, r) for arm, r in kit if r and r.get("phases_ms")])


def vllm_breakdown_figure(res: dict, title: str | None = None) -> Figure:
    """Per preset, one 512 px request as a stacked bar per engine and arm (vLLM's own timestamps, the
    kit's phases), each with its measured TTFT."""
    presets = _presets(res)
    fig, axes = figure(11, 1.9 + 2.3 * len(presets), title, rows=len(presets))
    seen: set = set()
    for ax, preset in zip(axes, presets):
        shown = one_request(res, preset)
        for y, (engine, _, m) in enumerate(shown):
            # vLLM's step from scheduling to the first token, less the encoder's part of it
            vals = dict(m, step_rest=(m.get("scheduled_to_first_ms") or 0) - (m.get("encoder_gpu_ms") or 0)) \
                if engine == "vllm" else m["phases_ms"]
            end = stack(ax, y, [(label, vals.get(key), color)
                                for key, label, color in (VLLM_PARTS if engine == "vllm" else KIT_PARTS)], seen)
            ax.text(end, y, f"  TTFT {m['ttft_ms']:.1f} ms", va="center", fontsize=8)
        ax.set_yticks(range(len(shown)), [f"{ENGINES[e]}, {ARM_LABELS[arm]}" for e, arm, _ in shown], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{preset}: one request, one 512 px image", fontsize=10)
        ax.set_xlabel("ms to the first token")
        ax.margins(x=0.15)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    return fig
