"""``python -m lfm2vl_lab report``: every figure of the reference set as a PNG, each drawn from ONE file
of the set (named with its date in the title) and carrying that source in the PNG
(:mod:`.figure_source`), so a second ``report`` rewrites nothing. A figure without data is skipped
and the reason printed."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from ..measure.results import FIGURES_ROOT, RESULTS_ROOT, gpu_slug, recorded_tag
from . import reference
from .figure_source import save_figure, source_of
from .frames import pick_rows
from .plots import (
    NoData,
    attention_figure,
    count_nxs_workloads,
    floor_share_figure,
    graph_memory_figure,
    latency_figure,
    padding_waste_figure,
    speedup_figure,
    timeline_figure,
)
from .plots_roofline import boundary_figure, roofline_figure
from .plots_ttft import decode_figure, e2e_figure, ttft_breakdown_figure, ttft_grid_figure
from .tables import run_tables
from .vllm_report import vllm_breakdown_figure, vllm_cuts_figure, with_pipeline

BENCH_PREFIX = "bench-"  # roles of the per-preset benchmark runs
BUDGETS_ROLE = "sweep-budgets"  # the budget sweep: the padding-waste figure of its preset
SPECIAL_ROLES = {  # roles with figures of their own: role -> {file suffix: (figure, short title)}
    "e2e": {"": (e2e_figure, "Time to first token, transformers' image path vs the graphed encoder")},
    "attention": {"": (attention_figure, "Attention per layer inside CUDA graphs")},
    "ttft": {"breakdown": (ttft_breakdown_figure, "Time to first token phase by phase, 1x512 x1"),
             "grid": (ttft_grid_figure, "Time to first token against requests"),
             "decode": (decode_figure, "Decode per token against requests")},
}
# roles whose figures read the whole file rather than its rows: role -> {file suffix: (figure, short title)}
WHOLE_FILE_ROLES = {
    "vllm": {"cuts": (vllm_cuts_figure, "Encoder graphs inside vLLM and in the kit's pipeline: the cuts, paired"),
             "breakdown": (vllm_breakdown_figure, "Where the first token's time goes, vLLM and the kit's pipeline")},
    "roofline": {"": (roofline_figure, "A decode step's kernels under the GPU's roofs"),
                 "boundary": (boundary_figure, "A kernel boundary inside a graph, against an eager launch")},
}
VLLM_ROLE = "vllm"  # its whole-file figures draw the kit's pipeline file beside vLLM's
NO_TIMELINE = "no eager and graph rows with a profiler timeline for the same workload (bench --profile on a GPU)"


def _timeline_pair(rows: list[dict]):
    """The first workload (1x512 first) with an eager and a graphed row that both have a timeline:
    transformers' eager path against the graphed encoder where the file has them."""
    with_tl = [r for r in pick_rows(rows)
               if r.get("timeline") and (r["timeline"].get("cpu") or r["timeline"].get("gpu"))]
    for w in ["1x512"] + list(dict.fromkeys(r["workload"] for r in with_tl)):
        eager = [r for r in with_tl if r["workload"] == w and r["mode"] in ("lab-eager", "hf-eager")]
        graph = [r for r in with_tl if r["workload"] == w and r["mode"] in ("lab-graph", "lab-graph-fused", "compile")]
        if eager and graph:
            eager.sort(key=lambda r: r["mode"] != "hf-eager")  # transformers' eager path is the story's baseline
            graph.sort(key=lambda r: ("lab-graph", "lab-graph-fused", "compile").index(r["mode"]))
            return w, {f"{r['mode']} · {w}": r["timeline"] for r in (eager[0], graph[0])}
    return None, None


def capture_groups(rows: list[dict]) -> dict:
    """``{label: capture_info}`` per (mode, budget set) of one file's graph rows, as
    :func:`~.plots.graph_memory_figure` draws them (every workload of a mode reuses one capture)."""
    out: dict = {}
    for r in pick_rows(rows):
        if r.get("capture_info"):
            out.setdefault(f"{r['mode']}, budgets {r.get('budget_set', '?')}", r["capture_info"])
    return out


def _missing(reason: str):
    raise NoData(reason)


def _titled(short: str, what: str, res: dict) -> str:
    """A title that names the run: ``short — what`` over ``recorded on <GPU> on <date> (<file>)``."""
    return f"{short} — {what}\n{recorded_tag(res)}"


def _bench_jobs(slug: str, res: dict, budgets: dict) -> list[tuple]:
    """The figures of one preset's bench file ``res``; ``budgets``: the file of its padding-waste figure."""
    rows, p = res["rows"], res["provenance"]
    what = f"{p.get('preset')}, {p.get('dtype')}"
    tl_workload, tls = _timeline_pair(rows)
    waste = "Padding waste per budget set, stream of mixed requests (budget sweep)" if budgets is not res else \
        "Padding waste per workload (graph rows of the bench file)"
    plans = {
        "latency": (lambda: latency_figure(rows, _titled("Encoder latency per mode (whisker: p90)", what, res)), res),
        "speedup": (lambda: speedup_figure(rows, title=_titled("Speedup over hf-eager vs images per call", what, res))
                    if count_nxs_workloads(rows) >= 2
                    else _missing("needs at least two NxS workloads (e.g. --workload 1..16x512)"), res),
        "floor-share": (lambda: floor_share_figure(rows, _titled("Share of each call at the GPU-busy floor", what,
                                                                 res)), res),
        "timeline": (lambda: timeline_figure(tls, _titled(f"One call ({tl_workload}): CPU launch calls vs GPU kernels",
                                                          what, res)) if tls else _missing(NO_TIMELINE), res),
        "padding-waste": (lambda: padding_waste_figure(budgets["rows"], _titled(waste, what, budgets)), budgets),
        "graph-memory": (lambda: graph_memory_figure(capture_groups(rows), _titled(
            "Graph memory and capture time per budget (lab-graph rows of the bench file)", what, res)), res),
    }
    return [(f"{slug}-{p.get('preset')}-{p.get('dtype')}-{kind}", draw, [src]) for kind, (draw, src) in plans.items()]


