"""The generated parts of docs/goals.md: the goals as measured from the reference set (the encoder's
judged here by :func:`~.floor.judge_targets`, the others by their runs' ``targets``), and for each
miss the numbers that explain it (:data:`EXPLAIN`)."""

from __future__ import annotations

import statistics

from ..measure.floor import TARGETS as FLOOR_TARGETS
from ..measure.floor import judge_targets, kernel_breakdown
from ..measure.ttft import CPU_INPUT_WORKLOADS, mode_name
from ..measure.ttft import TARGETS as TTFT_TARGETS
from .frames import Refs, ms, pct, preset_label, table
from .reference import manifest_path
from .tables_code import REPORT_GOAL, code_goals, explain_report_layer
from .tables_encoder import by_mode
from .tables_engine import image_path_pairs, mode_label
from .tables_kernels import PREFIX as KERNELS
from .tables_kernels import explain_kernels, kernel_goals
from .tables_record import explain_record, record_goals, record_how


def encoder_goals(refs: Refs) -> list[dict]:
    return judge_targets(refs("bench-450m")["rows"], refs("bench-1.6b")["rows"])


def ttft_goals(refs: Refs) -> list[dict]:
    return refs("ttft").get("targets") or []


def engine_goals(refs: Refs) -> list[dict]:
    """The engine run's targets; a capture goal's note gets the first compile before the capture where
    the file's verdict has none (files recorded before :func:`~.engine_measure.compile_note`)."""
    from ..measure.engine_measure import compile_note

    res = refs("engine")
    first = {f"capture s of every graph, {r['preset']} {r['mode']}": r["first_call"] for r in res["rows"]
             if r.get("requests") == 1 and r.get("first_call")}
    return [dict(t, detail=compile_note(first[t["target"]])) if t["target"] in first and not t.get("detail") else t
            for t in res.get("targets") or []]


def request_goals(refs: Refs) -> list[dict]:
    """The whole-request run's goals (:func:`~.request.goals_of`; none while the set has no such file)."""
    from ..measure.request import goals_of

    return goals_of(refs("request-3b")) if "request-3b" in refs.manifest.get("files", {}) else []


def guard_goals(refs: Refs) -> list[dict]:
    """The check run's guard goals (:data:`~.check.STAMP_TARGET`), judged by the run itself; a
    check file recorded before the goal lists it as not measured."""
    from ..measure.check import STAMP_TARGET, preset_short

    res = refs("check")
    judged = [t for p in res["presets"] for t in (p.get("model_changes") or {}).get("targets", [])]
    if judged:
        return judged
    return [{"target": f"{preset_short(name)} pointer check per encode µs", "limit": limit, "value": None,
             "ok": False, "detail": "the set's check file predates this goal"} for name, limit in STAMP_TARGET.items()]


def _aim_and_value(t: dict) -> tuple[str, str]:
    """How a goal's limit and value read (units and direction from the goal's name)."""
    name, v, lim = t["target"], t["value"], t["limit"]
    if name.endswith(" µs"):
        return f"≤ {lim:g} µs", ("not measured" if v is None else f"{v:.2f} µs")
    if v is None:
        return ("–" if lim is None else f"{lim:g}"), "not measured"
    if name.endswith((" lines", " members")):
        return f"≤ {lim:,}", f"{v:,}"
    if isinstance(v, bool):
        return ("all" if lim is True else str(lim)), ("yes" if v else "no")
    if name.startswith("fastest mode"):
        return f"< the next mode's {ms(lim)} ms ({t['detail'].removeprefix('next: ')})", f"{ms(v)} ms"
    if " below " in name:  # faster than a peer in the same file
        return f"< {name.split(' below ')[1].split(',')[0]} {ms(lim)} ms", f"{ms(v)} ms"
    if name.startswith("GPU-busy"):
        return f"≤ transformers' {ms(lim)} ms", f"{ms(v)} ms"
    if "cut" in name:
        return f"≥ {pct(lim, 0)}", pct(v)
    if "speedup" in name:
        return f"≥ {lim:g}×", f"{v:.1f}×"
    if "/" in name:
        return f"≤ {lim:g}×", f"{v:.2f}×"
    if " in s," in name or name.endswith(" in s"):
        return f"≤ {lim:g} s", f"{ms(v)} s"
    unit = "MiB" if "MiB" in name else "s" if name.endswith(" s") or name.startswith("capture s") else "ms"
    return f"≤ {lim:g} {unit}", (f"{v:.0f} {unit}" if unit == "MiB" else f"{ms(v)} {unit}")


