"""Generated parts about the encoder alone (:mod:`lfm2vl_lab.tools.tables` draws them into the pages):
every mode per workload, the kernel classes of one call, the kernel options, the attention probe, the
sweeps, the correctness check, and the caveats read off the same files."""

from __future__ import annotations

from datetime import datetime

from . import plots_common
from .floor import busy_over_wall, kernel_breakdown
from .tables import DASH, Refs, md_table, ms, pct, preset_label, span, times
from .workloads import NXS, TILED_SIZE

ENCODER_MODES = (("hf-eager", "transformers"), ("compile", "`compile`"), ("lab-eager", "packed, eager"),
                 ("lab-graph", "lab-graph"))
# The archived run the caveat on host-bound modes compares with (the same bench command, run earlier).
EARLIER_BENCH = "floor-20261201-015028.json"
# What a result file records of the machine and libraries it ran on, compared field by field.
MACHINE_FIELDS = (("gpu", "GPU"), ("platform", "platform"), ("host_cpu", "CPU"), ("cpu_count", "CPU count"),
                  ("torch", "torch"), ("cuda", "CUDA"), ("transformers", "transformers"), ("python", "Python"))
KERNEL_OPTIONS = tuple(plots_common.KERNEL_OPTIONS)  # the kernel options' row names
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


def by_mode(rows: list[dict]) -> dict:
    """``{(mode, workload): row}`` of the rows with a median."""
    return {(r["mode"], r["workload"]): r for r in rows if r.get("median_ms") is not None}


def workloads_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["workload"] for r in rows))


def _cell(row: dict | None, bold: bool = False) -> str:
    if row is None:
        return DASH
    med = f"**{ms(row['median_ms'])}**" if bold else ms(row["median_ms"])
    return med + (f" ({ms(row['gpu_busy_ms'])})" if row.get("gpu_busy_ms") is not None else "")


def encoder_table(res: dict) -> str:
    """Median ms per mode and workload (GPU-busy ms of one profiled call in brackets), and lab-graph's
    speedup over transformers."""
    by, stream_n = by_mode(res["rows"]), res["provenance"].get("stream_n")
    head = ["workload", "items"] + [label for _, label in ENCODER_MODES] + ["lab-graph vs transformers"]
    rows = []
    for w in workloads_of(res["rows"]):
        g, hf = by.get(("lab-graph", w)), by.get(("hf-eager", w))
        items = next((r.get("n_items") for (m, ww), r in by.items() if ww == w), None)
        rows.append([workload_label(w, stream_n), items]
                    + [_cell(by.get((m, w)), bold=m == "lab-graph") for m, _ in ENCODER_MODES]
                    + [times(hf["median_ms"] / g["median_ms"]) if g and hf else None])
    return md_table(head, rows)


def encoder_summary(res: dict) -> str:
    """Sentences read off the same rows: where lab-graph is fastest, where its kernels are cheaper than
    transformers', its stream p99 against compile's, and what its graphs cost to capture."""
    by, out = by_mode(res["rows"]), []
    ws = [w for w in workloads_of(res["rows"]) if ("lab-graph", w) in by]
    fastest = [w for w in ws if by[("lab-graph", w)]["median_ms"]
               == min(r["median_ms"] for (m, ww), r in by.items() if ww == w)]
    out.append(f"lab-graph is the fastest mode at {len(fastest)} of {len(ws)} workloads"
               + ("" if len(fastest) == len(ws) else f" (not at {', '.join(w for w in ws if w not in fastest)})") + ".")
    prof = [w for w in ws if by[("lab-graph", w)].get("gpu_busy_ms") and by.get(("hf-eager", w), {}).get("gpu_busy_ms")]
    below = [w for w in prof if by[("lab-graph", w)]["gpu_busy_ms"] <= by[("hf-eager", w)]["gpu_busy_ms"]]
    out.append(f"Its GPU-busy time is at or below transformers' at {len(below)} of the {len(prof)} profiled "
               "workloads (the stream is timed request by request, not profiled).")
    gs, cs = by.get(("lab-graph", "stream")), by.get(("compile", "stream"))
    if gs and cs and gs.get("p99_ms") and cs.get("p99_ms"):
        out.append(f"On the stream its p99 is {ms(gs['p99_ms'])} ms against compile's {ms(cs['p99_ms'])} ms "
                   f"(compile's slowest request: {ms(cs['max_ms'])} ms; `torch.compile` records a new graph for "
                   "each new shape).")
    g = by.get(("lab-graph", ws[0])) if ws else None
    if g and g.get("capture_s") is not None:
        out.append(f"All of lab-graph's graphs were captured in {ms(g['capture_s'])} s and hold "
                   f"{g['graph_total_mb']:.0f} MiB.")
    return " ".join(out)


