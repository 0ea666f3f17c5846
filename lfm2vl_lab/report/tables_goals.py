"""docs/goals.md's generated parts: every run's goals in one table shape, and per miss a small table of
the numbers from the same files that explain it (:data:`EXPLAIN`). Besides the runs' own targets: the
goals the encoder's kernels are held to once its launches are graphed (:data:`KERNEL_GOALS`, each
stricter than its first limit in ``measure.floor.TARGETS``), and the library's own shape, measured from
this tree rather than the set (the report layer's lines; core's protocol's members against vLLM's eleven)."""

from __future__ import annotations

import ast
import statistics
from collections import Counter
from pathlib import Path

from ..measure.floor import TARGETS as FLOOR_TARGETS
from ..measure.floor import judge_targets, kernel_breakdown
from ..measure.results import target_row
from ..measure.trace_analysis import Gap, idle_gaps
from ..measure.ttft import CPU_INPUT_WORKLOADS, mode_name
from ..measure.ttft import TARGETS as TTFT_TARGETS
from .frames import Refs, facts, ms, pct, preset_label, table, verdict
from .plots_ttft import ttft_case
from .tables_encoder import by_mode
from .tables_engine import image_path_pairs, mode_label
from .tables_record import explain_record, record_goals


def encoder_goals(refs: Refs) -> list[dict]:
    return judge_targets(refs("bench-450m")["rows"], refs("bench-1.6b")["rows"])


def ttft_goals(refs: Refs) -> list[dict]:
    return refs("ttft").get("targets") or []


def engine_goals(refs: Refs) -> list[dict]:
    """The engine's targets, a capture's note naming the first compile before it (older files lack it)."""
    from ..measure.engine_measure import compile_note

    first = {f"capture s of every graph, {r['preset']} {r['mode']}": r["first_call"] for r in refs("engine")["rows"]
             if r.get("requests") == 1 and r.get("first_call")}
    return [dict(t, detail=compile_note(first[t["target"]])) if t["target"] in first and not t.get("detail") else t
            for t in refs("engine").get("targets") or []]


def request_goals(refs: Refs) -> list[dict]:
    """The whole-request run's goals, a goal judged again under today's limit saying what it was recorded under."""
    from ..measure.request import goals_of

    if not refs.has("request-3b"):
        return []
    return [dict(t, detail="; ".join(filter(None, [t.get("detail"), f"recorded under ≤ {t['recorded_limit']:g} s"])))
            if "recorded_limit" in t else t for t in goals_of(refs("request-3b"))]


def guard_goals(refs: Refs) -> list[dict]:
    """The check run's own verdicts; a check file from before the goal lists it as not measured."""
    from ..measure.check import STAMP_TARGET, preset_short

    judged = [t for p in refs("check")["presets"] for t in (p.get("model_changes") or {}).get("targets", [])]
    return judged or [target_row(f"{preset_short(name)} pointer check per encode µs", None, limit, False,
                                 "the set's check file predates this goal") for name, limit in STAMP_TARGET.items()]


# The kernels once graphed

KERNELS = "kernels: "  # every goal of this section starts so; explain_kernels explains them all
# (goal, role, workload, field of its graphed row, limit)
KERNEL_GOALS = (
    (f"{KERNELS}450M 1x512 median ms", "bench-450m", "1x512", "median_ms", 0.60),
    (f"{KERNELS}450M 1x512 GPU-busy ms", "bench-450m", "1x512", "gpu_busy_ms", 0.50),
    (f"{KERNELS}450M 16x512 median ms", "bench-450m", "16x512", "median_ms", 6.0),
    (f"{KERNELS}1.6B tiled median ms", "bench-1.6b", "tiled", "median_ms", 13.0),
)
DECODE_MATCH = 1.05  # decode per token inside the TTFT grid within this factor of the engine's own


def _grid_and_engine_decode(refs: Refs) -> tuple[float | None, float | None]:
    """450M decode ms per token: one 512 px request of the TTFT grid (both graphed), the fused engine's."""
    grid = ttft_case(refs("ttft")["rows"], "lfm2-vl-450m", "1x512", 1).get(mode_name("graphed", "graphed"))
    eng = next((r for r in refs("engine")["rows"] if (r["preset"], r["mode"], r.get("requests"))
                == ("lfm2-vl-450m", "engine-fused", 1) and "error" not in r), None)
    return (grid or {}).get("decode_ms_per_token"), (eng or {}).get("decode_ms_per_token")


