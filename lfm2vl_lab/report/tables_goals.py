"""docs/goals.md's generated parts: every family of goals in one table shape (:data:`GOALS`), and per miss
the numbers from the same files that explain it (:func:`explainer`). Besides the runs' own targets: the
kernels' goals (:data:`KERNEL_GOALS`, each stricter than its first limit in ``measure.floor.TARGETS``), a full
record's device time (:data:`RECORD_LIMIT_S`), and the library's own shape, measured from this tree."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

from ..measure.floor import idle_breakdown, judge_targets, kernel_breakdown
from ..measure.results import target_row
from ..measure.ttft import CPU_INPUT_WORKLOADS
from ..measure.ttft import TARGETS as TTFT_TARGETS
from .frames import ms, part, pct, preset_label, records, render, table, times, verdict
from .plots_ttft import ttft_case
from .tables_encoder import BOTH_EAGER, BOTH_GRAPHED, by_mode
from .ttft_summary import parity_frame

REQUEST_ROLE = "request-3b"
KERNELS = "kernels: "  # every goal of the kernels' family starts so
# (goal, role, workload, field of its graphed row, limit)
KERNEL_GOALS = (
    (f"{KERNELS}450M 1x512 median ms", "bench-450m", "1x512", "median_ms", 0.60),
    (f"{KERNELS}450M 1x512 GPU-busy ms", "bench-450m", "1x512", "gpu_busy_ms", 0.50),
    (f"{KERNELS}450M 16x512 median ms", "bench-450m", "16x512", "median_ms", 6.0),
    (f"{KERNELS}1.6B tiled median ms", "bench-1.6b", "tiled", "median_ms", 13.0),
)
DECODE_MATCH = 1.05  # decode per token inside the TTFT grid within this factor of the engine's own
REPORT_DIR = Path(__file__).resolve().parent
REPORT_LIMIT_LINES = 1750  # half the ~3,500 lines that turned result files into pages when the goal was set
PROTOCOL_LIMIT = 12  # vLLM's SupportsEncoderCudaGraph has 11 methods; the kit's protocol adds its config
REPORT_GOAL = "the report layer (`lfm2vl_lab/report/`), lines"
RECORD_LIMIT_S = 600  # a full record of the kit's own roles fits in a third of a session's device time
# The set-up seconds the files record, by key; a bench row's ``capture_info`` splits its ``capture_s``
# by budget, so it is not walked, and rows of one capture repeat its value, so each value counts once.
SETUP_KEYS = {"compile_s": "compile", "compile_first_call_s": "compile", "capture_s": "capture"}


def kernel_goals(refs) -> list[dict]:
    out = []
    for name, role, workload, field, limit in KERNEL_GOALS:
        v = (by_mode(refs(role)["rows"]).get(("lab-graph", workload)) or {}).get(field)
        out.append(target_row(name, v, limit, v is not None and v <= limit))
    # 450M decode ms per token: one 512 px request of the TTFT grid (both graphed), the fused engine's
    grid = ttft_case(refs("ttft")["rows"], "lfm2-vl-450m", "1x512", 1).get(BOTH_GRAPHED, {}).get("decode_ms_per_token")
    eng = next((r["decode_ms_per_token"] for r in refs("engine")["rows"] if (r["preset"], r["mode"], r.get("requests"))
                == ("lfm2-vl-450m", "engine-fused", 1) and "error" not in r), None)
    ratio = grid / eng if grid and eng else None
    out.append(target_row(f"{KERNELS}450M decode per token in the TTFT grid / the engine's", ratio, DECODE_MATCH,
                          ratio is not None and ratio <= DECODE_MATCH,
                          f"{ms(grid)} against {ms(eng)} ms" if ratio else "not in the set's files"))
    return out


def _record_seconds(refs) -> list[tuple[float, str]]:
    """``(seconds, role)`` of each of the kit's own steps (vLLM's is timed apart), longest first."""
    from ..measure.record import STEPS

    files = refs.manifest["files"]
    return sorted(((files[s.role].get("seconds") or 0, s.role) for s in STEPS if s.role in files and not s.beside),
                  reverse=True)


def device_seconds(entries: list[dict]) -> tuple[float, list[dict]]:
    """The device seconds of manifest ``entries``, and the calls among them on several GPUs (``gpus``, their
    ``steps``' seconds, their ``span``): such a call costs its span, from its first step's start to its last's end."""
    alone, calls = 0.0, {}
    for e in entries:
        if (e.get("gpus") or 1) > 1:
            calls.setdefault(e["call"], []).append(e)
        else:
            alone += e.get("seconds") or 0
    spans = []
    for es in calls.values():
        ends = [datetime.fromisoformat(e["date"]) for e in es]
        ran = [(e.get("calls") or [e.get("seconds") or 0])[-1] for e in es]  # a resumed role: this call's part
        alone += sum((e.get("seconds") or 0) - r for e, r in zip(es, ran))  # and its earlier calls, as they were
        start = min(end - timedelta(seconds=r) for end, r in zip(ends, ran))
        spans.append({"gpus": max(e["gpus"] for e in es), "steps": sum(ran),
                      "span": (max(ends) - start).total_seconds()})
    return alone + sum(c["span"] for c in spans), spans


def record_goals(refs) -> list[dict]:
    secs = _record_seconds(refs)
    total, calls = device_seconds([refs.manifest["files"][r] for _, r in secs])
    return [target_row("a full record of the kit's own roles, steps in s", total, RECORD_LIMIT_S,
                       total <= RECORD_LIMIT_S, f"{len(secs)} roles" + "".join(
                           f"; on {c['gpus']} GPUs at once, {c['steps']:.0f} s of steps in {c['span']:.0f} s"
                           for c in calls))]


def setup_seconds(res: dict) -> dict[str, float]:
    """``{"compile": s, "capture": s}``: the distinct set-up seconds a result file records."""
    seen: dict[str, set] = {"compile": set(), "capture": set()}

    def walk(o) -> None:
        for k, v in (o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()):
            if k in SETUP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
                seen[SETUP_KEYS[k]].add(v)
            elif k != "capture_info":
                walk(v)

    walk(res)
    return {k: sum(v) for k, v in seen.items()}


def explain_record(refs) -> list:
    """Per step its seconds, the compiles and captures its file records, and the rest."""
    secs = _record_seconds(refs)
    setup = {r: setup_seconds(refs(r)) for _, r in secs}
    rows = [[f"`{r}`", v, setup[r]["compile"], setup[r]["capture"], v - sum(setup[r].values())] for v, r in secs]
    rows.append(["**all**", *(sum(col) for col in list(zip(*rows))[1:])])
    return table(["step", "seconds", "compiles recorded (s)", "captures recorded (s)", "the rest (s)"], [
        [step, f"{v:.0f}", *(ms(x, 0 if step == "**all**" else 1) if x else None for x in (c, k)), f"{rest:.0f}"]
        for step, v, c, k, rest in rows])


def _modules() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(REPORT_DIR.glob("*.py"))}


