"""``python -m lfm2vl_lab report``: every figure of the reference set as a PNG, each drawn from the file
of its role (named with its date in the title) and carrying that source in the PNG (:mod:`.figure_source`),
so a second ``report`` rewrites nothing. A figure without data is skipped and the reason printed;
``report --check`` fails on a committed figure the set does not explain (:func:`unexplained_figures`)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from ..measure.results import FIGURES_ROOT, RESULTS_ROOT, gpu_slug, recorded_tag
from . import reference
from .figure_source import NoSource, read_sources, save_figure, source_of
from .frames import pick_rows
from .plots import NoData, latency_figure, timeline_figure
from .plots_roofline import roofline_figure
from .plots_ttft import ttft_breakdown_figure, ttft_grid_figure
from .vllm_report import vllm_breakdown_figure, with_pipeline

GRAPHED = ("lab-graph", "lab-graph-fused", "compile")


def _timelines(rows: list[dict]) -> dict:
    """The first workload (1x512 first) with an eager and a graphed row that both have a timeline, as
    ``{label: timeline}``: transformers' eager path (the story's baseline; else the kit's) against the graphs."""
    with_tl = [r for r in pick_rows(rows) if any((r.get("timeline") or {}).get(lane) for lane in ("cpu", "gpu"))]
    for w in ["1x512"] + [r["workload"] for r in with_tl]:
        by = {r["mode"]: r for r in with_tl if r["workload"] == w}
        pair = [next((by[m] for m in modes if m in by), None) for modes in (("hf-eager", "lab-eager"), GRAPHED)]
        if all(pair):
            return {f"{r['mode']} · {w}": r["timeline"] for r in pair}
    raise NoData("no eager and graph rows with a profiler timeline for the same workload (bench --profile on a GPU)")


# Per role ("bench" for each bench-* file): {file suffix: (figure, short title)}. Those of WHOLE_FILE_ROLES
# draw from the whole file (vllm's with the kit's pipeline file beside it), the others from its rows.
FIGURES = {
    "bench": {"latency": (latency_figure, "Encoder latency per mode (whisker: p90)"),
              "timeline": (lambda rows, title: timeline_figure(_timelines(rows), title),
                           "One call: CPU launch calls vs GPU kernels")},
    "ttft": {"breakdown": (ttft_breakdown_figure, "Time to first token phase by phase, 1x512 x1"),
             "grid": (ttft_grid_figure, "Time to first token against requests")},
    "vllm": {"breakdown": (vllm_breakdown_figure, "Where the first token's time goes, vLLM and the kit's pipeline")},
    "roofline": {"": (roofline_figure, "A decode step's kernels under the GPU's roofs")},
}
WHOLE_FILE_ROLES = ("vllm", "roofline")


def figure_jobs(files: dict[str, dict], slug: str) -> list[tuple]:
    """Every figure of one GPU's reference set (``{role: file}``) as ``(file stem, a function drawing it,
    [the files it is drawn from])``, titled ``short — what`` over each source's ``recorded on <GPU> on
    <date> (<file>)``; drawing raises :class:`NoData` where the file holds nothing for it."""
    jobs = []
    for role, res in files.items():
        prov, kind = res.get("provenance", {}), "bench" if role.startswith("bench-") else role
        preset, dtype = prov.get("preset"), prov.get("dtype")
        stem, what = f"{slug}-{role}", dtype
        if kind == "bench":  # named by preset and dtype
            stem, what = f"{slug}-{preset}-{dtype}", f"{preset}, {dtype}"
        if role == "vllm":
            held = f" (partial: {', '.join(res.get('presets', {}))} so far)" if res.get("_partial") else ""
            what = f"vLLM {prov.get('vllm')}, {prov.get('dtype')}{held}"
            res = with_pipeline(res, files.get("pipeline"))
        sources = res.get("files", [res])
        data = res if role in WHOLE_FILE_ROLES else res.get("rows") or []
        for suffix, (make, short) in FIGURES.get(kind, {}).items():
            title = f"{short} — {what}\n" + "\n".join(recorded_tag(f) for f in sources)
            jobs.append((stem + (f"-{suffix}" if suffix else ""), partial(make, data, title=title), sources))
    return jobs


def reference_sets(root=RESULTS_ROOT, say=print) -> dict[str, dict[str, dict]]:
    """Per GPU slug, the reference set under ``root`` (``<root>/<gpu>/reference.json``) as ``{role:
    file}``, with the partial file of a resumable role not recorded whole; a role whose file cannot be
    read is left out, and ``say`` names it."""
    out = {}
    for man in sorted(Path(root).glob(f"*/{reference.MANIFEST}")):
        data = json.loads(man.read_text())
        gpu, files = data.get("gpu", man.parent.name), {}
        partial_roles = [r for r in data.get("partial", {}) if r in WHOLE_FILE_ROLES]
        for role in [*data.get("files", {}), *partial_roles]:  # in the order they were recorded
            try:
                files[role] = reference.load(role, gpu, root, partial=role in partial_roles)
            except (OSError, ValueError) as exc:
                say(f"skip role {role} of {man}: {type(exc).__name__}: {exc}")
        out[gpu_slug(gpu)] = files
    return out


def report(root=RESULTS_ROOT, out=FIGURES_ROOT, verbose: bool = True) -> list[Path]:
    """Draw every figure of the reference set(s) under ``root`` into ``out`` (:func:`figure_jobs`),
    skipping, with the reason, those without data; a file already there with the same content is kept,
    bytes and all. Returns the figures' paths."""
    say = print if verbose else (lambda *a, **k: None)
    sets = reference_sets(root, say)
    if not sets:
        say(f"report: no reference set under {root} (no */{reference.MANIFEST}; "
            "`python -m lfm2vl_lab record` on a GPU records one)")
        return []
    written = []
    for slug, files in sets.items():
        for stem, make, sources in figure_jobs(files, slug):
            try:
                fig = make()
            except NoData as exc:
                say(f"skip {stem}: {exc}")
                continue
            path = Path(out) / f"{stem}.png"
            say(f"{'wrote' if save_figure(fig, path, [source_of(r) for r in sources]) else 'unchanged'} {path}")
            written.append(path)
    return written


def unexplained_figures(figures=FIGURES_ROOT, root=RESULTS_ROOT) -> list[str]:
    """Why each ``<gpu-slug>-*.png`` in ``figures`` of a reference set under ``root`` is not what ``report``
    draws from that set: one it does not draw, or one whose PNG names other sources (files, roles or code)
    than ``report`` would write into it; empty where the set explains every figure."""
    why = []
    for slug, files in reference_sets(root, say=lambda *_: None).items():  # partial roles too, as `report` draws
        named = {stem: [source_of(r) for r in sources] for stem, _draw, sources in figure_jobs(files, slug)}
        for png in sorted(Path(figures).glob(f"{slug}-*.png")):
            try:
                if png.stem not in named:
                    why.append(f"{png.name}: the reference set under {root} does not draw it")
                elif (has := read_sources(png)) != named[png.stem]:
                    why.append(f"{png.name} names {has} as its sources, the set's are {named[png.stem]}")
            except NoSource as exc:  # a PNG that names no source at all
                why.append(str(exc))
    return why

