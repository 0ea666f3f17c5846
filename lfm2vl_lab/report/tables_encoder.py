"""The pages' parts about the encoder alone: each mode per workload, where one call's GPU time goes, the
kernel options, attention inside a graph, the sweeps and the PR's graph config, the correctness check,
and the caveats read off the same files."""

from __future__ import annotations

import pandas as pd

from ..measure.modes import ROW_NAMES, ROW_SETTINGS
from ..measure.workloads import NXS, TILED_SIZE
from .frames import Part, frame, missing, ms, need, pct, preset_label, records, span, times, verdict

ENCODER_MODES = {"hf-eager": "transformers", "compile": "`compile`", "lab-eager": "packed, eager",
                 "lab-graph": "lab-graph"}


def workload_label(workload: str, stream_n=None) -> str:
    """``1x512`` → ``one 512 px image``; ``tiled``, ``stream`` and ``NxS`` in words."""
    m = NXS.fullmatch(workload)
    if m:
        n, side = int(m.group(1)), m.group(2)
        return f"one {side} px image" if n == 1 else f"{n} images of {side} px"
    if workload == "tiled":
        return f"one {TILED_SIZE[0]}×{TILED_SIZE[1]} image (tiled)"
    return f"stream of {stream_n or '?'} mixed requests (median)" if workload == "stream" else workload


def medians(df) -> pd.DataFrame:
    """The rows of a bench frame with a median, one per (mode, workload) (the last, where a file repeats one)."""
    df = need(df, "mode", "workload", "median_ms", "gpu_busy_ms", "n_items", "capture_s", "graph_total_mb")
    return df[df.median_ms.notna()].drop_duplicates(["mode", "workload"], keep="last")


def by_mode(rows: list[dict]) -> dict:
    """``{(mode, workload): row}`` of the rows :func:`medians` keeps (those with a median, the last of a key)."""
    return {(r.get("mode"), r.get("workload")): r for r in rows if not missing(r.get("median_ms"))}


def grid(df, values: str = "median_ms", modes=None) -> pd.DataFrame:
    """``values`` of :func:`medians` rows, workloads (in recorded order) by mode."""
    return df.pivot(index="workload", columns="mode", values=values).reindex(
        index=list(dict.fromkeys(df.workload)), columns=modes)


def cells(df, bold: str | None = None) -> pd.Series:
    """Each row's median ms, in brackets its GPU-busy ms of one profiled call or, for a row timed request by
    request and not profiled (the stream), its p99; ``bold``: that mode's median."""
    med = df.median_ms.map(ms)
    med = med.where(df["mode"] != bold, "**" + med + "**")
    return med + [f" ({ms(b)})" if not missing(b) else f" (p99 {ms(p)})" if not missing(p) else ""
                  for b, p in zip(df.gpu_busy_ms, need(df, "p99_ms").p99_ms)]


def encoder_table(res: dict) -> pd.DataFrame:
    """Median ms per mode and workload (:func:`cells`), and lab-graph's speedup over transformers."""
    df, modes = medians(frame(res)), list(ENCODER_MODES)
    med = grid(df, modes=modes)
    out = pd.DataFrame({"workload": [workload_label(w, res["provenance"].get("stream_n")) for w in med.index],
                        "items": df.groupby("workload", sort=False).n_items.first().map(int).values})
    out[list(ENCODER_MODES.values())] = grid(df.assign(cell=cells(df, "lab-graph")), "cell", modes).values
    out["lab-graph vs transformers"] = (med["hf-eager"] / med["lab-graph"]).map(times).values
    return out


def bench_head(role: str, what: str):
    """The line before a bench's table: preset, dtype and how each cell was timed, from the file's provenance."""
    def head(refs) -> str:
        prov = refs(role)["provenance"]
        return f"{preset_label(prov.get('preset', '?'))}, {prov.get('dtype')}: " + what.format(**prov)
    return head


def encoder_part(role: str) -> Part:
    return Part((role,), lambda refs: encoder_table(refs(role)), head=bench_head(
        role, "median ms of {repeats} timed calls after {warmup} warm-up calls per row (in brackets: GPU-busy "
        "ms of one profiled call; the stream's p99)."))


def _budgets(row: dict) -> str:
    """A config's budgets, then any budget it captured beyond them (the run budget of :mod:`~..core.dense`)."""
    own = list(row.get("budgets") or [])
    extra = [c["budget"] for c in row.get("capture_info") or [] if c.get("budget") not in own]
    return ", ".join(map(str, own)) + "".join(f" + {b} (runs)" for b in sorted(extra))


