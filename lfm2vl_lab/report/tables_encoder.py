"""The pages' parts about the encoder alone: modes per workload, kernels, options, attention, sweeps,
the correctness check and the caveats read off the same files."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from ..measure.floor import kernel_breakdown
from ..measure.workloads import NXS, TILED_SIZE
from .frames import KERNEL_OPTIONS, Refs, frame, md, missing, ms, need, pct, preset_label, span, table, times, verdict

ENCODER_MODES = (("hf-eager", "transformers"), ("compile", "`compile`"), ("lab-eager", "packed, eager"),
                 ("lab-graph", "lab-graph"))
# The archived run the caveat on host-bound modes compares with (the same bench command, run earlier).
EARLIER_BENCH = "floor-20261201-015028.json"
# What a result file records of the machine and libraries it ran on, compared field by field.
MACHINE_FIELDS = (("gpu", "GPU"), ("platform", "platform"), ("host_cpu", "CPU"), ("cpu_count", "CPU count"),
                  ("torch", "torch"), ("cuda", "CUDA"), ("transformers", "transformers"), ("python", "Python"))
DEFAULT_GRAPH = ("budget_set", "cu_rule", "max_seqlen_mode", "attention", *KERNEL_OPTIONS)


def workload_label(workload: str, stream_n=None) -> str:
    """``1x512`` → ``one 512 px image``; ``tiled``, ``stream`` and ``NxS`` in words."""
    m = NXS.fullmatch(workload)
    if m:
        n, side = int(m.group(1)), m.group(2)
        return f"one {side} px image" if n == 1 else f"{n} images of {side} px"
    if workload == "tiled":
        return f"one {TILED_SIZE[0]}×{TILED_SIZE[1]} image (tiled)"
    if workload == "stream":
        return f"stream of {stream_n or '?'} mixed requests (median)"
    return workload


def medians(df) -> pd.DataFrame:
    """The rows of a bench frame with a median, one per (mode, workload) (the last, where a file repeats one)."""
    df = need(df, "mode", "workload", "median_ms", "gpu_busy_ms", "n_items", "p99_ms", "max_ms", "capture_s",
              "graph_total_mb")
    return df[df.median_ms.notna()].drop_duplicates(["mode", "workload"], keep="last")


def by_mode(rows: list[dict]) -> dict:
    """``{(mode, workload): row}`` of the rows :func:`medians` keeps (those with a median, the last of a key)."""
    return {(r.get("mode"), r.get("workload")): r for r in rows if not missing(r.get("median_ms"))}


def grid(df, values: str = "median_ms", modes=None) -> pd.DataFrame:
    """``values`` of :func:`medians` rows, workloads (in recorded order) by mode."""
    ws = list(dict.fromkeys(df.workload))
    return df.pivot(index="workload", columns="mode", values=values).reindex(index=ws, columns=modes)


def cells(df, bold: str | None = None) -> pd.Series:
    """Each row's median ms, its GPU-busy ms of one profiled call in brackets; ``bold``: that mode's median."""
    med = df.median_ms.map(ms)
    med = med.where(df["mode"] != bold, "**" + med + "**")
    return med + df.gpu_busy_ms.map(lambda b: "" if missing(b) else f" ({ms(b)})")


def encoder_table(res: dict) -> str:
    """Median ms per mode and workload (:func:`cells`), and lab-graph's speedup over transformers."""
    df, modes = medians(frame(res)), [m for m, _ in ENCODER_MODES]
    med = grid(df, modes=modes)
    out = pd.DataFrame({"workload": [workload_label(w, res["provenance"].get("stream_n")) for w in med.index],
                        "items": df.groupby("workload", sort=False).n_items.first().map(int).values})
    out[[label for _, label in ENCODER_MODES]] = grid(df.assign(cell=cells(df, "lab-graph")), "cell", modes).values
    out["lab-graph vs transformers"] = (med["hf-eager"] / med["lab-graph"]).map(times).values
    return md(out)