def goals_table(judged: list[dict]) -> str:
    def note(t: dict) -> str | None:  # a long detail is explained below the tables instead
        d = t.get("detail") or None
        return None if t["target"].startswith("fastest mode") or len(d or "") > 60 else d
    return table(["goal", "aimed for", "measured", "reached", "note"],
                 [[t["target"], *_aim_and_value(t), "yes" if t["ok"] else "**no**", note(t)] for t in judged])


RUN_JUDGED = "judged by the run itself: `targets` in the file"


def goals_part(goals, *roles: str, how: str = f" ({RUN_JUDGED})"):
    """A goals table (``goals(refs)``), how many were reached (``how``: by whom), the files (or manifest)."""
    def block(refs: Refs) -> str:
        judged = goals(refs)
        source = refs.source(*roles) if roles else f"Manifest: `{refs.shown(manifest_path(refs.gpu, refs.root))}`."
        return "\n\n".join([goals_table(judged), f"{sum(t['ok'] for t in judged)} of {len(judged)} reached{how}. "
                            + source])
    return block


def request_goals_block(refs: Refs) -> str:
    judged = request_goals(refs)
    if not judged:
        return "_Not in this reference set: `python -m lfm2vl_lab record` records role `request-3b`._"
    again = "".join(f"; {t['target']}: judged again against the kit's one capture limit (`floor.TARGETS`), the file "
                    f"was recorded under ≤ {t['recorded_limit']:g} s" for t in judged if "recorded_limit" in t)
    return goals_part(lambda _: judged, "request-3b", how=f" ({RUN_JUDGED}{again})")(refs)


# What explains each miss

def idle_gaps(row: dict) -> list[tuple[float, str, str]]:
    """``(µs, entry before, entry after)`` of each idle stretch between a profiled call's GPU entries, in order."""
    gpu = sorted((row.get("timeline") or {}).get("gpu") or [])
    return [(b[0] - (a[0] + a[1]), a[2], b[2]) for a, b in zip(gpu, gpu[1:]) if b[0] > a[0] + a[1]]


def explain_gaps(refs: Refs, workload: str = "1x512") -> list[str]:
    """Where the graphed 450M call at ``workload`` spends what is not kernel time, gap by gap of its
    profiled call (``timeline``): the launch ahead of the graph, cuDNN's memsets, the kernel boundaries."""
    r = by_mode(refs("bench-450m")["rows"])[("lab-graph", workload)]
    gaps = idle_gaps(r)
    first = gaps[0] if gaps else (0.0, "", "")
    after_memset = [g for g in gaps if "Memset" in g[1]]
    inner = [g[0] for g in gaps[1:] if "Memset" not in g[1]]
    out = [f"The median call takes {ms(r['median_ms'], 3)} ms and its kernels {ms(r['gpu_busy_ms'], 3)} ms: "
           f"{1000 * (r['median_ms'] - r['gpu_busy_ms']):.0f} µs are not kernel time. In the profiled call "
           f"(`timeline`, a separate call) the GPU idles {sum(g[0] for g in gaps):.0f} µs between its entries, "
           f"and the other {1000 * (r['median_ms'] - r['gpu_busy_ms']) - sum(g[0] for g in gaps):.0f} µs lie outside "
           "them, on the host side of the call:\n"]
    out.append(f"- {first[0]:.0f} µs between the first entry (`{first[1][:40]}`) and the graph's first kernel: the "
               "input copy ahead of the replay, then the graph launch;")
    if after_memset:
        us = [g[0] for g in after_memset]
        out.append(f"- {sum(us):.0f} µs in {len(us)} gaps of {min(us):.1f}–{max(us):.1f} µs, each right after a "
                   "`Memset` entry that cuDNN's attention adds before its kernel;")
    out.append(f"- {sum(inner):.0f} µs in the other {len(inner)} gaps inside the graph (median "
               f"{statistics.median(inner) if inner else 0:.2f} µs, one per kernel boundary).")
    return out