def encoder_block(role: str):
    def block(refs: Refs) -> str:
        res = refs(role)
        prov = res["provenance"]
        head = (f"{preset_label(prov.get('preset', '?'))}, {prov.get('dtype')}, random weights: median ms of "
                f"{prov.get('repeats')} timed calls after {prov.get('warmup')} warm-up calls per row (the stream "
                "times each request once); in brackets the GPU-busy ms of one profiled call.")
        return "\n\n".join([head, encoder_table(res), encoder_summary(res), refs.source(role)])
    return block


def _kernel_row(rows: list[dict], workload: str, on: dict) -> dict | None:
    return next((r for r in rows if r["workload"] == workload and all(r.get(k) == v for k, v in on.items())), None)


def kernel_classes_block(refs: Refs) -> str:
    """The kernel classes of one profiled 1x512 call: lab-graph with every kernel option off and on
    (``kernels``), and transformers (``bench-450m``)."""
    k = refs("kernels")["rows"]
    cols = {"lab-graph, options off": _kernel_row(k, "1x512", dict.fromkeys(KERNEL_OPTIONS, False)),
            "lab-graph, options on": _kernel_row(k, "1x512", dict.fromkeys(KERNEL_OPTIONS, True)),
            "transformers": by_mode(refs("bench-450m")["rows"]).get(("hf-eager", "1x512"))}
    parts = {label: kernel_breakdown(r) for label, r in cols.items() if r is not None}
    classes = list(dict.fromkeys(c for p in parts.values() for c in p))
    rows = [[c] + [f"{p[c]['count']} · {p[c]['us']:.0f} µs" if c in p else None for p in parts.values()]
            for c in classes]
    totals = [(sum(v["count"] for v in p.values()), sum(v["us"] for v in p.values())) for p in parts.values()]
    rows.append(["**total**"] + [f"**{n} · {us:.0f} µs**" for n, us in totals])
    memsets = {label: parts[label].get("memset", {}).get("count", 0) for label in parts}
    note = ("Entries of one profiled call (kernels, copies and memsets) · their µs. Memset entries: "
            + ", ".join(f"{n} ({label})" for label, n in memsets.items()) + ".")
    return "\n\n".join([md_table(["class"] + list(parts), rows), note, refs.source("kernels", "bench-450m")])


def kernel_options_block(refs: Refs) -> str:
    """lab-graph median (GPU-busy) per workload with no kernel option, each one alone, and all three."""
    k = refs("kernels")["rows"]
    combos = {"none": dict.fromkeys(KERNEL_OPTIONS, False)}
    for opt in KERNEL_OPTIONS:
        combos[f"`{opt}` alone"] = {o: o == opt for o in KERNEL_OPTIONS}
    combos["all three"] = dict.fromkeys(KERNEL_OPTIONS, True)
    rows = []
    for w in workloads_of(k):
        cells = [_kernel_row(k, w, on) for on in combos.values()]
        rows.append([workload_label(w)] + [_cell(r) for r in cells]
                    + [times(cells[0]["median_ms"] / cells[-1]["median_ms"], 2) if cells[0] and cells[-1] else None])
    head = ["workload"] + list(combos) + ["none / all three"]
    return "\n\n".join(["lab-graph median ms (GPU-busy ms of one profiled call), LFM2-VL-450M.",
                        md_table(head, rows), refs.source("kernels")])


def _layout(layout: list[int]) -> str:
    if len(set(layout)) == 1:
        return f"{len(layout)} × {layout[0]} rows"
    return " + ".join(str(n) for n in layout) + " rows"