def kernel_goals(refs: Refs) -> list[dict]:
    out = []
    for name, role, workload, field, limit in KERNEL_GOALS:
        v = (by_mode(refs(role)["rows"]).get(("lab-graph", workload)) or {}).get(field)
        out.append(target_row(name, v, limit, v is not None and v <= limit))
    grid, eng = _grid_and_engine_decode(refs)
    ratio = grid / eng if grid and eng else None
    out.append(target_row(f"{KERNELS}450M decode per token in the TTFT grid / the engine's", ratio, DECODE_MATCH,
                          ratio is not None and ratio <= DECODE_MATCH,
                          f"{ms(grid)} against {ms(eng)} ms" if ratio else "not in the set's files"))
    return out


def explain_kernels(refs: Refs) -> str:
    """The graphed calls' kernels by class, and how far the GPU-busy goal is from what the non-GEMMs take."""
    by, by16 = by_mode(refs("bench-450m")["rows"]), by_mode(refs("bench-1.6b")["rows"])
    calls = {"450M 1x512": by[("lab-graph", "1x512")], "450M 16x512": by[("lab-graph", "16x512")],
             "1.6B tiled": by16[("lab-graph", "tiled")]}
    rows = [[name, f"{r['kernels']:.0f}", f"{1000 * r['gpu_busy_ms']:.0f}", ", ".join(
        f"{c} {v['us']:.0f} µs in {v['count']}" for c, v in list(kernel_breakdown(r).items())[:3])]
        for name, r in calls.items()]
    one = calls["450M 1x512"]
    busy, limit = 1000 * one["gpu_busy_ms"], next(lim for n, *_, lim in KERNEL_GOALS if "1x512 GPU-busy" in n)
    rest = busy - kernel_breakdown(one).get("GEMM", {}).get("us", 0.0)
    grid, eng = _grid_and_engine_decode(refs)
    return "\n\n".join([table(["graphed call", "kernels", "GPU-busy µs", "largest classes"], rows), facts([
        ["GPU-busy the goal takes off one image's call", f"{busy - 1000 * limit:.0f} µs"],
        ["what the kernels other than the GEMMs take", f"{rest:.0f} µs"],
        ["not kernel time in one image's median", f"{1000 * one['median_ms'] - busy:.0f} of "
         f"{1000 * one['median_ms']:.0f} µs"],
        ["450M decode per token: TTFT grid (longest prompt's cache) / engine", f"{ms(grid)} / {ms(eng)} ms"]],
        "Not built: attention without cuDNN's memsets, norms, biases and GELU folded into the GEMMs, fewer kernel "
        "boundaries per layer, a decode attention that reads only the positions in use.")])


# The library's own shape

REPORT_DIR = Path(__file__).resolve().parent
REPORT_LIMIT_LINES = 1750  # half the ~3,500 lines that turned result files into pages when the goal was set
PROTOCOL_LIMIT = 12  # vLLM's SupportsEncoderCudaGraph has 11 methods; the kit's protocol adds its config
REPORT_GOAL = "the report layer (`lfm2vl_lab/report/`), lines"


def _modules() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(REPORT_DIR.glob("*.py"))}


def code_goals(refs: Refs | None = None) -> list[dict]:
    """The two goals, judged on this tree (``refs`` is not read: the shape of the code is not a GPU result)."""
    from ..core.protocol import protocol_members

    mods = _modules()
    lines, members = sum(t.count("\n") for t in mods.values()), len(protocol_members())
    return [target_row(REPORT_GOAL, lines, REPORT_LIMIT_LINES, lines <= REPORT_LIMIT_LINES, f"{len(mods)} modules"),
            target_row("core's protocol (`EncoderGraphModel`), members", members, PROTOCOL_LIMIT,
                       members <= PROTOCOL_LIMIT, "vLLM's `SupportsEncoderCudaGraph`: 11 methods")]


def _is_phrase(node) -> bool:
    """An f-string, or a plain string with a space in it: words a page prints, not a key or a format."""
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                                                and " " in node.value.strip())