def explain_busy_ratio(refs: Refs) -> str:
    r = by_mode(refs("bench-450m")["rows"])[("lab-graph", "1x512")]
    k = refs("kernels")["rows"]
    fa2 = next(x for x in k if x["workload"] == "1x512" and not x["dense_graphs"]
               and x["fuse_qkv"] and x["fuse_elementwise"])
    att = {x["backend"]: 1000 * x.get("graph_ms_per_layer", 0) for x in refs("attention")["rows"]
           if x["layout"] == [1024] and x["preset"] == r["preset"]}
    att_us = {label: kernel_breakdown(x).get("attention", {}).get("us", 0.0)
              for label, x in (("cuDNN", r), ("FA2", fa2))}
    return "\n".join(explain_gaps(refs) + [
        f"\nWithout dense graphs (FlashAttention-2 varlen, `kernels`) the call has no memset, but its "
        f"attention kernels take {att_us['FA2']:.0f} µs against cuDNN's {att_us['cuDNN']:.0f} µs; inside a "
        f"graph FlashAttention's dense kernel takes {att.get('dense_flash', 0):.1f} µs per layer against "
        f"cuDNN's {att.get('dense_cudnn', 0):.1f} (`attention`, one 1024-row item). So cuDNN stays, and what "
        "is left is inside the graph: fewer kernels, not fewer launches, would close it."])


def explain_1x256(refs: Refs) -> str:
    """The 256 px image's call: what is not kernel time, as for one 512 px image."""
    by = by_mode(refs("bench-450m")["rows"])
    r, big = by[("lab-graph", "1x256")], by[("lab-graph", "1x512")]
    limit = dict(FLOOR_TARGETS["latency"])["1x256"]
    return "\n".join(explain_gaps(refs, "1x256") + [
        f"\nThe median is {1000 * (r['median_ms'] - limit):.0f} µs over the {limit:g} ms aimed for. Its "
        f"{r['kernels']:.0f} kernels ({r['patch_rows']} patch rows) take {1000 * r['gpu_busy_ms']:.0f} µs, and one 512 "
        f"px image's {big['kernels']:.0f} ({big['patch_rows']} rows) {1000 * big['gpu_busy_ms']:.0f} µs: the gaps "
        "around the kernels are what the two calls share."])


def explain_16b_tiled(refs: Refs) -> str:
    by = by_mode(refs("bench-1.6b")["rows"])
    r, hf, limit = by[("lab-graph", "tiled")], by.get(("hf-eager", "tiled")), dict(FLOOR_TARGETS["1.6b"])["tiled"]
    one = by.get(("lab-graph", "1x512"))
    return (f"The tiled image is {r['n_items']} items on this preset ({r['tokens']} tokens: the 1.6B processor adds a "
            f"thumbnail to the tiles), so the call replays {r['graph_launches']:.0f} graphs (one for the run of full "
            f"tiles, one for the rest; one 512 px image replays {one['graph_launches']:.0f}) and runs "
            f"{r['kernels']:.0f} kernels. Those kernels alone take {ms(r['gpu_busy_ms'])} ms of the "
            f"{ms(r['median_ms'])} ms median, {1000 * (r['median_ms'] - limit):.0f} µs over the {limit:g} ms aimed "
            f"for" + (f" (transformers: {ms(hf['median_ms'])} ms)" if hf else "") + ". Folding the rest into the run's "
            "replay would save one launch and its gaps; that variant is not built.")


def explain_cpu_input(refs: Refs) -> str:
    pairs = {(r.get("preset"), r["workload"]): (r, s) for r, s in image_path_pairs(refs, "encode_sources",
                                                                                   "staging_split")}
    lim = TTFT_TARGETS["cpu_input_encode_ratio"]
    out = []
    for w in CPU_INPUT_WORKLOADS:
        src, sp = pairs.get(("lfm2-vl-450m", w), (None, None))
        if not (src and sp):
            continue
        slack = (lim - 1) * src["gpu_ms_median"]
        out.append(f"- {w}: from GPU-resident input {ms(src['gpu_ms_median'], 3)} ms, from the processor's CPU output "
                   f"{ms(src['cpu_ms_median'], 3)} ms. The goal leaves {1000 * slack:.0f} µs for getting the rows onto "
                   f"the GPU; the host gather takes {1000 * sp['gather_ms_median']:.0f} µs and the upload of "
                   f"{sp['bytes'] / 2**20:.1f} MiB alone {1000 * sp['upload_ms_median']:.0f} µs "
                   f"({sp['upload_gb_s']:.1f} GB/s). Uploading the processor's padded float32 instead gives "
                   f"{src['ratio_padded']:.2f}×, and a chunked upload overlapping the gather "
                   f"{src['ratio_chunked']:.2f}×.")
    return ("The kit already uploads only the real rows, in bf16, from pinned memory, without a sync:\n\n"
            + "\n".join(out)
            + "\n\nUploading uint8 rows and normalising inside the graph would halve the bytes; that is not built.")