def encoder_summary(res: dict) -> str:
    """What the table leaves out: the stream's p99 against compile's, and what lab-graph's graphs cost."""
    at = medians(frame(res)).set_index(["mode", "workload"])
    out = []
    if {("lab-graph", "stream"), ("compile", "stream")} <= set(at.index):
        gs, cs = at.loc[("lab-graph", "stream")], at.loc[("compile", "stream")]
        if not (missing(gs.p99_ms) or missing(cs.p99_ms)):
            out.append(f"Stream p99: lab-graph {ms(gs.p99_ms)} ms, compile {ms(cs.p99_ms)} ms (its slowest request "
                       f"{ms(cs.max_ms)} ms).")
    g = at.xs("lab-graph").capture_s.dropna() if "lab-graph" in at.index.get_level_values(0) else []
    if len(g):
        out.append(f"lab-graph's graphs: captured in {ms(g.iloc[0])} s, "
                   f"{at.xs('lab-graph').graph_total_mb.dropna().iloc[0]:.0f} MiB.")
    return " ".join(out)


def encoder_block(role: str):
    def block(refs: Refs) -> str:
        res = refs(role)
        prov = res["provenance"]
        head = (f"{preset_label(prov.get('preset', '?'))}, {prov.get('dtype')}: median ms of {prov.get('repeats')} "
                f"timed calls after {prov.get('warmup')} warm-up calls per row (GPU-busy ms of one profiled call).")
        return "\n\n".join([head, encoder_table(res), encoder_summary(res), refs.source(role)])
    return block


def configs(res: dict, keys: tuple) -> list[str]:
    """Each row's settings ``keys`` in words (``fuse_qkv=True, …``; a row without a key says None)."""
    return [", ".join(f"{k}={r.get(k)}" if isinstance(r.get(k), bool) else str(r.get(k)) for k in keys)
            for r in res["rows"]]


def with_options(df, on: dict) -> pd.DataFrame:
    """The rows of ``df`` whose kernel options are ``on``, the first per workload (index: the file's row)."""
    df = need(df, *on)
    return df[(df[list(on)] == pd.Series(on)).all(axis=1)].drop_duplicates("workload")


def kernel_classes_block(refs: Refs) -> str:
    """The kernel classes of one profiled 1x512 call: lab-graph, kernel options off and on, and transformers."""
    k, bench = refs.frame("kernels"), medians(refs.frame("bench-450m"))
    picked = {"lab-graph, options off": ("kernels", with_options(k, dict.fromkeys(KERNEL_OPTIONS, False))),
              "lab-graph, options on": ("kernels", with_options(k, dict.fromkeys(KERNEL_OPTIONS, True))),
              "transformers": ("bench-450m", bench[bench["mode"] == "hf-eager"])}
    parts = {label: kernel_breakdown(refs(role)["rows"][rows.index[rows.workload == "1x512"][0]])
             for label, (role, rows) in picked.items() if (rows.workload == "1x512").any()}
    classes = list(dict.fromkeys(c for p in parts.values() for c in p))
    count, us = (pd.DataFrame({label: {c: v[k] for c, v in p.items()} for label, p in parts.items()}).reindex(classes)
                 for k in ("count", "us"))
    out = count.map(lambda n: f"{n:.0f} · ", na_action="ignore") + us.map(lambda u: f"{u:.0f} µs")
    out.loc["**total**"] = "**" + count.sum().map("{:.0f} · ".format) + us.sum().map("{:.0f} µs**".format)
    memsets = ", ".join(f"{n:.0f} ({label})" for label, n in count.reindex(["memset"]).fillna(0).iloc[0].items())
    note = f"Entries of one profiled call (kernels, copies and memsets) · their µs. Memset entries: {memsets}."
    return "\n\n".join([md(out.rename_axis("class").reset_index()), note, refs.source("kernels", "bench-450m")])