def line_kinds(text: str) -> dict[str, int]:
    """A module's lines by what they hold: ``docs`` (docstrings, comment lines, blank lines), ``wording``
    (a line with a phrase in a string literal: what the pages print) and ``code`` (the rest)."""
    doc, words = set(), set()  # a docstring is a phrase too: its lines count as docs, below
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            doc.update(range(body[0].lineno, body[0].end_lineno + 1))
        if _is_phrase(node):
            words.update(range(node.lineno, node.end_lineno + 1))
    kinds = {"docs": 0, "wording": 0, "code": 0}
    for i, line in enumerate(text.splitlines(), 1):
        bare = line.strip()
        kind = "docs" if i in doc or not bare or bare.startswith("#") else "wording" if i in words else "code"
        kinds[kind] += 1
    return kinds


def explain_report_layer(refs: Refs | None = None) -> str:
    """Where the report layer's lines are: its largest modules, and its lines by kind."""
    mods = _modules()
    sizes = sorted(((t.count("\n"), name) for name, t in mods.items()), reverse=True)
    kinds = sum((Counter(line_kinds(text)) for text in mods.values()), Counter())
    return facts([["the five largest modules", ", ".join(f"`{name}` {n}" for n, name in sizes[:5])],
                  ["docstrings, comment and blank lines", f"{kinds['docs']:,}"],
                  ["lines with the pages' wording (a phrase in a string literal)", f"{kinds['wording']:,}"],
                  ["the rest (code)", f"{kinds['code']:,}"]])


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


def goals_part(goals, *roles: str):
    """One run's goals as a table, how many were reached, and the files (no roles: the manifest, or nothing)."""
    def block(refs: Refs) -> str:
        judged = goals(refs)
        rows = [[t["target"], *_aim_and_value(t), verdict(t["ok"]),
                 None if t["target"].startswith("fastest mode") or len(t.get("detail") or "") > 60  # the misses'
                 else t.get("detail") or None] for t in judged]  # section explains a long one
        reached = f"{sum(t['ok'] for t in judged)} of {len(judged)} reached."
        return "\n\n".join([table(["goal", "aimed for", "measured", "reached", "note"], rows),
                            reached if goals is code_goals else f"{reached} {refs.source(*roles)}"])
    return block


def request_goals_block(refs: Refs) -> str:
    if not request_goals(refs):
        return "_Not in this reference set: `python -m lfm2vl_lab record` records role `request-3b`._"
    return goals_part(request_goals, "request-3b")(refs)


# What explains each miss

def gap_rows(refs: Refs, workload: str) -> list[list]:
    """Where the graphed 450M call's time that is not kernel time goes, gap by gap of its profiled call."""
    r = by_mode(refs("bench-450m")["rows"])[("lab-graph", workload)]
    gaps = idle_gaps(r.get("timeline") or {}, kernels_only=False)  # cuDNN's memsets count as entries
    first = gaps[0] if gaps else Gap(0.0, 0.0, "", "")
    memset = [g.dur_us for g in gaps if "Memset" in g.before]
    inner = [g.dur_us for g in gaps[1:] if "Memset" not in g.before]
    idle, off = sum(g.dur_us for g in gaps), 1000 * (r["median_ms"] - r["gpu_busy_ms"])
    return [[f"median call, lab-graph {workload}", f"{1000 * r['median_ms']:.0f} µs"],
            ["its kernels (GPU-busy of one profiled call)", f"{1000 * r['gpu_busy_ms']:.0f} µs"],
            ["not kernel time", f"{off:.0f} µs"],
            ["of it: idle between the profiled call's GPU entries", f"{idle:.0f} µs"],
            ["of it: outside them, on the host side of the call", f"{off - idle:.0f} µs"],
            [f"first entry (`{first.before[:40]}`) to the graph's first kernel: input copy, graph launch",
             f"{first.dur_us:.0f} µs"],
            [f"{len(memset)} gaps after cuDNN's `Memset` entries ({min(memset, default=0):.1f}–"
             f"{max(memset, default=0):.1f} µs each)", f"{sum(memset):.0f} µs"],
            [f"{len(inner)} other gaps, one per kernel boundary (median "
             f"{statistics.median(inner) if inner else 0:.2f} µs)", f"{sum(inner):.0f} µs"]]