def pr_config(refs) -> list:
    """One row per named config of a ``--graph-config`` bench file (what it captures, then its median per
    workload), then each "pr" median over the kit's; the settings both ran with are said once, below, so
    that the rows differ only in what the configs do."""
    res = refs("pr-config")
    df = need(frame(res), "graph_config", "padding_waste")
    df = df[(df["mode"] == "lab-graph") & df.graph_config.notna()]
    first = [res["rows"][i] for i in df.drop_duplicates("graph_config").index]
    med = df.pivot_table(index="graph_config", columns="workload", values="median_ms", aggfunc="last", sort=False)
    waste = df[df.workload == "stream"].groupby("graph_config").padding_waste.last()
    out = records(first, {
        "graph config": lambda r: f"`{r['graph_config']}`", "budgets": _budgets,
        "graphs": lambda r: sum(len(c.get("variants") or ()) for c in r.get("capture_info") or []),  # every variant
        "graphs MiB": lambda r: ms(r.get("graph_total_mb"), 0), "capture s": lambda r: ms(r.get("capture_s")),
        "stream padding waste": lambda r: pct(waste.get(r["graph_config"]))})
    out[[f"{w} ms" for w in med.columns]] = med.map(ms).reindex([r["graph_config"] for r in first]).values
    if {"kit", "pr"} <= set(med.index):
        out.loc[len(out)] = {"graph config": "`pr` ÷ `kit`",
                             **{f"{w} ms": times(v, 2) for w, v in (med.loc["pr"] / med.loc["kit"]).items()}}
    keys = [ROW_NAMES.get(k, k) for k in ROW_SETTINGS if k != "budgets"]
    same = {k: first[0].get(k) for k in keys if len({str(r.get(k)) for r in first}) == 1}
    return [out, "Both ran with " + ", ".join(f"{k}={v}" for k, v in same.items()) + "."]


def check(refs) -> pd.DataFrame:
    """Per preset: the ``check`` file's verdicts, one column per check."""
    rows, sci = [], "{:.2e}".format
    for p in refs("check")["presets"]:
        par, replays = p["parity"], [g for g in p["graphs"] if "budget" in g]
        alias = [g for g in p["graphs"] if "aliasing_ok" in g]
        oversize = next((g["pass"] for g in p["graphs"] if g.get("check") == "oversize_fallback"), None)
        rows.append([preset_label(p["preset"]), p["attention"],
                     f"{sum(c['pass'] for c in par)} of {len(par)}; rel. error vs float32 "
                     f"{span([c['rel_err'] for c in par], sci)} (transformers' own "
                     f"{span([c['hf_rel_err'] for c in par], sci)})",
                     "pass" if p["sync"]["pass"] else f"**fail** ({p['sync'].get('error')})",
                     f"{sum(g['pass'] for g in replays)} of {len(replays)} pass, "
                     f"{sum(g['rel_err'] == 0 for g in replays)} bit-identical, {sum(g['nan'] for g in replays)} NaN",
                     f"{sum(g['aliasing_ok'] and not g['shares_graph_storage'] for g in alias)} of {len(alias)}",
                     verdict(oversize, "pass", "fail"), verdict(p["pass"], "**pass**", "fail")])
    return pd.DataFrame(rows, dtype=object, columns=[
        "preset", "attention", "parity cases", "no host sync", "replay vs eager (every budget, both rules, both "
        "max_seqlen modes)", "results not aliased", "oversize fallback", "verdict"])


def model_changes(refs) -> list:
    """Per preset: graphs after the model changed under them, then what the stamp check and fused QKV cost."""
    moved = [(p["preset"], p["model_changes"]) for p in refs("check")["presets"] if p.get("model_changes")]
    if not moved:
        return "The reference set's check file has no model-change rows."

    def mib(v) -> str:
        return ms(v, 1)
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
        "fusing q/k/v adds MiB": ("fused_qkv.freed_mib", mib),
        "separate q/k/v kept alive MiB": ("fused_qkv.kept_mib", mib),
        "q/k/v weights MiB": ("fused_qkv.qkv_mib", mib)})
    return [changes, costs]


BLOCKS = {"encoder-450m": encoder_part("bench-450m"), "encoder-1.6b": encoder_part("bench-1.6b"),
          "pr-config": Part(("pr-config",), pr_config, head=bench_head(
              "pr-config", "lab-graph median ms of {repeats} timed calls per row, a stream of {stream_n} requests."),
              missing="This reference set has no `pr-config` file: `python -m lfm2vl_lab record` on the GPU "
              "records it."),
          "check": Part(("check",), check), "model-changes": Part(("check",), model_changes)}