def kernel_options_block(refs: Refs) -> str:
    """lab-graph median (GPU-busy) per workload with no kernel option, each one alone, and all three."""
    k = refs.frame("kernels", "gpu_busy_ms")
    combos = {"none": dict.fromkeys(KERNEL_OPTIONS, False),
              **{f"`{opt}` alone": {o: o == opt for o in KERNEL_OPTIONS} for opt in KERNEL_OPTIONS},
              "all three": dict.fromkeys(KERNEL_OPTIONS, True)}
    ws = list(dict.fromkeys(k.workload))
    rows = {label: with_options(k, on).set_index("workload").reindex(ws) for label, on in combos.items()}
    out = pd.DataFrame({"workload": [workload_label(w) for w in ws]})
    for label, r in rows.items():
        out[label] = cells(r.assign(mode=None)).values
    out["none / all three"] = (rows["none"].median_ms / rows["all three"].median_ms).map(lambda v: times(v, 2)).values
    return "\n\n".join(["lab-graph median ms (GPU-busy ms of one profiled call), LFM2-VL-450M.", md(out),
                        refs.source("kernels")])


def _layout(layout: tuple) -> str:
    if len(set(layout)) == 1:
        return f"{len(layout)} × {layout[0]} rows"
    return " + ".join(str(n) for n in layout) + " rows"


def attention_block(refs: Refs) -> str:
    """µs per layer of every capturable attention candidate inside a CUDA graph, failures kept."""
    df = refs.frame("attention", "error", "graph_ms_per_layer").assign(layout=lambda d: d.layout.map(tuple))
    df["cell"] = (1000 * df.graph_ms_per_layer).map("{:.1f}".format).where(df.error.isna(), "capture fails")
    case = ["preset", "heads", "head_dim", "layout"]
    t = df.drop_duplicates([*case, "backend"], keep="last").pivot(index=case, columns="backend", values="cell")
    t = t.reindex(index=pd.MultiIndex.from_frame(df[case].drop_duplicates()), columns=df.backend.unique())
    out = pd.DataFrame({"preset (heads × dim)": [f"{preset_label(p)} ({h} × {d})" for p, h, d, _ in t.index],
                        "layout": [_layout(lay) for *_, lay in t.index]})
    out[[f"`{b}`" for b in t.columns]] = t.values
    errors = sorted({e.split(":")[0] for e in df.error.dropna()})
    note = ("µs per layer inside a CUDA graph, bf16." + (f" The failed captures raise {', '.join(errors)}; the "
                                                        "file keeps each traceback." if errors else ""))
    return "\n\n".join([md(out), note, refs.source("attention")])


def sweep_table(res: dict, keys: tuple) -> str:
    """One row per configuration (``keys``): lab-graph's median per workload, the graphs' cost."""
    df = need(frame(res), "padding_waste").assign(config=configs(res, keys))
    mine = df.drop_duplicates(["config", "workload"], keep="last")
    ws, names = list(dict.fromkeys(df.workload)), list(dict.fromkeys(df.config))
    out = pd.DataFrame({" / ".join(keys): names})
    out[[f"{w} ms" for w in ws]] = mine.pivot(index="config", columns="workload", values="median_ms").reindex(
        index=names, columns=ws).map(ms).values
    if "stream" in ws:
        out["stream padding waste"] = mine[mine.workload == "stream"].set_index("config").padding_waste.reindex(
            names).map(pct).values
    first = mine.drop_duplicates("config").set_index("config").reindex(names)
    out["graphs MiB"] = first.graph_total_mb.map("{:.0f}".format).values
    out["capture s"] = first.capture_s.map(ms).values
    return md(out)


def sweeps_block(refs: Refs) -> str:
    out = []
    for role, keys in (("sweep-rules", ("cu_rule", "max_seqlen_mode")), ("sweep-budgets", ("budget_set",)),
                       ("sweep-attention", ("attention", "fuse_qkv"))):
        out += [f"**`{role}`**", sweep_table(refs(role), keys), refs.source(role)]
    return "\n\n".join(out)


def same_config_block(refs: Refs) -> str:
    """lab-graph at 1x512 in its default configuration, as each role that ran it measured it: the
    spread between separate processes of one run."""
    runs = {role: refs.frame(role).assign(config=configs(refs(role), DEFAULT_GRAPH)).query(
        "mode == 'lab-graph' and workload == '1x512'") for role in
        ("bench-450m", "kernels", "sweep-rules", "sweep-budgets", "sweep-attention")}
    key = runs["bench-450m"].dropna(subset=["median_ms"]).config.iloc[-1]
    found = {role: df.median_ms[df.config == key].iloc[0] for role, df in runs.items() if (df.config == key).any()}
    meds = list(found.values())
    return (f"lab-graph at one 512 px image in its default configuration was timed in {len(found)} processes of "
            f"the run: " + ", ".join(f"{ms(v, 3)} ms (`{role}`)" for role, v in found.items())
            + f". They span {pct(max(meds) / min(meds) - 1)} of the smallest; a difference of that size between "
            "two processes is not a finding.")


