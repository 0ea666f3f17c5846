"""scripts/refresh_checked_outputs.py writes a CPU run's outputs into a notebook's NBVAL_CHECK_OUTPUT cells
only: sources, metadata and the GPU outputs of NBVAL_IGNORE_OUTPUT cells stay byte for byte as committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_loader import load_script

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("nbval")  # the checked cells and the comparison are nbval's (tests/nbcheck.py)

ROOT = Path(__file__).resolve().parents[1]
refresh = load_script("refresh_checked_outputs.py")


def out(text: str, name: str = "stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def toy(tmp_path: Path) -> Path:
    """A committed notebook as the GPU run leaves it: an IGNORE cell with a GPU's output (a CPU prints
    something else), a checked cell whose output is stale (its source was edited), a checked cell that is
    up to date, a checked DataFrame, an unmarked cell and prose."""
    cells = [
        nbformat.v4.new_markdown_cell("# Toy\nprose stays"),
        nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint('measured here')",
                                  outputs=[out("measured on the H200: 0.861 ms\n")], execution_count=1),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint('new table')", outputs=[out("old table\n")],
                                  execution_count=2),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint('same')", outputs=[out("same\n")], execution_count=3),
        nbformat.v4.new_code_cell("x = 1", execution_count=4),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nimport pandas as pd\npd.DataFrame({'median ms': [0.86]})",
                                  outputs=[out("a table printed by hand\n")], execution_count=5),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["widgets"] = {"state": "kept as committed"}  # metadata the script must not touch either
    path = tmp_path / "toy.ipynb"
    nbformat.write(nb, path)
    return path


def test_only_changed_checked_cells_take_the_runs_outputs(tmp_path):
    path = toy(tmp_path)
    before = json.loads(path.read_text())
    assert refresh.refresh(path, timeout=120, base="HEAD", allow_unedited=False, dry_run=False) == 0
    after = json.loads(path.read_text())
    assert after["metadata"] == before["metadata"] and after["nbformat_minor"] == before["nbformat_minor"]
    assert [c["source"] for c in after["cells"]] == [c["source"] for c in before["cells"]]
    assert after["cells"][1] == before["cells"][1], "an IGNORE cell keeps its GPU output and count"
    assert after["cells"][3] == before["cells"][3], "a checked cell that shows what is committed is left alone"
    assert after["cells"][4] == before["cells"][4] and after["cells"][0] == before["cells"][0]
    assert after["cells"][2]["outputs"] == [{"name": "stdout", "output_type": "stream", "text": ["new table\n"]}]
    frame = after["cells"][5]["outputs"]
    assert [o["output_type"] for o in frame] == ["execute_result"]
    assert {"text/plain", "text/html"} <= set(frame[0]["data"])
    # the file is nbformat's own writing of what it holds: a second run finds nothing to change
    assert path.read_text().rstrip("\n") == nbformat.writes(nbformat.read(path, as_version=4)).rstrip("\n")
    text = path.read_text()
    assert refresh.refresh(path, timeout=120, base="HEAD", allow_unedited=False, dry_run=False) == 0
    assert path.read_text() == text


def test_a_changed_output_of_an_unedited_cell_is_refused(tmp_path, monkeypatch, capsys):
    # every source as at --base: the stale checked cell then changed although nobody edited it (a bug)
    path = toy(tmp_path)
    text = path.read_text()
    sources = [c.source for c in nbformat.reads(text, as_version=4).cells if c.cell_type == "code"]
    monkeypatch.setattr(refresh, "source_at", lambda rev, p: sources)
    assert refresh.refresh(path, timeout=120, base="HEAD", allow_unedited=False, dry_run=False) == 2
    assert path.read_text() == text
    assert "UNEDITED since HEAD" in capsys.readouterr().out


def test_merge_refuses_a_file_nbformat_would_rewrite(tmp_path):
    path = toy(tmp_path)
    nb = nbformat.read(path, as_version=4)
    with pytest.raises(ValueError, match="nbformat's layout"):
        refresh.merge(json.dumps(json.loads(path.read_text()), indent=2), nb)


def test_the_kernel_imports_this_checkout_without_cuda(tmp_path):
    env = refresh.kernel_env(ROOT)
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT) and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["HF_HUB_OFFLINE"] == "1" and "LFM2VL_CHECKPOINT" not in env