def explain_first_tokens(refs: Refs) -> str:
    res = refs("ttft")
    differ = [r for r in res["rows"] if not r["same_first_tokens"]]
    cases = {}
    for r in differ:
        cases.setdefault((r["preset"], r["image"]), set()).add(r["mode"])
    out = []
    for (preset, image), modes in cases.items():
        reqs = sorted({r["requests"] for r in differ if (r["preset"], r["image"]) == (preset, image)})
        out.append(f"- {preset_label(preset)}, {image} image, {', '.join(map(str, reqs))} requests: "
                   + ", ".join(mode_label(m) for m in sorted(modes)) + ".")
    for p in res.get("parity") or []:
        bad = {m: x for m, x in p["modes"].items() if not x["same_first_token"]}
        if not bad:
            continue
        picks = ", ".join(f"{mode_label(m)}: {'yes' if x['first_token_as_fp32'] else 'no'}" for m, x in bad.items())
        hf = p["modes"].get(mode_name("eager", "eager"), {})
        errs = ", ".join(f"{x['rel_err_vs_fp32']:.2e}" for x in bad.values())
        out.append(f"\nIn the parity case {preset_label(p['preset'])} {p['image']} ×{p['requests']} float32's two best "
                   f"first tokens are {min(p['fp32_top2_margin']):.3g} apart. Do the modes whose first token differs "
                   f"from `generate`'s pick float32's? {picks}. Does transformers' own bf16 path? "
                   f"{'yes' if hf.get('first_token_as_fp32') else 'no'}. Their first-token logits lie {errs} from "
                   f"float32's (relative error), transformers' own bf16 path {hf.get('rel_err_vs_fp32', 0):.2e}.")
    return "The first tokens differ from all-eager's in these cases:\n\n" + "\n".join(out)


def _steps_line(name: str, prof: dict, step: str) -> str:
    p = prof[step]
    return (f"{name} {p['kernels']:.0f} kernels ({p['classes'].get('GEMM', 0)} GEMMs), {ms(p['gpu_busy_ms'])} ms "
            f"GPU-busy of {ms(p['wall_ms'])} ms wall")


def _engine_lines(res: dict, s: dict) -> list[str]:
    """One preset's lines of :func:`explain_text_engine` (none when a mode is missing)."""
    preset, floor = s["preset"], s["floor"]
    prof = (res.get("profile") or {}).get(preset) or {}
    rows = {(r["mode"], r["requests"]): r for r in res["rows"] if r["preset"] == preset and "error" not in r}
    fused, plain, eight = rows.get(("engine-fused", 1)), rows.get(("engine", 1)), rows.get(("engine-fused", 8))
    if not (fused and plain and "engine-fused" in prof and "engine" in prof):
        return []
    fp, pp = prof["engine-fused"], prof["engine"]
    times = fp["decode_step"]["gpu_busy_ms"] / floor["floor_ms"]
    out = [f"{preset_label(preset)}, one request of {s['prompt_len']} positions (`engine`):\n",
           f"- decode step: {_steps_line('unfused', pp, 'decode_step')}; {_steps_line('fused', fp, 'decode_step')}. "
           f"Timed: {ms(plain['decode_ms_per_token'])} → {ms(fused['decode_ms_per_token'])} ms per token. The "
           f"weights' floor is {floor['floor_ms']:.3f} ms ({floor['param_bytes'] / 1e9:.3f} GB read once at "
           f"{floor['bandwidth_B_per_s'] / 1e12:.1f} TB/s): the fused step's kernels alone take {times:.1f}× it;",
           f"- prefill + sample: {_steps_line('unfused', pp, 'prefill')}; {_steps_line('fused', fp, 'prefill')}. "
           f"Timed: {ms(plain['prefill_sample_ms'])} → {ms(fused['prefill_sample_ms'])} ms;"]
    if eight:
        out.append(f"- eight requests: {ms(eight['decode_ms_per_step'])} ms per step, {eight['tokens_per_s']:.0f} "
                   f"tokens/s, where the floor would allow {8e3 / floor['floor_ms']:.0f};")
    first = fused["first_call"]
    out.append(f"- the fused engine's first compile: {first['compile_s']:.0f} s, its capture "
               f"{first['capture_s']:.2f} s.")
    return out