def code_of(prov: dict) -> str:
    """The kit's code a file was recorded with, as its provenance names it: a commit (``-dirty``: with
    uncommitted changes) or a hash of the package's source."""
    commit = prov.get("git_commit")
    if commit:
        return (f"commit `{commit[:7]}` with uncommitted changes" if commit.endswith("-dirty")
                else f"commit `{commit[:7]}`")
    return f"code `{str(prov.get('code_hash'))[:19]}…`" if prov.get("code_hash") else "code not recorded"


def machine_sentence(now: dict, then: dict) -> str:
    """Where two files' provenance differs (machine, libraries, the kit's code), what it shares, the hours between."""
    a, b = now["provenance"], then["provenance"]
    fields = [(label, a.get(k), b.get(k)) for k, label in MACHINE_FIELDS] + [("the kit's code", code_of(a), code_of(b))]
    hours = (datetime.fromisoformat(a["date"]) - datetime.fromisoformat(b["date"])).total_seconds() / 3600
    rows = [[label, x, y] for label, x, y in fields if x != y] + [["hours between the runs", f"{hours:.1f}", None]]
    same = ", ".join(f"{label} {x}" for label, x, y in fields if x == y and x is not None)
    return table(["differs", "this set", "earlier"], rows) + f"\n\nThe same in both: {same or 'nothing'}."


def machine_block(refs: Refs) -> str:
    """Each mode's median at a few workloads, this set against an earlier run of the same command, and
    what the two files record of machine and code: the host-bound modes move, the graphed one hardly."""
    now, then = refs("bench-450m"), refs.archived(EARLIER_BENCH)
    a, b = (grid(medians(frame(r))) for r in (now, then))
    ws, modes = [w for w in ("1x512", "tiled", "16x512", "stream") if w in a.index], [m for m, _ in ENCODER_MODES]
    a, b = (x.reindex(index=ws, columns=modes).T for x in (a, b))
    both = a.notna() & b.notna()
    out = (a.map(ms, na_action="ignore") + " vs " + b.map(ms, na_action="ignore") + " ("
           + (a / b).map(lambda v: times(v, 2), na_action="ignore") + ")").where(both)
    out.columns = [f"{w}: this set vs earlier" for w in ws]
    out.insert(0, "mode", [label for _, label in ENCODER_MODES])
    return "\n\n".join([md(out),
                        f"Median ms. This set: `{refs.shown(now)}`; earlier: `{refs.shown(then)}` (archived).",
                        machine_sentence(now, then)])


def busy_over_wall_block(refs: Refs) -> str:
    """The rows whose GPU-busy time (one separately profiled call) exceeds their median wall time."""
    roles = ("bench-450m", "bench-1.6b", "kernels")
    over, best = [], None
    for role in roles:
        df = refs.frame(role, "mode", "workload", "gpu_busy_ms", "median_ms")
        df["where"] = f"`{role}` " + df["mode"].astype(object) + " " + df.workload.astype(object)
        if role == "kernels":
            df["where"] += " (" + pd.Series(configs(refs(role), KERNEL_OPTIONS), index=df.index, dtype=object) + ")"
        df = df[(df.gpu_busy_ms > 0) & (df.median_ms > 0)]
        best = max([best or (0, ""), *zip(df.gpu_busy_ms / df.median_ms, df["where"])])
        over += [f"{r.where}: {ms(r.gpu_busy_ms, 3)} ms busy, {ms(r.median_ms, 3)} ms median"
                 for r in df[df.gpu_busy_ms > df.median_ms].itertuples()]  # floor.busy_over_wall's rule
    if over:
        return "Rows whose GPU-busy time exceeds their median wall time:\n\n" + "\n".join(f"- {o}" for o in over)
    return (f"No row of {', '.join(f'`{r}`' for r in roles)} has a GPU-busy time above its median wall time; the "
            f"closest is {best[1]}, busy {pct(best[0])} of its median." if best[0] else "No row is profiled.")