def explain_busy_ratio(refs: Refs) -> str:
    r = by_mode(refs("bench-450m")["rows"])[("lab-graph", "1x512")]
    fa2 = next(x for x in refs("kernels")["rows"] if x["workload"] == "1x512" and not x["dense_graphs"]
               and x["fuse_qkv"] and x["fuse_elementwise"])
    att = {x["backend"]: 1000 * x.get("graph_ms_per_layer", 0) for x in refs("attention")["rows"]
           if x["layout"] == [1024] and x["preset"] == r["preset"]}
    us = [kernel_breakdown(x).get("attention", {}).get("us", 0.0) for x in (fa2, r)]
    return facts(gap_rows(refs, "1x512") + [
        ["attention kernels without dense graphs (FlashAttention-2 varlen, `kernels`; no memsets)", f"{us[0]:.0f} µs"],
        ["attention kernels, cuDNN (this call)", f"{us[1]:.0f} µs"],
        ["dense attention per layer in a graph, FlashAttention / cuDNN (`attention`, 1024 rows)",
         f"{att.get('dense_flash', 0):.1f} / {att.get('dense_cudnn', 0):.1f} µs"]],
        "So cuDNN stays; fewer kernels, not fewer launches, would close the rest.")


def explain_1x256(refs: Refs) -> str:
    return facts(gap_rows(refs, "1x256") + [
        ["aimed for", f"{dict(FLOOR_TARGETS['latency'])['1x256']:g} ms"]])


def explain_16b_tiled(refs: Refs) -> str:
    by = by_mode(refs("bench-1.6b")["rows"])
    r, hf, limit = by[("lab-graph", "tiled")], by.get(("hf-eager", "tiled")), dict(FLOOR_TARGETS["1.6b"])["tiled"]
    return facts([["items (tokens) of the tiled image, the 1.6B processor's thumbnail included",
                   f"{r['n_items']} ({r['tokens']})"],
                  ["graph replays (one 512 px image: "
                   f"{by[('lab-graph', '1x512')]['graph_launches']:.0f})", f"{r['graph_launches']:.0f}"],
                  ["kernels", f"{r['kernels']:.0f}"], ["their GPU-busy time", f"{ms(r['gpu_busy_ms'])} ms"],
                  ["median", f"{ms(r['median_ms'])} ms"],
                  ["over the limit", f"{1000 * (r['median_ms'] - limit):.0f} µs"],
                  ["transformers' median", f"{ms(hf['median_ms'])} ms" if hf else None]],
                 "Not built: the rest folded into the full tiles' replay (one launch and its gaps fewer).")


def explain_cpu_input(refs: Refs) -> str:
    pairs = {(r.get("preset"), r["workload"]): (r, s) for r, s in image_path_pairs(refs, "encode_sources",
                                                                                   "staging_split")}
    lim = TTFT_TARGETS["cpu_input_encode_ratio"]
    rows = [[w, ms(r["gpu_ms_median"], 3), ms(r["cpu_ms_median"], 3), f"{1000 * (lim - 1) * r['gpu_ms_median']:.0f}",
             f"{1000 * s['gather_ms_median']:.0f}",
             f"{1000 * s['upload_ms_median']:.0f} ({s['bytes'] / 2**20:.1f} MiB, {s['upload_gb_s']:.1f} GB/s)",
             f"{r['ratio_padded']:.2f}×", f"{r['ratio_chunked']:.2f}×"]
            for w in CPU_INPUT_WORKLOADS for r, s in [pairs.get(("lfm2-vl-450m", w), (None, None))] if r and s]
    head = ["LFM2-VL-450M", "from GPU input ms", "from CPU output ms", "the goal leaves µs", "host gather µs",
            "upload µs", "padded float32 instead", "chunked upload"]
    return (table(head, rows) + "\n\nThe real rows already go up in bf16 from pinned memory without a sync. Not "
            "built: uint8 rows normalised inside the graph (half the bytes).")