def explain_text_engine(refs: Refs) -> str:
    """The text engine's misses: the profiled steps of the ``engine`` file against the weights' floor,
    the first token's phases from the ``ttft`` file, and what is not built."""
    res = refs("engine")
    out = [line for s in res["setup"] for line in _engine_lines(res, s)]
    want = ("lfm2-vl-450m", "1x512", 1, mode_name("graphed", "graphed"))
    both = next((r for r in refs("ttft")["rows"] if (r["preset"], r["image"], r["requests"], r["mode"]) == want), None)
    if both:
        phases = ", ".join(f"{k} {ms(v)}" for k, v in both["phases_ms"].items() if k != "processor")
        out.append(f"\nOne 512 px request on LFM2-VL-450M, both graphed (`ttft`): TTFT {ms(both['ttft_ms'])} ms, of it "
                   f"{phases} ms; decode {ms(both['decode_ms_per_token'])} ms per token there, where the engine "
                   "holds the grid's longest prompt and each decode step's attention masks the whole cache.")
    out.append("\nFusion took most of the elementwise kernels out. What is left is the GEMMs, which read the weights "
               "one row per request (GEMV-shaped) at a fraction of the bandwidth, and the kernel boundaries between "
               "them. Not built: GEMMs that stream the weights at full bandwidth with the norms and activations "
               "fused into them, a decode attention that reads only the positions in use, and a layer in fewer "
               "kernels.")
    return "\n".join(out)


def explain_pr_capture(refs: Refs) -> str:
    """The PR's budget set's capture on the 3B, budget by budget (``request-3b``), beside the kit's own
    set's capture on the same preset (the ``pr-config`` bench, where the set holds it)."""
    setup = next(s for s in refs("request-3b")["setup"] if s.get("graph_config") == "pr" and s.get("encoder_capture"))
    cap = sorted(setup["encoder_capture"], key=lambda c: c["budget"])
    big, rest = cap[-1], cap[:-1]
    total_s, total_mib = sum(c["capture_s"] for c in cap), sum(c["total_mb"] for c in cap)
    rest_s = sum(c["capture_s"] for c in rest)
    out = [f"The PR's budget set on {preset_label(setup['preset'])} is {len(cap)} budgets up to {big['budget']} "
           f"tokens, captured in {ms(total_s)} s into {total_mib:.0f} MiB (`request-3b`). The {big['budget']}-token "
           f"budget alone takes {ms(big['capture_s'])} s for {len(big['variants'])} graph variants (its varlen "
           f"graph and one dense graph per run length) and holds {big['total_mb']:.0f} MiB; the other "
           f"{len(rest)} budgets take {ms(rest_s)} s together."]
    if "pr-config" in refs.manifest.get("files", {}):
        rows = {r.get("graph_config"): r for r in refs("pr-config")["rows"] if r.get("capture_s") is not None}
        if "kit" in rows and "pr" in rows:
            out.append(f"In the encoder bench of the same preset (`pr-config`, a separate process), the PR's set "
                       f"captured in {ms(rows['pr']['capture_s'])} s into {rows['pr']['graph_total_mb']:.0f} MiB, and "
                       f"the kit's own set in {ms(rows['kit']['capture_s'])} s into "
                       f"{rows['kit']['graph_total_mb']:.0f} MiB.")
    out.append("The dense variants are the kit's addition to each budget's varlen graph; capturing the largest "
               "budget with fewer of them is not built.")
    return " ".join(out)


