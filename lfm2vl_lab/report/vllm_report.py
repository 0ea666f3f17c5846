"""How a ``vllm`` result reads, with the kit's ``pipeline`` file beside it (:func:`with_pipeline`): the A/B
as a DataFrame (what the terminal prints, :func:`summary_lines`, and notebook 07 shows), the row lookup
the pages' tables share, and one request's breakdown as a figure."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..measure.vllm_ab import ARMS, CASES, TOKENS, case_name
from .plots import NoData, figure, rank, stacks

ENGINES = {"vllm": "vLLM", "kit": "kit's pipeline"}
SIZES = ("lfm2-vl-450m", "lfm2-vl-1.6b", "lfm2-vl-3b")  # smallest model first


def find(result: dict, engine: str, preset: str, case: str, tokens: int, arm: str) -> dict | None:
    return next((r for r in result["rows"] if (r.get("engine"), r["preset"], r["case"], r["tokens"], r["arm"])
                 == (engine, preset, case, tokens, arm)), None)


def with_pipeline(vllm_res: dict | None, kit_res: dict | None) -> dict | None:
    """vLLM's A/B (role ``vllm``) with the kit's pipeline on the same cases (role ``pipeline``): both files'
    rows for the presets vLLM's file holds (the others named in ``kit_left_out``), ``files`` naming both.
    Each row's cuts are paired within its own file, never across them. None without a ``vllm`` file."""
    if vllm_res is None:
        return None
    out = {**vllm_res, "rows": list(vllm_res["rows"]), "files": [vllm_res],
           "settings": {"kit_repeats": 0, **vllm_res.get("settings", {})},
           "presets": {p: dict(sec) for p, sec in vllm_res["presets"].items()}}
    if kit_res is not None:
        out["rows"] += [r for r in kit_res["rows"] if r["preset"] in out["presets"]]
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


def summary_lines(result: dict) -> list[str]:
    """What the ``vllm`` and ``pipeline`` commands print at the end: the A/B as :func:`ab_frame` shows it
    (their errors were printed as they happened)."""
    return ab_frame(result).to_string().splitlines() if result.get("rows") else ["no A/B rows recorded"]


ARM_LABELS = {"off": "encoder eager", "pr": "encoder graphs, PR config", "kit": "encoder graphs, kit config"}
PARTS = {"vllm": (("processor_ms", "processor (host)", "#e8e8e8"), ("queue_ms", "wait for a step", "#c5b0d5"),
                  ("encoder_gpu_ms", "encoder (GPU stream)", "#2ca02c"),
                  ("step_rest", "rest of vLLM's step: prefill, sampling", "#3b5b92"),
                  ("rest_ms_composed", "frontend and pipe (composed)", "#ff7f0e")),
         "kit": (("processor", "processor (host)", "#e8e8e8"), ("h2d", "upload", "#8c564b"),
                 ("encoder", "encoder (GPU stream)", "#2ca02c"), ("merge", "merge", "#bcbd22"),
                 ("prefill", "prefill", "#1f77b4"), ("sample", "sampling", "#17becf"))}


def vllm_breakdown_figure(res: dict, title: str | None = None) -> Figure:
    """Per preset, one 512 px request as a stacked bar per engine and arm (vLLM's own timestamps, the
    kit's phases), each with its measured TTFT."""
    presets = list(res.get("presets", {}))
    if not presets or not res.get("rows"):
        raise NoData("no vLLM A/B in this file (python -m lfm2vl_lab vllm on a GPU with vLLM records it)")
    fig, axes = figure(11, 1.9 + 2.3 * len(presets), title, rows=len(presets))
    seen: set = set()
    for ax, preset in zip(axes, presets):
        bars, vllm = [], res["presets"][preset].get("breakdown", {})
        kit = [(arm, find(res, "kit", preset, "1x512", TOKENS[0], arm)) for arm in ARMS]
        # one 512 px request per arm: vLLM's own timestamps, then the kit's row where it has phases
        for engine, arm, m in ([("vllm", arm, vllm[f"{arm}/1x512"]) for arm in ARMS if vllm.get(f"{arm}/1x512")]
                               + [("kit", arm, r) for arm, r in kit if r and r.get("phases_ms")]):
            # vLLM's step from scheduling to the first token, less the encoder's part of it
            vals = dict(m, step_rest=(m.get("scheduled_to_first_ms") or 0) - (m.get("encoder_gpu_ms") or 0)) \
                if engine == "vllm" else m["phases_ms"]
            bars.append((f"{ENGINES[engine]}, {ARM_LABELS[arm]}", [(label, vals.get(key), color)
                         for key, label, color in PARTS[engine]], f"  TTFT {m['ttft_ms']:.1f} ms"))
        stacks(ax, bars, seen, room=1.3)
        ax.set_title(f"{preset}: one request, one 512 px image", fontsize=9, loc="left")
    axes[-1].set_xlabel("ms to the first token")
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    return fig
