"""The docs site's figures page: every committed figure of a GPU under the files its PNG names as its source
(:mod:`.figure_source`). A figure the reference set does not explain (one ``report`` does not draw, one
naming no source, or a source no longer the set's) is an error: the page would show it without its source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..measure.results import FIGURES_ROOT, REPO_ROOT, RESULTS_ROOT, gpu_slug, shown_command
from . import reference
from .figure_source import NoSource, read_sources
from .report import figure_jobs, reference_sets


class UnexplainedFigure(ValueError):
    """A committed figure that no recorded result file would draw, or whose PNG names a source that
    is not the reference set's."""


def figure_sources(gpu: str = "nvidia-h200", figures=FIGURES_ROOT, root=RESULTS_ROOT) -> list[tuple[Path, list[dict]]]:
    """Each ``<figures>/<gpu-slug>-*.png`` with the reference-set files its PNG names as its source;
    :class:`UnexplainedFigure` names every figure the set does not explain (see the module)."""
    slug = gpu_slug(gpu)
    if reference.load_manifest(gpu, root) is None:
        raise reference.ReferenceError(f"no reference set of {gpu}: no {reference.manifest_path(gpu, root)}")
    drawn = reference_sets(root, say=lambda *_: None).get(slug, {})  # what `report` draws, partial roles too
    stems = {stem for stem, _draw, _files in figure_jobs(drawn, slug)}
    out, why = [], []
    for png in sorted(Path(figures).glob(f"{slug}-*.png")):
        try:
            named = read_sources(png) if png.stem in stems else []
        except NoSource as exc:
            why.append(str(exc))
            continue
        if not named:
            why.append(f"{png.name}: the reference set under {root} does not draw it")
        for src in named:  # each must be the set's file for its role, recorded by the same code
            res = drawn.get(src.get("role"))
            if (has := res and (Path(res["_path"]).name, res.get("_code_hash"))) != (src["file"], src.get("code_hash")):
                why.append(f"{png.name} names {src['file']} (code {src.get('code_hash')}) as role {src.get('role')!r}, "
                           "the set's is " + ("{} (code {})".format(*has) if has else "absent"))
        out.append((png, [drawn.get(src["role"]) for src in named]))  # returned only where nothing is wrong
    if why:
        raise UnexplainedFigure("; ".join(why) + " (`python -m lfm2vl_lab report` redraws the figures from the set)")
    return out


def figures_page(sources: list[tuple[Path, list[dict]]], gpu: str = "nvidia-h200",
                 link: Callable[[Path], str] | None = None) -> str:
    """The figures page as Markdown: a section per set of source files, each file's provenance and command,
    then the figures drawn from them; ``link(path)``: a file's link (default: its path from the repo root)."""
    link = link or (lambda path: Path(path).resolve().relative_to(REPO_ROOT).as_posix())
    groups: dict[tuple, tuple[list[dict], list[Path]]] = {}
    for png, files in sources:
        groups.setdefault(tuple(r["_path"] for r in files), (files, []))[1].append(png)
    out = [f"# Figures and their sources ({gpu})", "", f"Every `{gpu_slug(gpu)}-*.png` in `data/figures/` under the "
           "result files its PNG names as its source, generated from those files when the site is built.", ""]
    for files, pngs in groups.values():
        out += ["## " + ", ".join(Path(r["_path"]).name for r in files), ""]
        for res in files:
            p, command, name = res["provenance"], shown_command(res["provenance"].get("command")), Path(res["_path"])
            facts = " · ".join(f"{'GPU' if k == 'gpu' else k} {p[k]}" for k in (
                "gpu", "torch", "transformers", "preset", "dtype", "date") if p.get(k) not in (None, ""))
            if res.get("_code_hash"):  # the code the manifest names for the role (the figure names it too)
                facts += f" · code `{res['_code_hash'].removeprefix('sha256:')[:12]}`"
            out += [f"- [`{name.name}`]({link(name)}) (reference set: `{res['_role']}`): {facts}  ",
                    f"  `{command}`" if command else "  no command recorded"]
        out.append("")
        for png in pngs:
            out += [f"### {png.stem}", "", f"[![{png.stem}]({link(png)})]({link(png)})", ""]
    return "\n".join(out)


def linked_files(sources: list[tuple[Path, list[dict]]]) -> list[Path]:
    """The figures and result files :func:`figures_page` links to (the site must carry them)."""
    return list({str(p): p for png, files in sources for p in (png, *(Path(r["_path"]) for r in files))}.values())