def attention_block(refs: Refs) -> str:
    """µs per layer of every capturable attention candidate inside a CUDA graph, failures kept."""
    res = refs("attention")
    backends = list(dict.fromkeys(r["backend"] for r in res["rows"]))
    cases = list(dict.fromkeys((r["preset"], r["heads"], r["head_dim"], tuple(r["layout"])) for r in res["rows"]))
    rows = []
    for preset, heads, dim, layout in cases:
        got = {r["backend"]: r for r in res["rows"]
               if (r["preset"], r["heads"], r["head_dim"], tuple(r["layout"])) == (preset, heads, dim, layout)}
        cells = []
        for b in backends:
            r = got.get(b)
            cells.append(None if r is None else "capture fails" if r.get("error") else
                         f"{1000 * r['graph_ms_per_layer']:.1f}")
        rows.append([f"{preset_label(preset)} ({heads} × {dim})", _layout(list(layout))] + cells)
    errors = sorted({r["error"].split(":")[0] for r in res["rows"] if r.get("error")})
    note = ("µs per layer inside a CUDA graph, bf16." + (f" The failed captures raise {', '.join(errors)}; the "
                                                        "file keeps each traceback." if errors else ""))
    return "\n\n".join([md_table(["preset (heads × dim)", "layout"] + [f"`{b}`" for b in backends], rows), note,
                        refs.source("attention")])


def _config(row: dict, keys: tuple) -> str:
    return ", ".join(f"{k}={row.get(k)}" if isinstance(row.get(k), bool) else str(row.get(k)) for k in keys)


def sweep_table(res: dict, keys: tuple) -> str:
    """One row per configuration (``keys``), lab-graph's median per workload, then the stream's padding
    waste where there is a stream, the graphs' MiB and capture s."""
    ws = workloads_of(res["rows"])
    configs = list(dict.fromkeys(_config(r, keys) for r in res["rows"]))
    stream = "stream" in ws
    head = [" / ".join(keys)] + [f"{w} ms" for w in ws] + (["stream padding waste"] if stream else []) \
        + ["graphs MiB", "capture s"]
    rows = []
    for c in configs:
        mine = {r["workload"]: r for r in res["rows"] if _config(r, keys) == c}
        first = next(iter(mine.values()))
        rows.append([c] + [ms(mine[w]["median_ms"]) if w in mine else None for w in ws]
                    + ([pct(mine["stream"].get("padding_waste")) if "stream" in mine else None] if stream else [])
                    + [f"{first['graph_total_mb']:.0f}", ms(first["capture_s"])])
    return md_table(head, rows)


def sweeps_block(refs: Refs) -> str:
    out = []
    for role, keys in (("sweep-rules", ("cu_rule", "max_seqlen_mode")), ("sweep-budgets", ("budget_set",)),
                       ("sweep-attention", ("attention", "fuse_qkv"))):
        out += [f"**`{role}`**", sweep_table(refs(role), keys), refs.source(role)]
    return "\n\n".join(out)


def same_config_block(refs: Refs) -> str:
    """lab-graph at 1x512 in its default configuration, as each role that ran it measured it: the
    spread between separate processes of one run."""
    ref = by_mode(refs("bench-450m")["rows"])[("lab-graph", "1x512")]
    key = {k: ref.get(k) for k in DEFAULT_GRAPH}
    found = {}
    for role in ("bench-450m", "kernels", "sweep-rules", "sweep-budgets", "sweep-attention"):
        for r in refs(role)["rows"]:
            if r["mode"] == "lab-graph" and r["workload"] == "1x512" and all(r.get(k) == v for k, v in key.items()):
                found.setdefault(role, r["median_ms"])
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
    """What two files' provenance shares and where it differs: machine, libraries, the kit's code, time."""
    a, b = now["provenance"], then["provenance"]
    same = [f"{label} {a[k]}" for k, label in MACHINE_FIELDS if a.get(k) is not None and a.get(k) == b.get(k)]
    differ = [f"{label} ({b.get(k)} earlier, {a.get(k)} in this set)" for k, label in MACHINE_FIELDS
              if a.get(k) != b.get(k)]
    if code_of(a) != code_of(b):
        differ.append(f"the kit's code ({code_of(b)} earlier, {code_of(a)} in this set)")
    hours = (datetime.fromisoformat(a["date"]) - datetime.fromisoformat(b["date"])).total_seconds() / 3600
    return (f"Both files record the same {', '.join(same) or 'nothing'}; they differ in "
            f"{'; '.join(differ) or 'nothing they record'}, and the earlier run is {hours:.1f} h older. Whether "
            "one physical host ran both, the files do not record.")


