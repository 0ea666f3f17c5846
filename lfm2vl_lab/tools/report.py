"""``python -m lfm2vl_lab report``: every figure the stored results have data for, as PNGs.

Benchmark rows are grouped by (GPU, preset, dtype), and each group gets the figures of
:mod:`lfm2vl_lab.tools.plots` it has data for; end-to-end and attention-probe files get a figure
of their own per GPU, TTFT files three (:mod:`lfm2vl_lab.tools.plots_ttft`: the phase breakdown at
one 512 px request, TTFT and decode per token against requests). A figure without data is skipped
and the reason printed.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from pathlib import Path

from .plots import (
    DEFAULT_GRAPH_CONFIG,
    NoData,
    attention_figure,
    count_nxs_workloads,
    e2e_figure,
    floor_share_figure,
    graph_memory_figure,
    latency_figure,
    padding_waste_figure,
    pick_rows,
    speedup_figure,
    timeline_figure,
)
from .plots_ttft import decode_figure, ttft_breakdown_figure, ttft_grid_figure
from .results import FIGURES_ROOT, RESULTS_ROOT, gpu_slug, load_results
from .tables import add_table_args, run_tables

SPECIAL_RESULTS = {  # results with figures of their own: name -> {file suffix: (figure, short title)}
    "e2e": {"": (e2e_figure, "Time to first token, transformers' image path vs graphed encoder")},
    "attention": {"": (attention_figure, "Attention per layer inside CUDA graphs")},
    "ttft": {"breakdown": (ttft_breakdown_figure, "Time to first token phase by phase, 1x512 x1"),
             "grid": (ttft_grid_figure, "Time to first token against requests"),
             "decode": (decode_figure, "Decode per token against requests")},
}


def _groups(results: list[dict]) -> dict:
    """Rows of all results grouped by (gpu slug, preset, dtype), later results' rows later; each
    group is ``(rows, the result files those rows come from)``."""
    groups: dict = OrderedDict()
    for res in results:
        slug = gpu_slug(str(res["provenance"].get("gpu", "unknown")))
        for r in res["rows"]:
            prov = res["provenance"]
            key = (slug, r.get("preset", prov.get("preset")), r.get("dtype", prov.get("dtype")))
            rows, files = groups.setdefault(key, ([], []))
            rows.append(r)
            if not files or files[-1] is not res:
                files.append(res)
    return groups


def _timeline_pair(rows: list[dict]):
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


def _capture_groups(rows: list[dict]) -> dict:
    out = OrderedDict()
    for r in rows:
        if r.get("capture_info"):
            extra = "" if (r.get("cu_rule"), r.get("max_seqlen_mode")) == DEFAULT_GRAPH_CONFIG[1:] else \
                f" {r.get('cu_rule')}/{r.get('max_seqlen_mode')}"
            out[f"{r['mode']} [{r.get('budget_set', '?')}]{extra}"] = r["capture_info"]
    return out


def newest_per_preset(results: list[dict]) -> dict:
    """Result files (oldest first) → per GPU slug: (the files used, oldest first; their rows), where
    each preset's rows come from the newest file that has that preset. Sessions record one preset
    per run, so the newest figure of several presets is drawn from several files."""
    per_gpu: dict = {}
    for res in results:  # newer files replace a preset's rows
        slot = per_gpu.setdefault(gpu_slug(str(res["provenance"].get("gpu"))), {})
        for preset in dict.fromkeys(row.get("preset") for row in res["rows"]):
            slot[preset] = (res, [row for row in res["rows"] if row.get("preset") == preset])
    out = {}
    for slug, by_preset in per_gpu.items():
        files = sorted({id(r): r for r, _ in by_preset.values()}.values(),
                       key=lambda r: str(r["provenance"].get("date")))
        out[slug] = (files, [row for _, rows in by_preset.values() for row in rows])
    return out


def _missing(reason: str):
    raise NoData(reason)


def _figure_plans(rows: list[dict], label: str) -> dict:
    """Figure kind → a function drawing it for one (GPU, preset, dtype) group of rows."""
    tl_workload, tls = _timeline_pair(rows)
    no_timeline = "no eager and graph rows with a profiler timeline for the same workload (bench --profile on a GPU)"
    return {
        "latency": lambda: latency_figure(rows, f"Encoder latency per mode — {label} (whisker: p90)"),
        "speedup": lambda: speedup_figure(rows, title=f"Speedup over hf-eager vs images — {label}"),
        "floor-share": lambda: floor_share_figure(rows, f"Share of each call at the GPU-busy floor — {label}"),
        "timeline": lambda: timeline_figure(tls, f"One call ({tl_workload}): CPU launch calls vs GPU kernels — {label}")
        if tls else _missing(no_timeline),
        "padding-waste": lambda: padding_waste_figure(rows, f"Padding waste per budget set — {label}"),
        "graph-memory": lambda: graph_memory_figure(_capture_groups(rows), f"Graph memory per budget — {label}"),
    }


def _save(fig, path: Path, written: list[Path], say) -> None:
    fig.savefig(path, dpi=120)
    written.append(path)
    say(f"wrote {path}")


def _special_jobs(results: list[dict]) -> list[tuple]:
    """e2e, attention-probe and TTFT files get figures of their own (``<slug>-<name>[-<suffix>]``):
    per GPU, each preset's rows from the newest file that has that preset (one run per preset is the
    usual way to record them)."""
    jobs = []
    for name, figures in SPECIAL_RESULTS.items():
        for slug, (files, rows) in newest_per_preset([r for r in results if r.get("name") == name]).items():
            p = files[-1]["provenance"]
            dates = sorted({str(f["provenance"].get("date"))[:10] for f in files})
            for suffix, (make_fig, short) in figures.items():
                stem = f"{slug}-{name}" + (f"-{suffix}" if suffix else "")
                title = f"{short} — {p.get('gpu')}, {', '.join(dates)}, {p.get('dtype')}"
                jobs.append((stem, partial(make_fig, rows, title=title), files))
    return jobs


def figure_jobs(results: list[dict]) -> list[tuple]:
    """Every figure :func:`report` may draw from ``results`` (benchmark-shaped, oldest first), as
    ``(file stem, a function drawing it, the result files whose rows it draws)``. Drawing raises
    :class:`NoData` when the rows hold nothing for that figure. The docs site's results page reads
    the third item: which files a committed figure comes from."""
    jobs = _special_jobs(results)
    plain = [r for r in results if r.get("name") not in SPECIAL_RESULTS]
    for (slug, preset, dtype), (rows, files) in _groups(plain).items():
        prefix = f"{slug}-{preset}-{dtype}"
        for kind, make in _figure_plans(rows, f"{preset}, {dtype}, {slug}").items():
            if kind == "speedup" and count_nxs_workloads(rows) < 2:
                make = partial(_missing, "needs at least two NxS workloads (e.g. --workload 1..16x512)")
            jobs.append((f"{prefix}-{kind}", make, files))
    return jobs


def report(root="data/results", out="data/figures", verbose: bool = True) -> list[Path]:
    """Regenerate every figure the results under ``root`` have data for; write PNGs to ``out``.

    Rows are grouped by (GPU, preset, dtype); one set of figures per group, named
    ``<gpu-slug>-<preset>-<dtype>-<figure>.png``. A figure without data is skipped and the reason
    printed. Returns the paths written.
    """
    results = load_results(root, rows_only=True)
    say = print if verbose else (lambda *a, **k: None)
    if not results:
        say(f"report: no result JSON under {root}")
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, make, _files in figure_jobs(results):
        try:
            fig = make()
        except NoData as exc:
            say(f"skip {stem}: {exc}")
            continue
        _save(fig, out / f"{stem}.png", written, say)
    return written


def add_report_args(p) -> None:
    """Options of ``python -m lfm2vl_lab report``. The defaults are the repo's own folders, wherever
    the command runs from (figures of CPU results land in ``data/figures/cpu-*``, which git ignores)."""
    p.add_argument("--root", default=str(RESULTS_ROOT), help="results root to read (default: data/results)")
    p.add_argument("--out", default=str(FIGURES_ROOT),
                   help="folder for the PNGs (default: data/figures)")
    add_table_args(p)  # --tables-only, --check: the generated tables of README.md and docs/*.md


def run_report_cli(args) -> int:
    """Draw every figure the stored benchmark results have data for, and rewrite the docs' tables."""
    tables = run_tables(args)  # from the reference set under --root (tools/tables.py)
    if args.tables_only or args.check:
        return tables
    return (0 if report(args.root, args.out) else 1) or tables
