"""scripts/handout.py: the learner copies a facilitator hands out have no solutions in them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# The GPU image has no Jupyter: this module skips there instead of failing to collect
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (scripts/handout.py needs it)")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("handout", ROOT / "scripts" / "handout.py")
handout_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(handout_mod)


def _notebook():
    v4 = nbformat.v4
    solution = v4.new_code_cell("answer = 42", metadata={"tags": ["solution"]})
    guess = v4.new_code_cell("my_guess = None", outputs=[v4.new_output("stream", text="hi\n")], execution_count=3)
    return v4.new_notebook(cells=[v4.new_markdown_cell("### Exercise 1: predict"), guess, solution])


def test_handout_removes_solutions_and_clears_outputs():
    nb = _notebook()
    out, removed = handout_mod.handout(nb)
    assert removed == 1
    assert [c.source for c in out.cells] == ["### Exercise 1: predict", "my_guess = None"]
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None
    assert len(nb.cells) == 3 and nb.cells[1].outputs, "the original notebook is left as it was"


def test_handout_can_keep_outputs_and_writes_every_notebook(tmp_path, capsys):
    out, _ = handout_mod.handout(_notebook(), keep_outputs=True)
    assert out.cells[1].outputs[0]["text"] == "hi\n"
    src = tmp_path / "nb.ipynb"
    nbformat.write(_notebook(), src)
    assert handout_mod.main([str(src), "--out", str(tmp_path / "h")]) == 0
    written = nbformat.read(tmp_path / "h" / "nb.ipynb", as_version=4)
    assert all("solution" not in c.metadata.get("tags", []) for c in written.cells)
    assert "1 solution cell(s) removed" in capsys.readouterr().out