def check_block(refs: Refs) -> str:
    """Per preset: the ``check`` file's verdicts, one column per check."""
    res = refs("check")
    rows = []
    for p in res["presets"]:
        replays = [g for g in p["graphs"] if "budget" in g]
        alias = [g for g in p["graphs"] if "aliasing_ok" in g]
        other = {g["check"]: g for g in p["graphs"] if "check" in g}
        par = p["parity"]
        rows.append([preset_label(p["preset"]), p["attention"],
                     f"{sum(c['pass'] for c in par)} of {len(par)}; rel. error vs float32 "
                     f"{span([c['rel_err'] for c in par], lambda v: f'{v:.2e}')} (transformers' own "
                     f"{span([c['hf_rel_err'] for c in par], lambda v: f'{v:.2e}')})",
                     "pass" if p["sync"]["pass"] else f"**fail** ({p['sync'].get('error')})",
                     f"{sum(g['pass'] for g in replays)} of {len(replays)} pass, "
                     f"{sum(g['rel_err'] == 0 for g in replays)} bit-identical, {sum(g['nan'] for g in replays)} NaN",
                     f"{sum(g['aliasing_ok'] and not g['shares_graph_storage'] for g in alias)} of {len(alias)}",
                     verdict(other.get("oversize_fallback", {}).get("pass"), "pass", "fail"),
                     "**pass**" if p["pass"] else "**fail**"])
    head = ["preset", "attention", "parity cases", "no host sync", "replay vs eager (every budget, both rules, "
            "both max_seqlen modes)", "results not aliased", "oversize fallback", "verdict"]
    return "\n\n".join([table(head, rows), refs.source("check")])


def model_changes_block(refs: Refs) -> str:
    """Per preset: graphs after the model changed under them, and what the stamp check and fused QKV cost."""
    res = refs("check")
    rows, notes = [], []
    for p in res["presets"]:
        moved = p.get("model_changes")
        if moved is None:
            continue
        for c in moved["changes"]:
            rows.append([preset_label(p["preset"]), f"`{c['change']}`", c["recaptures"],
                         f"{c['rel_err']:.2e} ({c['hf_rel_err']:.2e})", verdict(c["pass"], "pass", "fail")])
        q = moved["fused_qkv"]
        how = "comparing every pointer"
        if moved.get("pointer_check") == "extension":  # the same run timed torch's function too
            how += (" in the kit's C++ pointer check (torch's function: "
                    f"{moved['pointer_checks']['torch']['encode_us']:.2f} µs per `encode`)")
        if moved.get("stamp_check") != "every pointer":
            how = "the earlier check, a flag and one pointer per part,"
        lock = f" The lock each call takes costs {moved['serial_us']:.2f} µs." if "serial_us" in moved else ""
        notes.append(f"- {preset_label(p['preset'])}: {how} costs {moved['encode_stamp_us']:.2f} µs per "
                     f"`encode` and {moved['engine_stamp_us']:.2f} µs per text-engine call "
                     f"({moved['stamped_tensors']} encoder tensors stamped).{lock} Fusing q/k/v adds "
                     f"{q['freed_mib']:.1f} MiB; keeping the separate tensors alive, as an unstamped kit must, "
                     f"adds {q['kept_mib']:.1f} MiB (the q/k/v weights are {q['qkv_mib']:.1f} MiB).")
    if not rows:
        return f"The reference set's check file has no model-change rows. {refs.source('check')}"
    head = ["preset", "change after capture", "recaptures", "rel. error vs float32 (transformers' own)", "verdict"]
    return "\n\n".join([table(head, rows), "\n".join(notes), refs.source("check")])


BLOCKS = {"model-changes": model_changes_block, "encoder-450m": encoder_block("bench-450m"),
          "encoder-1.6b": encoder_block("bench-1.6b"), "kernel-classes": kernel_classes_block,
          "kernel-options": kernel_options_block, "attention": attention_block, "sweeps": sweeps_block,
          "same-config": same_config_block, "machine-variation": machine_block,
          "busy-over-wall": busy_over_wall_block, "check": check_block}