def code_goals(refs=None) -> list[dict]:
    """The two goals, judged on this tree (``refs`` is not read: the shape of the code is not a GPU result)."""
    from ..core.protocol import protocol_members

    mods = _modules()
    lines, members = sum(t.count("\n") for t in mods.values()), len(protocol_members())
    return [target_row(REPORT_GOAL, lines, REPORT_LIMIT_LINES, lines <= REPORT_LIMIT_LINES, f"{len(mods)} modules"),
            target_row("core's protocol (`EncoderGraphModel`), members", members, PROTOCOL_LIMIT,
                       members <= PROTOCOL_LIMIT, "vLLM's `SupportsEncoderCudaGraph`: 11 methods")]


def _request_goals(refs) -> list[dict]:
    from ..measure.request import goals_of  # judged under today's limits

    return goals_of(refs(REQUEST_ROLE))


# block -> (the family's goals, the roles they read; none: judged from the manifest, or from this tree)
GOALS = {"goals-encoder": (lambda refs: judge_targets(refs("bench-450m")["rows"], refs("bench-1.6b")["rows"]),
                           ("bench-450m", "bench-1.6b")),
         "goals-ttft": (lambda refs: refs("ttft").get("targets") or [], ("ttft",)),
         "goals-engine": (lambda refs: refs("engine").get("targets") or [], ("engine",)),
         "goals-request": (_request_goals, (REQUEST_ROLE,)),
         "goals-guard": (lambda refs: [t for p in refs("check")["presets"]  # the check run's verdicts, per preset
                                       for t in (p.get("model_changes") or {}).get("targets", [])], ("check",)),
         "goals-kernels": (kernel_goals, ("bench-450m", "bench-1.6b", "ttft", "engine")),
         "goals-record": (record_goals, ()), "goals-code": (code_goals, ())}