def explain_first_tokens(refs: Refs) -> str:
    res = refs("ttft")
    cases: dict = {}
    for r in res["rows"]:
        if not r["same_first_tokens"]:
            case = cases.setdefault((preset_label(r["preset"]), r["image"]), {})
            case.setdefault(r["mode"], set()).add(r["requests"])
    out = [table(["preset", "image", "modes whose first tokens differ from all-eager's (requests)"],
                 [[*c, ", ".join(f"{mode_label(m)} ({', '.join(map(str, sorted(n)))})" for m, n in modes.items())]
                  for c, modes in cases.items()])]
    for p in res.get("parity") or []:
        hf = p["modes"].get(mode_name("eager", "eager"), {})
        rows = [[mode_label(m), "yes" if x["first_token_as_fp32"] else "no", f"{x['rel_err_vs_fp32']:.2e}"]
                for m, x in p["modes"].items() if not x["same_first_token"]]
        if rows:
            out += [f"Parity case {preset_label(p['preset'])} {p['image']} ×{p['requests']}: float32's two best first "
                    f"tokens are {min(p['fp32_top2_margin']):.3g} apart.",
                    table(["first token differs from `generate`'s", "picks float32's", "logits vs float32"],
                          rows + [["transformers' own bf16", "yes" if hf.get("first_token_as_fp32") else "no",
                                   f"{hf.get('rel_err_vs_fp32', 0):.2e}"]])]
    return "\n\n".join(out)


def _engine_rows(res: dict, s: dict) -> list[list]:
    """One preset's rows of :func:`explain_text_engine` (none when a mode is missing)."""
    preset, floor = s["preset"], s["floor"]
    prof = (res.get("profile") or {}).get(preset) or {}
    rows = {(r["mode"], r["requests"]): r for r in res["rows"] if r["preset"] == preset and "error" not in r}
    mine = [rows.get(("engine", 1)), rows.get(("engine-fused", 1))]
    if not (all(mine) and "engine-fused" in prof and "engine" in prof):
        return []
    pp, eight, first = [prof["engine"], prof["engine-fused"]], rows.get(("engine-fused", 8)), mine[1]["first_call"]
    out = []
    for step, key, what in (("decode_step", "decode_ms_per_token", "decode ms per token"),
                            ("prefill", "prefill_sample_ms", "prefill + sample ms")):
        out += [[f"{preset_label(preset)} ({s['prompt_len']} positions): {what}, timed", *(ms(r[key]) for r in mine)],
                [f"{step.replace('_', ' ')}: kernels (GEMMs)",
                 *(f"{p[step]['kernels']:.0f} ({p[step]['classes'].get('GEMM', 0)})" for p in pp)],
                [f"{step.replace('_', ' ')}: GPU-busy / wall ms",
                 *(f"{ms(p[step]['gpu_busy_ms'])} / {ms(p[step]['wall_ms'])}" for p in pp)]]
    return out + [[f"weights' floor per decode step ({floor['param_bytes'] / 1e9:.3f} GB at "
                   f"{floor['bandwidth_B_per_s'] / 1e12:.1f} TB/s)", None, f"{floor['floor_ms']:.3f} ms (fused "
                   f"kernels: {pp[1]['decode_step']['gpu_busy_ms'] / floor['floor_ms']:.1f}×)"],
                  ["eight requests: ms per step, tokens/s (the floor's)", None, eight and
                   f"{ms(eight['decode_ms_per_step'])}, {eight['tokens_per_s']:.0f} ({8e3 / floor['floor_ms']:.0f})"],
                  ["first compile, capture", None, f"{first['compile_s']:.0f} s, {first['capture_s']:.2f} s"]]


def explain_text_engine(refs: Refs) -> str:
    """The engine's profiled steps against the weights' floor, and the first token's phases (``ttft``)."""
    res = refs("engine")
    out = [table(["`engine`, one request", "unfused", "fused"],
                 [row for s in res["setup"] for row in _engine_rows(res, s)])]
    both = ttft_case(refs("ttft")["rows"], "lfm2-vl-450m", "1x512", 1).get(mode_name("graphed", "graphed"))
    if both:
        out.append(f"One 512 px request on LFM2-VL-450M, both graphed (`ttft`): TTFT {ms(both['ttft_ms'])} ms ("
                   + ", ".join(f"{k} {ms(v)}" for k, v in both["phases_ms"].items() if k != "processor")
                   + f"); decode {ms(both['decode_ms_per_token'])} ms per token, with the grid's longest prompt's "
                   "cache.")
    return "\n\n".join(out + ["What is left is GEMV-shaped GEMMs and the kernel boundaries between them. Not "
                              "built: GEMMs that stream the weights at full bandwidth with the norms and activations "
                              "fused in, a decode attention that reads only the positions in use, a layer in fewer "
                              "kernels."])


