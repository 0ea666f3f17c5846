"""The docs site's figures page (``make docs``): every committed figure of a GPU, with the provenance
of the result files it is drawn from, written at build time from ``data/results/`` (no number on the
page is typed by hand).

Which files a figure comes from is :func:`lfm2vl_lab.tools.report.figure_jobs`' answer, the same list
``python -m lfm2vl_lab report`` draws the figures from. A committed figure that no result file explains
is an error: the page would otherwise show a figure without its source.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .report import figure_jobs
from .results import FIGURES_ROOT, RESULTS_ROOT, gpu_slug, load_results, shown_command

REPO_ROOT = RESULTS_ROOT.parents[1]
# (label, provenance key): what the page shows of each source file, besides its name and command.
PROVENANCE_FIELDS = (("GPU", "gpu"), ("torch", "torch"), ("transformers", "transformers"), ("preset", "preset"),
                      ("dtype", "dtype"), ("date", "date"))


class UnexplainedFigure(ValueError):
    """A committed figure that no recorded result file would draw."""


def figure_sources(gpu: str = "nvidia-h200", figures=FIGURES_ROOT, root=RESULTS_ROOT) -> list[tuple[Path, list[dict]]]:
    """Each ``<figures>/<gpu-slug>-*.png`` (sorted by name) with the result files it is drawn from
    (loaded with :func:`~lfm2vl_lab.tools.results.load_results`, oldest first, each with ``_path``).

    Raises :class:`UnexplainedFigure` naming every figure that no file under ``root`` explains.
    """
    sources = {stem: files for stem, _draw, files in figure_jobs(load_results(root, rows_only=True))}
    pngs = sorted(Path(figures).glob(f"{gpu_slug(gpu)}-*.png"))
    unexplained = [p.name for p in pngs if p.stem not in sources]
    if unexplained:
        raise UnexplainedFigure(f"no result file under {root} draws {', '.join(unexplained)} "
                                f"(`python -m lfm2vl_lab report` redraws the figures the results explain)")
    return [(p, sources[p.stem]) for p in pngs]


def provenance_list(files: list[dict], link: Callable[[Path], str]) -> str:
    """Markdown: one item per file: its name (linked), GPU, versions, preset, dtype and date, then the
    command that made it (without ``--out``, see :func:`~lfm2vl_lab.tools.results.shown_command`)."""
    items = []
    for res in files:
        p, path = res["provenance"], Path(res["_path"])
        facts = " · ".join(f"{label} {p[key]}" for label, key in PROVENANCE_FIELDS if p.get(key) not in (None, ""))
        command = shown_command(p.get("command"))
        items.append(f"- [`{path.name}`]({link(path)}): {facts}  \n"
                     + (f"  `{command}`" if command else "  no command recorded"))
    return "\n".join(items)


def _group_heading(pngs: list[Path]) -> str:
    """``nvidia-h200-ttft: breakdown, decode, grid`` for figures sharing a prefix; one figure: its stem."""
    stems = [p.stem for p in pngs]
    if len(stems) == 1:
        return stems[0]
    prefix = os.path.commonprefix(stems)
    prefix = prefix[:prefix.rfind("-") + 1] if not prefix.endswith("-") else prefix
    return f"{prefix.rstrip('-')}: " + ", ".join(s[len(prefix):] for s in stems)


def figures_page(sources: list[tuple[Path, list[dict]]], gpu: str = "nvidia-h200",
                 link: Callable[[Path], str] | None = None) -> str:
    """The figures page as Markdown, from :func:`figure_sources`' answer: figures drawn from the same
    files share a section, which lists those files' provenance. ``link(path)`` is the page's
    link to a figure or result file (default: its path from the repository root, where the docs site
    puts it)."""
    link = link or (lambda path: Path(path).resolve().relative_to(REPO_ROOT).as_posix())
    groups: dict[tuple, tuple[list[dict], list[Path]]] = {}
    for png, files in sources:
        groups.setdefault(tuple(r["_path"] for r in files), (files, []))[1].append(png)
    out = [f"# Figures and their sources ({gpu})", "",
           f"Every `{gpu_slug(gpu)}-*.png` in `data/figures/`, as `python -m lfm2vl_lab report` drew it, under the "
           "result files it is drawn from. The tables are generated from those files when the site is built.", ""]
    for files, pngs in groups.values():
        out += [f"## {_group_heading(pngs)}", "", f"Drawn from {len(files)} result file(s):", "",
                provenance_list(files, link), ""]
        for png in pngs:
            out += [f"### {png.stem}", "", f"[![{png.stem}]({link(png)})]({link(png)})", ""]
    return "\n".join(out)


def linked_files(sources: list[tuple[Path, list[dict]]]) -> list[Path]:
    """The figures and result files :func:`figures_page` links to (the site must carry them)."""
    out: dict[str, Path] = {}
    for png, files in sources:
        out[str(png)] = png
        out.update({r["_path"]: Path(r["_path"]) for r in files})
    return list(out.values())
