"""The parts read off one run of the encoder or of the first token: the README's tables of the encoder per
mode and of the four TTFT modes, and design.md's model changes under the graphs (the ``check`` file)."""

from __future__ import annotations

import pandas as pd

from ..measure.ttft import mode_name
from ..measure.workloads import NXS, TILED_SIZE
from .frames import missing, ms, need, part, pick_rows, preset_label, records, times, verdict
from .plots_ttft import TTFT_MODES, per_case, ttft_frame

ENCODER_MODES = {"hf-eager": "transformers", "compile": "`compile`", "lab-eager": "packed, eager",
                 "lab-graph": "lab-graph"}
BOTH_EAGER, BOTH_GRAPHED = mode_name("eager", "eager"), mode_name("graphed", "graphed")


def workload_label(workload: str, stream_n=None) -> str:
    """``1x512`` → ``one 512 px image``; ``tiled``, ``stream`` and ``NxS`` in words."""
    m = NXS.fullmatch(workload)
    if m:
        n, side = int(m.group(1)), m.group(2)
        return f"one {side} px image" if n == 1 else f"{n} images of {side} px"
    if workload == "tiled":
        return f"one {TILED_SIZE[0]}×{TILED_SIZE[1]} image (tiled)"
    return f"stream of {stream_n or '?'} mixed requests (median)" if workload == "stream" else workload


def by_mode(rows: list[dict]) -> dict:
    """``{(mode, workload): row}`` of the rows :func:`~.frames.pick_rows` picks, as every figure does."""
    return {(r.get("mode"), r.get("workload")): r for r in pick_rows(rows)}


def encoder_table(refs) -> list:
    """Per workload: each mode's median ms, in brackets its GPU-busy ms of one profiled call or, for a row
    timed request by request and not profiled (the stream), its p99; lab-graph's in bold, and its speedup."""
    res = refs("bench-450m")
    df = need(pd.json_normalize(list(by_mode(res["rows"]).values())), "gpu_busy_ms", "p99_ms")
    cell = df.median_ms.map(ms).where(df["mode"] != "lab-graph", "**" + df.median_ms.map(ms) + "**") + [
        f" ({ms(b)})" if not missing(b) else f" (p99 {ms(p)})" if not missing(p) else ""
        for b, p in zip(df.gpu_busy_ms, df.p99_ms)]
    order = dict(index=list(dict.fromkeys(df.workload)), columns=list(ENCODER_MODES))
    med, cells = (df.assign(cell=cell).pivot(index="workload", columns="mode", values=v).reindex(**order)
                  for v in ("median_ms", "cell"))
    prov = res["provenance"]
    out = pd.DataFrame({"workload": [workload_label(w, prov.get("stream_n")) for w in med.index],
                        "items": df.groupby("workload", sort=False).n_items.first().map(int).values})
    out[list(ENCODER_MODES.values())] = cells.values
    out["lab-graph vs transformers"] = (med["hf-eager"] / med["lab-graph"]).map(times).values
    return [f"{preset_label(prov.get('preset', '?'))}, {prov.get('dtype')}: median ms of {prov.get('repeats')} timed "
            f"calls after {prov.get('warmup')} warm-up calls per row (in brackets: GPU-busy ms of one profiled call; "
            "the stream's p99).", out]


def ttft_modes(refs) -> list:
    """One 512 px request per preset: TTFT in the four modes, decode per token both eager → both graphed."""
    res = refs("ttft")
    one = ttft_frame(res["rows"]).query("image == '1x512' and requests == 1")
    ttft, dec = per_case(one, "ttft_ms").map(ms), per_case(one, "decode_ms_per_token").map(ms)
    ttft[BOTH_GRAPHED] = "**" + ttft[BOTH_GRAPHED] + "**"
    out = pd.DataFrame({"preset": [preset_label(p) for p, *_ in ttft.index]})
    out[["**both graphed**" if m == BOTH_GRAPHED else m.replace("text-", "text ").replace("+encoder-", ", encoder ")
         for m in TTFT_MODES]] = ttft[list(TTFT_MODES)].values
    out["decode ms/token, both eager → both graphed"] = (dec[BOTH_EAGER] + " → " + dec[BOTH_GRAPHED]).values
    parity = [m for p in res.get("parity") or [] for m in p["modes"].values()]
    return [out, f"TTFT ms, median of {res['rows'][0].get('repeats')} paired rounds. Parity: "
            f"{sum(m['ok'] for m in parity)} of {len(parity)} mode × case checks pass."]


def model_changes(refs) -> list:
    """Per preset: graphs after the model changed under them, then what the stamp check and fused QKV cost."""
    moved = [(p["preset"], p["model_changes"]) for p in refs("check")["presets"] if p.get("model_changes")]
    if not moved:
        return "The reference set's check file has no model-change rows."
    changes = records([dict(c, preset=p) for p, m in moved for c in m["changes"]], {
        "preset": ("preset", preset_label), "change after capture": ("change", "`{}`".format),
        "recaptures": "recaptures", "rel. error vs float32 (transformers' own)":
        lambda c: f"{c['rel_err']:.2e} ({c['hf_rel_err']:.2e})",
        "verdict": ("pass", lambda ok: verdict(ok, "pass", "fail"))})
    costs = records([dict(m, preset=p) for p, m in moved], {
        "preset": ("preset", preset_label),
        "stamp check": lambda m: "every pointer, the kit's C++ check" if m.get("pointer_check") == "extension" else
        "every pointer, torch's function" if m.get("stamp_check") == "every pointer" else "a flag and one pointer",
        "tensors": "stamped_tensors", "µs per `encode`": ("encode_stamp_us", ms),
        "(torch's function)": ("pointer_checks.torch.encode_us", ms),
        "µs per text-engine call": ("engine_stamp_us", ms), "lock µs": ("serial_us", ms),
        **{f"{what} MiB": (f"fused_qkv.{key}", lambda v: ms(v, 1)) for what, key in (
            ("fusing q/k/v adds", "freed_mib"), ("separate q/k/v kept alive", "kept_mib"),
            ("q/k/v weights", "qkv_mib"))}})
    return [changes, costs]


BLOCKS = {"encoder-450m": part(("bench-450m",), encoder_table), "ttft-modes": part(("ttft",), ttft_modes),
          "model-changes": part(("check",), model_changes)}