def explain_pr_capture(refs: Refs) -> str:
    """The PR's budget set's capture on the 3B budget by budget (``request-3b``), and in the ``pr-config`` bench."""
    setup = next(s for s in refs("request-3b")["setup"] if s.get("graph_config") == "pr" and s.get("encoder_capture"))
    cap = sorted(setup["encoder_capture"], key=lambda c: c["budget"])
    rows = [[str(c["budget"]), len(c["variants"]), ms(c["capture_s"]), f"{c['total_mb']:.0f}"] for c in cap]
    rows.append([f"all, {preset_label(setup['preset'])} (`request-3b`)", sum(len(c["variants"]) for c in cap),
                 ms(sum(c["capture_s"] for c in cap)), f"{sum(c['total_mb'] for c in cap):.0f}"])
    if refs.has("pr-config"):
        rows += [[f"`{r['graph_config']}` set in the encoder bench (`pr-config`)", None, ms(r["capture_s"]),
                  f"{r['graph_total_mb']:.0f}"] for r in {r.get("graph_config"): r for r in refs("pr-config")["rows"]
                                                          if r.get("capture_s") is not None}.values()
                 if r["graph_config"] in ("pr", "kit")]
    return facts(rows, "Not built: the largest budget captured with fewer dense variants (one per run length).",
                 head=["the PR's budgets", "graphs", "capture s", "MiB"])


def explain_pointer_check(refs: Refs) -> str:
    measured = [(p["preset"], m) for p in refs("check")["presets"]
                if (m := p.get("model_changes") or {}).get("stamp_check") == "every pointer"]
    if not measured:
        return ("The set's `check` file was recorded before `encode` compared every pointer its graphs read, so it "
                "does not judge this goal; its next recording does.")
    return "\n".join(f"- {preset_label(name)}: {m['encode_stamp_us']:.2f} µs for {m['stamped_tensors']} tensors, "
                     f"{1000 * m['encode_stamp_us'] / m['stamped_tensors']:.0f} ns per tensor {_which_check(m)}; "
                     f"the lock around the call adds {m['serial_us']:.2f} µs." for name, m in measured)


def _which_check(m: dict) -> str:
    if m.get("pointer_check") != "extension":
        why = m.get("pointer_check_error")
        return ("in torch's `_tensors_data_ptrs_at_indices_equal`"
                + (f"; the kit's C++ pointer check was not built ({why})" if why else ""))
    return (f"in the kit's C++ pointer check; torch's function took {m['pointer_checks']['torch']['encode_us']:.2f} "
            "µs in the same run")


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
    groups: dict = {}
    for t in judged:
        if not t["ok"]:
            groups.setdefault(explainer(t["target"]), []).append(t)
    if not groups:
        return "Every goal is reached in this reference set."
    out = []
    for fn, ts in groups.items():
        head = "; ".join(f"{t['target']}: {_aim_and_value(t)[1]}, aimed for {_aim_and_value(t)[0]}" for t in ts[:3])
        head += f"; and {len(ts) - 3} more" if len(ts) > 3 else ""  # the tables above list every goal
        body = fn(refs) if fn else "No explanation is generated for this goal yet; docs/results.md has its tables."
        out.append(f"### {head}\n\n{body}")
    return "\n\n".join(out)


BLOCKS = {"goals-encoder": goals_part(encoder_goals, "bench-450m", "bench-1.6b"),
          "goals-ttft": goals_part(ttft_goals, "ttft"), "goals-engine": goals_part(engine_goals, "engine"),
          "goals-request": request_goals_block, "goals-guard": goals_part(guard_goals, "check"),
          "goals-kernels": goals_part(kernel_goals, "bench-450m", "bench-1.6b", "ttft", "engine"),
          "goals-record": goals_part(record_goals), "goals-code": goals_part(code_goals), "misses": misses_block}