def _aim_and_value(t: dict) -> tuple[str, str]:
    """How a goal's limit and value read, units and direction taken from the goal's name."""
    name, v, lim = t["target"], t["value"], t["limit"]
    unit = ("µs" if name.endswith(" µs") else "MiB" if "MiB" in name else "s" if " in s" in name
            or name.endswith(" s") or "capture s" in name else "ms")
    fmt = (lambda x: f"{x:.0f} MiB") if unit == "MiB" else (lambda x: f"{ms(x)} {unit}")
    if name.endswith((" lines", " members")):
        aim, fmt = f"≤ {lim:,}", "{:,}".format
    elif isinstance(v, bool) or lim is True:
        aim, fmt = "all" if lim is True else str(lim), lambda x: "yes" if x else "no"
    elif name.startswith("fastest mode"):
        aim = f"< the next mode's {ms(lim)} ms ({t['detail'].removeprefix('next: ')})"
    elif " below " in name:  # faster than a peer in the same file
        aim = f"< {name.split(' below ')[1].split(',')[0]} {ms(lim)} ms"
    elif name.startswith("GPU-busy"):
        aim = f"≤ transformers' {ms(lim)} ms"
    elif "cut" in name:
        aim, fmt = f"≥ {pct(lim, 0)}", pct
    elif "speedup" in name:
        aim, fmt = f"≥ {lim:g}×", times
    elif "/" in name:
        aim, fmt = f"≤ {lim:g}×", lambda x: times(x, 2)
    else:
        aim = "–" if lim is None else f"≤ {lim:g} {unit}"
    return aim, "not measured" if v is None else fmt(v)


def goals_part(goals, roles):
    """One family's goals as a table and how many were reached, then their files (no roles: the manifest, or
    nothing for the goals judged on this tree). A long note is left to the misses' section that explains it."""
    def body(refs) -> list:
        judged = goals(refs)
        return [table(["goal", "aimed for", "measured", "reached", "note"], [
            [t["target"], *_aim_and_value(t), verdict(t["ok"]), None if t["target"].startswith("fastest mode")
             or len(t.get("detail") or "") > 60 else t.get("detail") or None] for t in judged]),
                f"{sum(t['ok'] for t in judged)} of {len(judged)} reached."
                + ("" if roles or goals is code_goals else f" {refs.source()}")]
    return part(roles, body)


# What explains each miss: a small table of the numbers, from the goal's own files

@cache  # one explanation per call, so that the goals it explains share one section
def graphed_call(role: str, workload: str):
    """The graphed encoder's call at ``workload`` in ``role``'s file: its median against its kernels' time,
    their largest classes, and the rest, gap by gap of its profiled call (:func:`~..measure.floor.idle_breakdown`)."""
    def explain(refs):
        by = by_mode(refs(role)["rows"])
        r = by[("lab-graph", workload)]
        hf, b, classes = by.get(("hf-eager", workload)) or {}, idle_breakdown(r), list(kernel_breakdown(r).items())[:3]
        return table(["what", "measured"], [
            [f"median call, lab-graph {workload} (transformers')",
             f"{b['median_us']:.0f} µs ({1000 * hf.get('median_ms', float('nan')):.0f} µs)"],
            [f"its {r['kernels']:.0f} kernels in {r['graph_launches']:.0f} graph launches (GPU-busy of one profiled "
             "call)", f"{1000 * r['gpu_busy_ms']:.0f} µs"],
            ["their largest classes", ", ".join(f"{c} {v['us']:.0f} µs in {v['count']}" for c, v in classes)],
            [f"idle between them: {b['n_gaps']} gaps (those not before an attention kernel: median "
             f"{b['other_median_us']:.2f} µs)", f"{b['gaps_us']:.0f} µs"],
            [f"of the idle: the {b['n_before']} gaps before an attention kernel", f"{b['before_us']:.0f} µs"],
            ["outside the kernels' span: the host side of the call", f"{b['outside_us']:.0f} µs"]])
    return explain


def explain_cpu_input(refs):
    """The image path's 450M rows at the goal's workloads, the upload split apart, and the µs the goal leaves."""
    lim, ip = TTFT_TARGETS["cpu_input_encode_ratio"], refs("ttft").get("image_path") or []
    split = {r["workload"]: r for r in ip if r["kind"] == "staging_split" and r.get("preset") == "lfm2-vl-450m"}
    return records([dict(r, side=split.get(r["workload"], {})) for r in ip if r["kind"] == "encode_sources"
                    and r.get("preset") == "lfm2-vl-450m" and r["workload"] in CPU_INPUT_WORKLOADS], {
        "LFM2-VL-450M": "workload", "from GPU input ms": ("gpu_ms_median", ms),
        "from CPU output ms": ("cpu_ms_median", ms), "host gather ms": ("side.gather_ms_median", lambda v: ms(v, 3)),
        "upload ms": ("side.upload_ms_median", lambda v: ms(v, 3)),
        "the goal leaves µs": lambda r: f"{1000 * (lim - 1) * r['gpu_ms_median']:.0f}"})


def explain_first_tokens(refs):
    """The parity cases where a mode's first token differs from ``generate``'s, with all-eager beside them:
    whether the differing token is float32's tells a swap by rounding from a wrong token."""
    df = parity_frame(refs("ttft"))
    if isinstance(df, str):  # the file has no parity section
        return df
    differs = df["first token"].eq("DIFFERS")
    case_differs = differs.groupby([df.preset, df.image, df.requests]).transform("any")
    return df[case_differs & (differs | df["mode"].eq(BOTH_EAGER))]