def figure_jobs(files: dict[str, dict], slug: str) -> list[tuple]:
    """Every figure of one GPU's reference set (``{role: file}``) as ``(file stem, a function drawing it,
    [the file it is drawn from])``; drawing raises :class:`NoData` where the file holds nothing for it."""
    jobs = []
    for role, res in files.items():
        if role.startswith(BENCH_PREFIX) and res.get("rows"):
            sweep, preset = files.get(BUDGETS_ROLE), res["provenance"].get("preset")
            budgets = sweep if sweep and preset is not None and sweep["provenance"].get("preset") == preset else res
            jobs += _bench_jobs(slug, res, budgets)
        whole, prov = role in WHOLE_FILE_ROLES, res.get("provenance", {})
        held = f" (partial: {', '.join(res.get('presets', {}))} so far)" if res.get("_partial") else ""
        vllm = role == VLLM_ROLE
        what = f"vLLM {prov.get('vllm')}, {prov.get('dtype')}{held}" if vllm else prov.get("dtype")
        # a whole-file figure of vLLM's A/B draws the kit's pipeline file beside it, and names both
        drawn = with_pipeline(res, files.get("pipeline")) if vllm else res
        sources = drawn.get("files", [res])
        for suffix, (make_fig, short) in {**SPECIAL_ROLES, **WHOLE_FILE_ROLES}.get(role, {}).items():
            title = f"{short} — {what}\n" + "\n".join(recorded_tag(f) for f in sources)
            jobs.append((f"{slug}-{role}" + (f"-{suffix}" if suffix else ""),
                         partial(make_fig, drawn if whole else res.get("rows") or [], title=title), sources))
    return jobs


def reference_sets(root=RESULTS_ROOT, say=print) -> dict[str, dict[str, dict]]:
    """Per GPU slug, the reference set under ``root`` (``<root>/<gpu>/reference.json``) as ``{role:
    file}``; a role whose file cannot be read is left out, and ``say`` names it."""
    out = {}
    for man in sorted(Path(root).glob(f"*/{reference.MANIFEST}")):
        gpu = json.loads(man.read_text()).get("gpu", man.parent.name)
        files = {}
        partial = [r for r in json.loads(man.read_text()).get("partial", {}) if r in WHOLE_FILE_ROLES]
        for role in [*reference.roles(gpu, root), *partial]:  # a resumable role's partial file, labelled
            try:
                files[role] = reference.load(role, gpu, root, partial=role in partial)
            except (OSError, ValueError) as exc:
                say(f"skip role {role} of {man}: {type(exc).__name__}: {exc}")
        out[gpu_slug(gpu)] = files
    return out


def _save(fig, path: Path, files: list[dict], written: list[Path], say) -> None:
    """Save one figure with its source files in the PNG (:mod:`lfm2vl_lab.report.figure_source`); a
    file already there with the same content is kept, bytes and all."""
    changed = save_figure(fig, path, [source_of(res) for res in files])
    written.append(path)
    say(f"{'wrote' if changed else 'unchanged'} {path}")


def report(root=RESULTS_ROOT, out=FIGURES_ROOT, verbose: bool = True) -> list[Path]:
    """Draw every figure of the reference set(s) under ``root`` into ``out`` (:func:`figure_jobs`),
    skipping, with the reason, those without data. Returns the figures' paths."""
    say = print if verbose else (lambda *a, **k: None)
    sets = reference_sets(root, say)
    if not sets:
        say(f"report: no reference set under {root} (no */{reference.MANIFEST}; "
            "`python -m lfm2vl_lab record` on a GPU records one)")
        return []
    out = Path(out)  # made by the first figure saved
    written: list[Path] = []
    for slug, files in sets.items():
        for stem, make, sources in figure_jobs(files, slug):
            try:
                fig = make()
            except NoData as exc:
                say(f"skip {stem}: {exc}")
                continue
            _save(fig, out / f"{stem}.png", sources, written, say)
    return written


def derive_set(man: dict, before: str, out, repo_root, say=print) -> None:
    """After ``record``: redraw the figures and generated pages when the call changed a role (``before``:
    the manifest's files as they were) or completed the set, and only where it wrote into the repo's
    results (files recorded elsewhere are derived when ``record --take`` brings them in)."""
    from types import SimpleNamespace

    from . import tables  # through the module: a test stands in for its run_tables

    changed = json.dumps([man["files"], man.get("partial")]) != before
    if not (changed or man.get("complete")) or Path(out).resolve() != Path(repo_root).resolve():
        return
    figures = Path(repo_root).parent / "figures"
    try:  # the recorded files and the manifest stand whatever happens here: `report` can redo this
        tables.run_tables(SimpleNamespace(root=str(out), tables_only=False, check=False))
        say(f"figures: {len(report(out, figures, verbose=False))} drawn from the set into {figures}")
    except Exception as exc:
        say(f"figures and tables: not redrawn ({type(exc).__name__}: {exc}); `python -m lfm2vl_lab report` redoes it")


def run_report_cli(args) -> int:
    """Draw every figure of the reference set, and rewrite the docs' tables from it."""
    tables = run_tables(args)  # from the reference set under --root (report/tables.py)
    if args.tables_only or args.check:
        return tables
    return (0 if report(args.root, args.out) else 1) or tables
