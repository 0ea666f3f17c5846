"""The docs site's figures page: every committed figure of a GPU under the provenance of the file it is
drawn from, which the PNG itself names (:mod:`.figure_source`). A figure the reference set does not
explain (one ``report`` does not draw, one naming no source, or a source no longer the set's) is an
error: the page would show a figure without its source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..measure.results import FIGURES_ROOT, REPO_ROOT, RESULTS_ROOT, gpu_slug, shown_command
from . import reference
from .figure_source import NoSource, read_sources
from .report import figure_jobs, reference_sets

# (label, provenance key): what the page shows of each source file, besides its name and command.
PROVENANCE_FIELDS = (("GPU", "gpu"), ("torch", "torch"), ("transformers", "transformers"), ("preset", "preset"),
                      ("dtype", "dtype"), ("date", "date"))


class UnexplainedFigure(ValueError):
    """A committed figure that no recorded result file would draw, or whose PNG names a source that
    is not the reference set's."""


def _stale(png: Path, src: dict, drawn: dict[str, dict]) -> str | None:
    """Why one ``Source`` entry of ``png`` is not the set's current file for its role (None: it is)."""
    res = drawn.get(src.get("role"))
    if res is None:
        return f"{png.name} is drawn from {src['file']} as role {src.get('role')!r}, which the set does not hold"
    if Path(res["_path"]).name != src["file"]:
        return f"{png.name} is drawn from {src['file']}, and the set's {src['role']!r} is {Path(res['_path']).name}"
    if res.get("_code_hash") != src.get("code_hash"):
        return f"{png.name} names code {src.get('code_hash')} for {src['file']}, the set {res.get('_code_hash')}"
    return None


def figure_sources(gpu: str = "nvidia-h200", figures=FIGURES_ROOT, root=RESULTS_ROOT) -> list[tuple[Path, list[dict]]]:
    """Each ``<figures>/<gpu-slug>-*.png`` with the reference-set files its PNG names as its source;
    :class:`UnexplainedFigure` names every figure the set does not explain (see the module)."""
    slug = gpu_slug(gpu)
    if reference.load_manifest(gpu, root) is None:
        raise reference.ReferenceError(f"no reference set of {gpu}: no {reference.manifest_path(gpu, root)}")
    drawn = reference_sets(root, say=lambda *_: None).get(slug, {})  # what `report` draws, partial roles too
    stems = {stem for stem, _draw, _files in figure_jobs(drawn, slug)}
    pngs = sorted(Path(figures).glob(f"{slug}-*.png"))
    if unexplained := [p.name for p in pngs if p.stem not in stems]:
        raise UnexplainedFigure(f"the reference set under {root} draws none of {', '.join(unexplained)} "
                                f"(`python -m lfm2vl_lab report` redraws the figures it explains)")
    out, stale = [], []
    for png in pngs:
        try:
            named = read_sources(png)
        except NoSource as exc:
            stale.append(str(exc))
            continue
        stale += [w for w in (_stale(png, src, drawn) for src in named) if w]
        out.append((png, [drawn.get(src["role"]) for src in named]))  # returned only where none is stale
    if stale:
        raise UnexplainedFigure("; ".join(stale) + " (`python -m lfm2vl_lab report` redraws them from the set)")
    return out


def figures_page(sources: list[tuple[Path, list[dict]]], gpu: str = "nvidia-h200",
                 link: Callable[[Path], str] | None = None) -> str:
    """The figures page as Markdown: a section per set of source files, headed by their names, listing each
    file's role, GPU, versions, preset, dtype, date, code hash and command, then each figure drawn from
    them; ``link(path)``: a figure's or file's link (default: its path from the repo root)."""
    link = link or (lambda path: Path(path).resolve().relative_to(REPO_ROOT).as_posix())
    groups: dict[tuple, tuple[list[dict], list[Path]]] = {}
    for png, files in sources:
        groups.setdefault(tuple(r["_path"] for r in files), (files, []))[1].append(png)
    out = [f"# Figures and their sources ({gpu})", "",
           f"Every `{gpu_slug(gpu)}-*.png` in `data/figures/`, as `python -m lfm2vl_lab report` drew it from the "
           "reference set, under the file it is drawn from: the file the PNG itself names (its `Source` text "
           "chunk, with the file's role and code hash). The lists are generated from those files when the site is "
           "built.", ""]
    for files, pngs in groups.values():
        out += ["## " + ", ".join(Path(r["_path"]).name for r in files), ""]
        for res in files:
            p, command = res["provenance"], shown_command(res["provenance"].get("command"))
            facts = " · ".join(f"{label} {p[key]}" for label, key in PROVENANCE_FIELDS if p.get(key) not in (None, ""))
            if res.get("_code_hash"):  # the code version the manifest names for the role (the figure names it too)
                facts += f" · code `{res['_code_hash'].removeprefix('sha256:')[:12]}`"
            role = f" (reference set: `{res['_role']}`)" if res.get("_role") else ""
            out.append(f"- [`{Path(res['_path']).name}`]({link(Path(res['_path']))}){role}: {facts}  \n"
                       + (f"  `{command}`" if command else "  no command recorded"))
        out.append("")
        for png in pngs:
            out += [f"### {png.stem}", "", f"[![{png.stem}]({link(png)})]({link(png)})", ""]
    return "\n".join(out)


def linked_files(sources: list[tuple[Path, list[dict]]]) -> list[Path]:
    """The figures and result files :func:`figures_page` links to (the site must carry them)."""
    return list({str(p): p for png, files in sources for p in (png, *(Path(r["_path"]) for r in files))}.values())