def explain_text_engine(refs):
    """The engine's profiled steps (their timed ms are the goals' values) against the weights' floor, and
    the first token's phases (``ttft``)."""
    res, rows = refs("engine"), []
    for s in res["setup"]:
        prof, floor = (res.get("profile") or {}).get(s["preset"]) or {}, s["floor"]
        rows += [[f"{preset_label(s['preset'])} `{m}`, {step.replace('_', ' ')}",
                  f"{p['kernels']:.0f} ({p['classes'].get('GEMM', 0)})", f"{ms(p['gpu_busy_ms'])} / {ms(p['wall_ms'])}"]
                 for step in ("decode_step", "prefill") for m in ("engine", "engine-fused")
                 if (p := (prof.get(m) or {}).get(step))]
        rows.append([f"the weights' floor per decode step ({floor['param_bytes'] / 1e9:.3f} GB at "
                     f"{floor['bandwidth_B_per_s'] / 1e12:.1f} TB/s)", None, f"{floor['floor_ms']:.3f}"])
    both = ttft_case(refs("ttft")["rows"], "lfm2-vl-450m", "1x512", 1).get(BOTH_GRAPHED) or {}
    return [table(["one request", "kernels (GEMMs)", "ms: GPU-busy / wall, or floor"], rows), both and (
        "One 512 px request, both graphed (`ttft`), ms: "
        + ", ".join(f"{k} {ms(v)}" for k, v in both["phases_ms"].items() if k != "processor") + ".")]


def explain_pr_capture(refs):
    """The PR's budget set's capture on the 3B budget by budget (``request-3b``; the goal gives their sum)."""
    setup = next(s for s in refs(REQUEST_ROLE)["setup"] if s.get("graph_config") == "pr" and s.get("encoder_capture"))
    return table([f"the PR's budgets, {preset_label(setup['preset'])}", "graphs", "capture s", "MiB"],
                 [[c["budget"], len(c["variants"]), ms(c["capture_s"]), f"{c['total_mb']:.0f}"]
                  for c in sorted(setup["encoder_capture"], key=lambda c: c["budget"])])


def explain_report_layer(refs=None):
    """Where the report layer's lines are: its modules by size, the largest first."""
    sizes = sorted(((t.count("\n"), name) for name, t in _modules().items()), reverse=True)
    return table(["module", "lines"], [[f"`{name}`", n] for n, name in sizes[:8]]
                 + ([[f"the other {len(sizes) - 8}", sum(n for n, _ in sizes[8:])]] if len(sizes) > 8 else []))


EXPLAIN = {  # how a goal's name starts (past "kernels: ") → what explains its miss
    "the PR's budget set captures": explain_pr_capture, "1x512 wall / GPU-busy": graphed_call("bench-450m", "1x512"),
    "encode() CPU input / GPU input": explain_cpu_input, "every mode's first tokens": explain_first_tokens,
    "every mode passes parity": explain_first_tokens, "TTFT ms, both graphed": explain_text_engine,
    "decode ms per token": explain_text_engine, "prefill+sample": explain_text_engine,
    "450M decode per token": explain_text_engine, "a full record": explain_record, REPORT_GOAL: explain_report_layer,
}


def explainer(target: str):
    """What explains a miss of ``target``: a median or GPU-busy goal of one encoder call, that call's
    :func:`graphed_call`; any other, by how its name starts (:data:`EXPLAIN`); None where nothing does."""
    name = target.removeprefix(KERNELS)
    if m := re.fullmatch(r"(450M|1\.6B) (\S+) (?:median|GPU-busy) ms", name):
        return graphed_call(f"bench-{m[1].lower()}", m[2])
    return next((f for k, f in EXPLAIN.items() if name.startswith(k)), None)


def misses_block(refs) -> str:
    """One short section per missed goal, headed by the goals it explains (the tables above give their values)."""
    groups: dict = {}
    for t in (t for goals, _ in GOALS.values() for t in goals(refs) if not t["ok"]):
        groups.setdefault(explainer(t["target"]), []).append(t["target"])
    return "\n\n".join(f"### {'; '.join(names[:3])}" + (f"; and {len(names) - 3} more" if len(names) > 3 else "")
                       + "\n\n" + (render(fn(refs)) if fn else "No explanation is generated for this goal yet.")
                       for fn, names in groups.items()) or "Every goal is reached in this reference set."


BLOCKS = {name: goals_part(goals, roles) for name, (goals, roles) in GOALS.items()} | {"misses": misses_block}
