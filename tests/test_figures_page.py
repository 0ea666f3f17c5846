"""The docs site's figures page (lfm2vl_lab.tools.site): each committed figure with the result files
it is drawn from, their provenance read from the JSON when the page is built."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lfm2vl_lab.tools.results import FIGURES_ROOT, RESULTS_ROOT, shown_command
from lfm2vl_lab.tools.site import UnexplainedFigure, figure_sources, figures_page, linked_files

ATTENTION = RESULTS_ROOT / "nvidia-h200" / "attention-20261201-012210.json"


@pytest.fixture(scope="module")
def committed():
    return figure_sources("nvidia-h200")


def test_every_committed_figure_is_explained(committed):
    pngs = sorted(FIGURES_ROOT.glob("nvidia-h200-*.png"))
    assert pngs and [p for p, _ in committed] == pngs
    for png, files in committed:
        assert files, png.name
        assert all(f["provenance"]["gpu"] == "NVIDIA H200" for f in files), png.name
    by_name = {p.stem: [Path(f["_path"]).name for f in files] for p, files in committed}
    # a TTFT figure is drawn from TTFT files only, a benchmark group from its preset's files only
    assert all(n.startswith("ttft-") for n in by_name["nvidia-h200-ttft-grid"])
    group = next(files for p, files in committed if p.stem == "nvidia-h200-lfm2-vl-1.6b-bfloat16-latency")
    assert all(any(r.get("preset", f["provenance"].get("preset")) == "lfm2-vl-1.6b" for r in f["rows"]) for f in group)


def test_page_gives_each_source_files_provenance(committed):
    page = figures_page(committed)
    for png, files in committed:
        assert f"](data/figures/{png.name})" in page
        for f in files:
            p, name = f["provenance"], Path(f["_path"]).name
            lines = page.splitlines()
            i = next(i for i, line in enumerate(lines) if line.startswith(f"- [`{name}`]("))
            keys = [k for k in ("torch", "transformers", "dtype", "date") if p.get(k)]
            assert keys and all(f"{k} {p[k]}" in lines[i] for k in keys), lines[i]
            assert f"GPU {p['gpu']}" in lines[i] and lines[i + 1] == f"  `{shown_command(p['command'])}`"
    # figures drawn from the same files share one section (one provenance list)
    assert page.count("\n## ") == len({tuple(f["_path"] for f in files) for _, files in committed})
    assert {Path(p).resolve() for p in linked_files(committed)} >= {p.resolve() for p, _ in committed}


def test_page_is_generated_from_the_json(tmp_path):
    """Change a result file and the page says what the file says (the command without its --out)."""
    res = json.loads(ATTENTION.read_text())
    res["provenance"].update(torch="9.9.9+test", command="python -m lfm2vl_lab attention --out /somewhere/else")
    (tmp_path / "results" / "nvidia-h200").mkdir(parents=True)
    (tmp_path / "results" / "nvidia-h200" / ATTENTION.name).write_text(json.dumps(res))
    (tmp_path / "figures").mkdir()
    shutil.copy(FIGURES_ROOT / "nvidia-h200-attention.png", tmp_path / "figures")
    sources = figure_sources("nvidia-h200", tmp_path / "figures", tmp_path / "results")
    page = figures_page(sources, link=lambda path: Path(path).name)
    assert "torch 9.9.9+test ·" in page and "  `python -m lfm2vl_lab attention`\n" in page
    assert "/somewhere/else" not in page and "[![nvidia-h200-attention](nvidia-h200-attention.png)]" in page


def test_a_figure_without_a_source_file_is_an_error(tmp_path):
    (tmp_path / "figures").mkdir()
    shutil.copy(FIGURES_ROOT / "nvidia-h200-attention.png", tmp_path / "figures" / "nvidia-h200-made-up.png")
    with pytest.raises(UnexplainedFigure, match=re.escape("nvidia-h200-made-up.png")):
        figure_sources("nvidia-h200", tmp_path / "figures", RESULTS_ROOT)