def explain_pointer_check(refs: Refs) -> str:
    rows = [(p["preset"], p.get("model_changes") or {}) for p in refs("check")["presets"]]
    measured = [(name, m) for name, m in rows if m.get("stamp_check") == "every pointer"]
    if not measured:
        return ("The reference set's `check` file was recorded before `encode` compared every pointer its graphs "
                "read; the stamp cost it holds is the earlier check's (a flag and one pointer per part), so it "
                "does not judge this goal. `python -m lfm2vl_lab check` measures it, and the set's next recording "
                "of its `check` role holds it.")
    return "\n".join(f"- {preset_label(name)}: {m['encode_stamp_us']:.2f} µs for {m['stamped_tensors']} tensors, "
                     f"{1000 * m['encode_stamp_us'] / m['stamped_tensors']:.0f} ns per tensor {_which_check(m)}; "
                     f"the lock around the call adds {m['serial_us']:.2f} µs." for name, m in measured)


def _which_check(m: dict) -> str:
    """How the recorded stamp cost compared the pointers, and what the other check cost in the same run."""
    torch_fn = ("in one C++ call (`torch._C._tensors_data_ptrs_at_indices_equal`, which unpacks each tensor "
                "from its Python list)")
    if m.get("pointer_check") != "extension":
        why = m.get("pointer_check_error")
        return torch_fn + (f"; the kit's C++ pointer check was not built ({why})" if why else "")
    other = m["pointer_checks"]["torch"]["encode_us"]
    return ("in the kit's C++ pointer check (`core/ptrcheck.cpp`, which holds the tensors and compares with no "
            f"conversion per call); torch's function took {other:.2f} µs in the same run")


EXPLAIN = {
    "450M pointer check per encode µs": explain_pointer_check,
    "the PR's budget set captures in s": explain_pr_capture,
    "1x512 wall / GPU-busy": explain_busy_ratio,
    "450M 1x512 median ms": explain_busy_ratio,  # what is left of one image's call is the same: its gaps
    "450M 1x256 median ms": explain_1x256,
    "1.6B tiled median ms": explain_16b_tiled,
    "encode() CPU input / GPU input": explain_cpu_input,
    "every mode's first tokens equal eager's": explain_first_tokens,
    "TTFT ms, both graphed": explain_text_engine,
    "decode ms per token": explain_text_engine,
    "prefill+sample": explain_text_engine,
    "every mode passes parity (tokens vs generate, logits vs fp32)": explain_first_tokens,
    "a full record of the kit's own roles": explain_record,
    REPORT_GOAL: explain_report_layer,
    KERNELS: explain_kernels,
}


def explainer(target: str):
    return EXPLAIN.get(target) or next((f for k, f in EXPLAIN.items() if target.startswith(k)), None)


def misses_block(refs: Refs) -> str:
    """One short section per missed goal (goals sharing an explanation share the section)."""
    judged = [t for goals in (encoder_goals, ttft_goals, engine_goals, request_goals, guard_goals, kernel_goals,
                              record_goals, code_goals) for t in goals(refs)]
    missed = [t for t in judged if not t["ok"]]
    if not missed:
        return "Every goal is reached in this reference set."
    groups: dict = {}
    for t in missed:
        groups.setdefault(explainer(t["target"]), []).append(t)
    out = []
    for fn, ts in groups.items():
        head = "; ".join(f"{t['target']}: {_aim_and_value(t)[1]}, aimed for {_aim_and_value(t)[0]}" for t in ts[:3])
        head += f"; and {len(ts) - 3} more" if len(ts) > 3 else ""  # the tables above list every goal
        body = fn(refs) if fn else "No explanation is generated for this goal yet; docs/results.md has its tables."
        out.append(f"### {head}\n\n{body}")
    return "\n\n".join(out)


BLOCKS = {"goals-encoder": goals_part(encoder_goals, "bench-450m", "bench-1.6b", how=""),
          "goals-ttft": goals_part(ttft_goals, "ttft"), "goals-engine": goals_part(engine_goals, "engine"),
          "goals-request": request_goals_block, "goals-guard": goals_part(guard_goals, "check"),
          "goals-kernels": goals_part(kernel_goals, "bench-450m", "bench-1.6b", "ttft", "engine",
                                      how=" (judged here from the files' rows: `report/tables_kernels.py`)"),
          "goals-record": lambda refs: goals_part(record_goals, how=record_how(refs))(refs),
          "goals-code": lambda refs: "\n\n".join([goals_table(judged := code_goals(refs)), (
              f"{sum(t['ok'] for t in judged)} of {len(judged)} reached (measured from this tree, not the set: the "
              "lines of `lfm2vl_lab/report/*.py`, and `lfm2vl_lab.core.protocol.protocol_members()`).")]),
          "misses": misses_block}
