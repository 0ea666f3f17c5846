"""``make lab``'s working copies (scripts/lab_copies.py): the notebooks a learner runs are copies in
a git-ignored folder, made from ``notebooks/`` and never overwritten once the learner changed them.
tests/test_jupyterlab.py runs the real notebooks through ``make lab`` in JupyterLab."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The GPU image has no Jupyter: this module skips there instead of failing to collect
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the lab copies are notebooks)")

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lab_copies", ROOT / "scripts" / "lab_copies.py")
lab_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab_copies)


def _notebook(path: Path, text: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print({text!r})")])
    nbformat.write(nb, path)
    return path


def _edit(path: Path, text: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    nbformat.write(nb, path)


def test_copies_follow_their_source_until_the_learner_changes_them(tmp_path):
    src, dest = tmp_path / "notebooks", tmp_path / "lab-notebooks"
    src.mkdir()
    a, b = _notebook(src / "a.ipynb", "one"), _notebook(src / "b.ipynb", "two")
    assert lab_copies.prepare(src, dest, say=lambda _: None) == {"a.ipynb": "copied", "b.ipynb": "copied"}
    assert (dest / "a.ipynb").read_bytes() == a.read_bytes()
    _edit(dest / "a.ipynb", "the learner ran it")             # what running a cell and autosaving do
    _notebook(a, "one, new version")                          # and then a `git pull` changes both sources
    _notebook(b, "two, new version")
    said = []
    assert lab_copies.prepare(src, dest, say=said.append) == {"a.ipynb": "yours, source changed",
                                                              "b.ipynb": "updated"}
    assert "the learner ran it" in (dest / "a.ipynb").read_text()
    assert "1 of the copies hold your own runs or edits (a.ipynb: newer in" in said[-1] and "make lab-fresh" in said[-1]
    assert (dest / "b.ipynb").read_bytes() == b.read_bytes()
    assert lab_copies.prepare(src, dest, say=said.append)["a.ipynb"] == "yours, source changed"  # still kept


def test_fresh_copies_move_the_changed_ones_aside(tmp_path):
    src, dest = tmp_path / "notebooks", tmp_path / "lab-notebooks"
    src.mkdir()
    a, _ = _notebook(src / "a.ipynb", "one"), _notebook(src / "b.ipynb", "two")
    lab_copies.prepare(src, dest, say=lambda _: None)
    _edit(dest / "a.ipynb", "the learner ran it")
    done = lab_copies.prepare(src, dest, fresh=True, say=lambda _: None)
    assert done["b.ipynb"] == "kept" and done["a.ipynb"].startswith("moved aside to ")
    aside = Path(done["a.ipynb"].removeprefix("moved aside to "))
    assert aside.parent == dest and aside.name.startswith("previous-")
    assert "the learner ran it" in (aside / "a.ipynb").read_text()
    assert (dest / "a.ipynb").read_bytes() == a.read_bytes()
    assert sorted(p.name for p in aside.iterdir()) == ["a.ipynb"]  # b was unchanged: nothing to keep


def test_copies_cannot_replace_the_committed_notebooks():
    with pytest.raises(SystemExit, match="cannot live in"):
        lab_copies.prepare(ROOT / "notebooks", ROOT / "notebooks" / ".", say=lambda _: None)


def make_n(*args: str) -> str:
    """What ``make`` would run (``-n``), with the venv running these tests (a missing .venv would add
    `make install` to the plan)."""
    venv = f"VENV={Path(sys.executable).parent.parent}"
    return subprocess.run(["make", "-n", "-s", *args, venv], cwd=ROOT, text=True, capture_output=True,
                          check=True).stdout


def test_make_lab_opens_the_copies_and_keeps_its_options():
    out = make_n("lab", "LAB_ARGS=--no-browser --port 9")
    copy_line, lab_line = [line for line in out.splitlines() if "lab_copies.py" in line or "jupyter lab" in line]
    assert "--dest lab-notebooks" in copy_line and "--fresh" not in copy_line
    assert lab_line.endswith("--no-browser --port 9 lab-notebooks/")
    assert ("--allow-root" in lab_line) == (os.getuid() == 0)
    assert "lab_copies.py --dest lab-notebooks --fresh" in make_n("lab-fresh")
    assert "lab_copies.py --dest lab-notebooks --fresh" in make_n("lab", "LAB_FRESH=1")


def test_a_damaged_copy_or_record_is_kept_as_the_learners(tmp_path):
    src, dest = tmp_path / "notebooks", tmp_path / "lab-notebooks"
    src.mkdir()
    _notebook(src / "a.ipynb", "one")
    lab_copies.prepare(src, dest, say=lambda _: None)
    (dest / "a.ipynb").write_text('{"cells": [')                  # a half-written save
    (dest / lab_copies.MANIFEST).write_text("not json")
    assert lab_copies.prepare(src, dest, say=lambda _: None) == {"a.ipynb": "yours"}
    assert (dest / "a.ipynb").read_text() == '{"cells": ['