def machine_block(refs: Refs) -> str:
    """Each mode's median at a few workloads, this reference set against an earlier run of the same
    bench command, and what the two files record of machine, libraries and code: the host-bound modes
    move between the runs, the graphed one hardly does."""
    now, then = refs("bench-450m"), refs.archived(EARLIER_BENCH)
    a, b = by_mode(now["rows"]), by_mode(then["rows"])
    ws = [w for w in ("1x512", "tiled", "16x512", "stream") if any(k[1] == w for k in a)]
    rows = []
    for mode, label in ENCODER_MODES:
        cells = []
        for w in ws:
            x, y = a.get((mode, w)), b.get((mode, w))
            cells.append(None if x is None or y is None else
                         f"{ms(x['median_ms'])} vs {ms(y['median_ms'])} ({times(x['median_ms'] / y['median_ms'], 2)})")
        rows.append([label] + cells)
    head = ["mode"] + [f"{w}: this set vs earlier" for w in ws]
    return "\n\n".join([md_table(head, rows),
                        f"Median ms. This set: `{refs.shown(now)}` ({str(now['provenance']['date'])[:10]}); earlier: "
                        f"`{refs.shown(then)}` ({str(then['provenance']['date'])[:10]}, an archived run of the same "
                        "bench command, read here only for this comparison). " + machine_sentence(now, then)])


def busy_over_wall_block(refs: Refs) -> str:
    """The rows whose GPU-busy time (one separately profiled call) exceeds their median wall time."""
    roles = ("bench-450m", "bench-1.6b", "kernels")
    over, best = [], None
    for role in roles:
        rows = refs(role)["rows"]
        exceeds = {id(r) for r in busy_over_wall(rows)}
        for r in rows:
            if r.get("gpu_busy_ms") and r.get("median_ms"):
                share = r["gpu_busy_ms"] / r["median_ms"]
                where = f"`{role}` {r['mode']} {r['workload']}" + (
                    f" ({_config(r, KERNEL_OPTIONS)})" if role == "kernels" else "")
                best = max(best or (0, ""), (share, where))
                if id(r) in exceeds:
                    over.append(f"{where}: {ms(r['gpu_busy_ms'], 3)} ms busy, {ms(r['median_ms'], 3)} ms median")
    if over:
        return "Rows whose GPU-busy time exceeds their median wall time:\n\n" + "\n".join(f"- {o}" for o in over)
    return (f"No row of {', '.join(f'`{r}`' for r in roles)} has a GPU-busy time above its median wall time; the "
            f"closest is {best[1]}, busy {pct(best[0])} of its median." if best else "No row is profiled.")


def check_block(refs: Refs) -> str:
    """Per preset: parity against transformers, the host-sync check, graph replay against eager for every
    budget and rule, aliasing and the oversize fallback."""
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
                     "pass" if other.get("oversize_fallback", {}).get("pass") else "**fail**",
                     "**pass**" if p["pass"] else "**fail**"])
    head = ["preset", "attention", "parity cases", "no host sync", "replay vs eager (every budget, both rules, "
            "both max_seqlen modes)", "results not aliased", "oversize fallback", "verdict"]
    return "\n\n".join([md_table(head, rows), refs.source("check")])


def model_changes_block(refs: Refs) -> str:
    """Per preset: graphs after the model changed under them (recaptured, judged against float32),
    the stamp check's cost per call, and the memory fused QKV costs with and without the old copy."""
    res = refs("check")
    rows, notes = [], []
    for p in res["presets"]:
        moved = p.get("model_changes")
        if moved is None:
            continue
        for c in moved["changes"]:
            rows.append([preset_label(p["preset"]), f"`{c['change']}`", c["recaptures"],
                         f"{c['rel_err']:.2e} ({c['hf_rel_err']:.2e})", "pass" if c["pass"] else "**fail**"])
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
    return "\n\n".join([md_table(head, rows), "\n".join(notes), refs.source("check")])


BLOCKS = {
    "model-changes": model_changes_block,
    "encoder-450m": encoder_block("bench-450m"),
    "encoder-1.6b": encoder_block("bench-1.6b"),
    "kernel-classes": kernel_classes_block,
    "kernel-options": kernel_options_block,
    "attention": attention_block,
    "sweeps": sweeps_block,
    "same-config": same_config_block,
    "machine-variation": machine_block,
    "busy-over-wall": busy_over_wall_block,
    "check": check_block,
}
