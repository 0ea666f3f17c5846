"""The exercises that end notebooks 01 to 08: their shape, which the docs site and the
workshop rely on. ``make test`` runs every cell, the tagged solutions included (in JupyterLab, or
through nbval without Chromium), so a solution that stops working fails the build; this file checks
that there is something to run and that it is findable.

The shape: the last ``##`` section of the notebook is ``## Exercises``; it holds one or two
``### Exercise N: ...`` markdown cells that ask the learner to **predict** before measuring; each
exercise has a code cell for the learner's prediction and at least one code cell tagged ``solution``
(the docs site hides those behind a toggle), and every solution cell ``assert``s what it claims, so
a solution that stops being true fails the run. Whatever follows the first solution cell of an exercise
(the explanation of the answer) is tagged too, so neither the site nor a handout gives the answer
away next to the question. Solutions are never skipped (no ``NBVAL_SKIP``).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WITH_EXERCISES = sorted(p for p in (ROOT / "notebooks").glob("0[1-8]_*.ipynb"))
SOLUTION_TAG = "solution"


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _exercises(cells: list[dict]) -> list[list[dict]]:
    """The exercises after ``## Exercises``: each a list of cells, its ``### Exercise`` markdown first."""
    start = next(i for i, c in enumerate(cells)
                 if c["cell_type"] == "markdown" and _source(c).startswith("## Exercises"))
    groups: list[list[dict]] = []
    for cell in cells[start + 1:]:
        if cell["cell_type"] == "markdown" and re.match(r"### Exercise \d+: ", _source(cell)):
            groups.append([cell])
        elif groups:
            groups[-1].append(cell)
    return groups


def _asserts(source: str) -> int:
    """The ``assert`` statements in a code cell (IPython's ``%`` and ``!`` lines left out)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    return sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(code)))


def test_asserts_are_counted_in_code_not_in_comments_or_strings():
    assert _asserts("%matplotlib inline\nx = 1\nassert x == 1, 'one'") == 1
    assert _asserts("# assert x\nprint('assert')\nif x:\n    assert x > 0\nassert x") == 2
    assert _asserts("print(x)") == 0


def test_there_are_eight_notebooks_with_exercises():
    assert [p.name[:2] for p in WITH_EXERCISES] == ["01", "02", "03", "04", "05", "06", "07", "08"]


@pytest.mark.parametrize("path", WITH_EXERCISES, ids=[p.stem for p in WITH_EXERCISES])
def test_notebook_ends_with_exercises_and_tagged_solutions(path):
    cells = _cells(path)
    sections = [_source(c).splitlines()[0] for c in cells
                if c["cell_type"] == "markdown" and _source(c).startswith("## ")]
    assert sections and sections[-1] == "## Exercises", f"{path.name}: the last section is {sections[-1:]}"
    exercises = _exercises(cells)
    assert 1 <= len(exercises) <= 2, f"{path.name}: {len(exercises)} exercises"
    for n, (intro, *rest) in enumerate(exercises, 1):
        title = _source(intro).splitlines()[0]
        assert title.startswith(f"### Exercise {n}: "), f"{path.name}: exercises are numbered 1, 2: {title!r}"
        assert "predict" in _source(intro).lower(), f"{path.name} {title!r}: ask for a prediction first"
        code = [c for c in rest if c["cell_type"] == "code"]
        solutions = [c for c in code if SOLUTION_TAG in c.get("metadata", {}).get("tags", [])]
        learner = [c for c in code if c not in solutions]
        assert solutions, f"{path.name} {title!r}: no code cell tagged {SOLUTION_TAG!r}"
        assert learner, f"{path.name} {title!r}: no cell for the learner's own prediction"
        assert code.index(learner[0]) < code.index(solutions[0]), f"{path.name} {title!r}: prediction comes first"
        for cell in solutions:
            assert "NBVAL_SKIP" not in _source(cell), f"{path.name} {title!r}: nbval must run the solution"
            assert _asserts(_source(cell)), \
                f"{path.name} {title!r}: a solution cell asserts nothing: {_source(cell)[:80]!r}"
        after = rest[rest.index(solutions[0]):]
        untagged = [_source(c)[:60] for c in after if SOLUTION_TAG not in c.get("metadata", {}).get("tags", [])]
        assert not untagged, f"{path.name} {title!r}: cells after the solution give the answer away: {untagged}"
