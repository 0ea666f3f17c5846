"""The docs site's figures page (lfm2vl_lab.tools.site): each committed figure with the one file of the
reference set it is drawn from, its provenance read from the JSON when the page is built; and the
committed figures themselves: one run each, named in the title, sized for a page."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from lfm2vl_lab.tools import reference
from lfm2vl_lab.tools.plots import MAX_WIDTH_IN, NoData
from lfm2vl_lab.tools.report import figure_jobs, reference_sets
from lfm2vl_lab.tools.results import FIGURES_ROOT, RESULTS_ROOT, shown_command
from lfm2vl_lab.tools.site import UnexplainedFigure, figure_sources, figures_page, linked_files

PNGS = sorted(FIGURES_ROOT.glob("nvidia-h200-*.png"))
DPI = 120  # what `python -m lfm2vl_lab report` saves at


@pytest.fixture(scope="module")
def committed():
    return figure_sources("nvidia-h200")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path.name
    return struct.unpack(">II", data[16:24])


def test_every_committed_figure_comes_from_one_file_of_the_reference_set(committed):
    assert PNGS and [p for p, _ in committed] == PNGS
    man = reference.load_manifest()
    # a resumable role's partial file (vLLM's) is drawn too, and says so in its title
    roles = {**man["files"], **man.get("partial", {})}
    for png, files in committed:
        assert len(files) == 1, png.name  # one run per figure
        (res,) = files
        name = Path(res["_path"]).name
        assert roles[res["_role"]]["file"] == name, png.name
        assert bool(res.get("_partial")) == (res["_role"] in man.get("partial", {})), png.name
        assert res["provenance"]["gpu"] == "NVIDIA H200", png.name
    by_stem = {p.stem: files[0]["_role"] for p, files in committed}
    assert {by_stem[f"nvidia-h200-ttft-{k}"] for k in ("breakdown", "grid", "decode")} == {"ttft"}
    assert by_stem["nvidia-h200-e2e"] == "e2e" and by_stem["nvidia-h200-attention"] == "attention"
    for preset, role in (("lfm2-vl-450m", "bench-450m"), ("lfm2-vl-1.6b", "bench-1.6b")):
        for kind in ("latency", "speedup", "floor-share", "timeline", "graph-memory"):
            assert by_stem[f"nvidia-h200-{preset}-bfloat16-{kind}"] == role, kind
    # a preset's padding waste: the budget sweep where the reference set has one of that preset
    budgets = reference.load("sweep-budgets")["provenance"]["preset"]
    for preset, role in (("lfm2-vl-450m", "bench-450m"), ("lfm2-vl-1.6b", "bench-1.6b")):
        want = "sweep-budgets" if preset == budgets else role
        assert by_stem[f"nvidia-h200-{preset}-bfloat16-padding-waste"] == want


def test_every_committed_figure_fits_a_page():
    for png in PNGS:
        width, height = png_size(png)
        assert width <= MAX_WIDTH_IN * DPI and height <= 14 * DPI, (png.name, width, height)


def test_every_figure_names_its_file_and_date_and_has_labelled_axes():
    """Each figure the report draws from the reference set, drawn again: its title names the file and
    the date of the run, each plot has a labelled y axis and the figure a legend."""
    jobs = figure_jobs(reference_sets()["nvidia-h200"], "nvidia-h200")  # what `report` draws
    assert {stem for stem, _, _ in jobs} >= {p.stem for p in PNGS}
    for stem, draw, (res,) in jobs:
        try:
            fig = draw()
        except NoData:
            assert stem not in {p.stem for p in PNGS}, stem
            continue
        title = fig.get_suptitle()
        assert Path(res["_path"]).name in title.replace("\n", " ") and res["provenance"]["date"][:10] in title, stem
        assert fig.get_figwidth() <= MAX_WIDTH_IN, stem
        plots = [ax for ax in fig.axes if ax.has_data()]
        assert plots and all(ax.get_ylabel() or ax.get_yticklabels() for ax in plots), stem
        assert fig.legends or any(ax.get_legend() for ax in fig.axes), stem


def test_page_gives_each_source_files_provenance(committed):
    page = figures_page(committed)
    lines = page.splitlines()
    for png, files in committed:
        assert f"](data/figures/{png.name})" in page
        for f in files:
            p, name = f["provenance"], Path(f["_path"]).name
            i = next(i for i, line in enumerate(lines) if line.startswith(f"- [`{name}`]("))
            assert f"(reference set: `{f['_role']}`)" in lines[i]
            keys = [k for k in ("torch", "transformers", "dtype", "date") if p.get(k)]
            assert keys and all(f"{k} {p[k]}" in lines[i] for k in keys), lines[i]
            assert f"GPU {p['gpu']}" in lines[i] and lines[i + 1] == f"  `{shown_command(p['command'])}`"
    # figures drawn from the same file share one section (one provenance list)
    assert page.count("\n## ") == len({files[0]["_path"] for _, files in committed})
    # a figure's name heads the page once: a section of one figure has no sub-heading of the same name
    for png, _ in committed:
        assert sum(1 for line in lines if line.startswith("#") and line.endswith(png.stem)) <= 1, png.stem
    assert {Path(p).resolve() for p in linked_files(committed)} >= {p.resolve() for p, _ in committed}


def test_page_is_generated_from_the_json(tmp_path):
    """Change a result file and the page says what the file says (the command without its --out)."""
    res = {k: v for k, v in reference.load("attention").items() if not k.startswith("_")}
    res["provenance"].update(torch="9.9.9+test", command="python -m lfm2vl_lab attention --out /somewhere/else")
    folder = tmp_path / "results" / "nvidia-h200"
    folder.mkdir(parents=True)
    (folder / "attention-x.json").write_text(json.dumps(res))
    manifest = {"gpu": "NVIDIA H200", "code_hash": "sha256:" + "0" * 64,
                "files": {"attention": {"file": "attention-x.json"}}}
    (folder / reference.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "figures").mkdir()
    shutil.copy(FIGURES_ROOT / "nvidia-h200-attention.png", tmp_path / "figures")
    sources = figure_sources("nvidia-h200", tmp_path / "figures", tmp_path / "results")
    page = figures_page(sources, link=lambda path: Path(path).name)
    assert "torch 9.9.9+test ·" in page and "  `python -m lfm2vl_lab attention`\n" in page
    assert "(reference set: `attention`)" in page
    assert "/somewhere/else" not in page and "[![nvidia-h200-attention](nvidia-h200-attention.png)]" in page
    # a file beside the manifest that it does not name explains no figure
    (folder / reference.MANIFEST).write_text(json.dumps({"gpu": "NVIDIA H200", "code_hash": "sha256:0", "files": {}}))
    with pytest.raises(UnexplainedFigure, match="nvidia-h200-attention.png"):
        figure_sources("nvidia-h200", tmp_path / "figures", tmp_path / "results")


def test_a_figure_without_a_source_file_is_an_error(tmp_path):
    (tmp_path / "figures").mkdir()
    shutil.copy(FIGURES_ROOT / "nvidia-h200-attention.png", tmp_path / "figures" / "nvidia-h200-made-up.png")
    with pytest.raises(UnexplainedFigure, match=re.escape("nvidia-h200-made-up.png")):
        figure_sources("nvidia-h200", tmp_path / "figures", RESULTS_ROOT)
    with pytest.raises(reference.ReferenceError, match="no reference set"):
        figure_sources("nvidia-h200", tmp_path / "figures", tmp_path / "no-results")
