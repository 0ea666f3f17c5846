"""tests/nbcheck.py, the comparison tests/test_jupyterlab.py makes between a notebook run in JupyterLab
and the committed notebook: it fails where nbval would, and passes where nbval would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbval")

from nbcheck import checked_cells, output_mismatches  # noqa: E402

v4 = nbformat.v4
ROOT = Path(__file__).resolve().parents[1]


def stdout(text: str):
    return v4.new_output("stream", name="stdout", text=text)


def cell(source: str, *outputs, count: int | None = 1, tags: list[str] | None = None):
    c = v4.new_code_cell(source, outputs=list(outputs), execution_count=count)
    if tags:
        c.metadata["tags"] = tags
    return c


def saved(tmp_path: Path, name: str, *cells) -> nbformat.NotebookNode:
    """A notebook of ``cells``, written to ``tmp_path`` and read back as the comparison reads one."""
    meta = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(v4.new_notebook(cells=list(cells), metadata=meta), tmp_path / name)
    return nbformat.read(tmp_path / name, as_version=4)


def test_a_checked_cell_whose_output_changed_fails(tmp_path):
    committed = saved(tmp_path, "committed.ipynb", cell("# NBVAL_CHECK_OUTPUT\nprint(n)", stdout("1\n")))
    ran = saved(tmp_path, "ran.ipynb", cell("# NBVAL_CHECK_OUTPUT\nprint(n)", stdout("2\n"), count=7))
    problems = output_mismatches(ran, committed)
    assert len(problems) == 1 and problems[0].startswith("code cell 0 (NBVAL_CHECK_OUTPUT): 'stdout' differs"), problems
    assert "-1" in problems[0] and "+2" in problems[0], problems[0]
    assert output_mismatches(committed, committed) == []


def test_what_nbval_leaves_alone_passes(tmp_path):
    committed = saved(tmp_path, "committed.ipynb",
                      cell("print(1)", stdout("1\n")),  # unchecked: it only has to run
                      cell("# NBVAL_CHECK_OUTPUT\n# NBVAL_IGNORE_OUTPUT\nprint(2)", stdout("2\n")),  # the last wins
                      cell("# NBVAL_CHECK_OUTPUT\nprint(3)", count=None),  # never ran when committed
                      cell("# NBVAL_CHECK_OUTPUT\nprint('a', end=''); print('b')", stdout("a"), stdout("b\n")),
                      cell("# NBVAL_CHECK_OUTPUT\nfor i in 1, 2: print(i, end='\\r')\nprint()", stdout("1\r2\r\n")))
    ran = saved(tmp_path, "ran.ipynb",
                cell("print(1)", stdout("one\n")),
                cell("# NBVAL_CHECK_OUTPUT\n# NBVAL_IGNORE_OUTPUT\nprint(2)", stdout("two\n")),
                cell("# NBVAL_CHECK_OUTPUT\nprint(3)", stdout("3\n")),
                cell("# NBVAL_CHECK_OUTPUT\nprint('a', end=''); print('b')", stdout("ab\n"), count=9),
                cell("# NBVAL_CHECK_OUTPUT\nfor i in 1, 2: print(i, end='\\r')\nprint()", stdout("2\r\n")))
    with pytest.warns(UserWarning, match="Conflicting comment markers"):  # nbval's own warning, as nbval gives it
        assert checked_cells(committed) == [2, 3, 4]
        assert output_mismatches(ran, committed) == []


def test_extra_missing_and_reordered_outputs_fail(tmp_path):
    source = "# NBVAL_CHECK_OUTPUT\nshow()"
    stderr = v4.new_output("stream", name="stderr", text="warning\n")
    result = v4.new_output("execute_result", data={"text/plain": "21"}, execution_count=1)
    committed = saved(tmp_path, "committed.ipynb", cell(source, stdout("a\n")), cell(source, stdout("a\n"), result),
                      cell(source, stdout("a\n"), tags=["nbval-check-output"]),
                      cell("show()", stdout("a\n"), count=None))
    ran = saved(tmp_path, "ran.ipynb", cell(source, stdout("a\n"), stderr), cell(source, stdout("a\n")),
                cell(source, stdout("b\n")), cell("show()", stdout("a\n")))
    problems = output_mismatches(ran, committed)
    checked = [f"code cell {i} (NBVAL_CHECK_OUTPUT)" for i in range(3)]
    assert [p.split(":")[0] for p in problems] == ["code cell 3", *checked], problems
    assert "never ran in the committed notebook, yet has outputs" in problems[0]
    assert "unexpected output fields: ['stderr']" in problems[1]
    assert "missing output fields: ['text/plain']" in problems[2]
    fewer = saved(tmp_path, "fewer.ipynb", cell(source, stdout("a\n")))
    assert output_mismatches(fewer, committed) == ["the run has 1 code cells, the committed notebook 4"]


def test_markers_jupyterlab_cannot_honour_are_refused(tmp_path):
    for marker in ("NBVAL_SKIP", "NBVAL_RAISES_EXCEPTION"):
        nb = saved(tmp_path, "nb.ipynb", cell(f"# {marker}\nprint(1)", stdout("1\n")))
        with pytest.raises(ValueError, match="no equivalent in a Run All"):
            checked_cells(nb)


def test_the_committed_notebooks_use_only_markers_it_knows():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert checked_cells(nbformat.read(path, as_version=4)), f"{path.name}: no NBVAL_CHECK_OUTPUT cell"


@pytest.mark.slow
def test_it_fails_the_cells_nbval_fails(tmp_path):
    """nbval itself and ``output_mismatches`` on one notebook: the same cells fail (nbval runs it in a
    kernel of its own; nbclient runs it once more for ``output_mismatches``)."""
    nbclient = pytest.importorskip("nbclient")
    committed = saved(tmp_path, "cells.ipynb",
                      cell("# NBVAL_CHECK_OUTPUT\nprint('same')", stdout("same\n")),
                      cell("# NBVAL_CHECK_OUTPUT\nprint('new')", stdout("old\n")),
                      cell("print('anything')", stdout("other\n")),
                      cell("# NBVAL_CHECK_OUTPUT\nimport sys\nprint('a'); print('b', file=sys.stderr)", stdout("a\n")),
                      cell("# NBVAL_CHECK_OUTPUT\nprint('a', end=''); print('b')", stdout("a"), stdout("b\n")),
                      cell("print(3)", stdout("4\n"), tags=["nbval-check-output"]),
                      cell("# NBVAL_CHECK_OUTPUT\n3 * 7", v4.new_output("execute_result", data={"text/plain": "21"},
                                                                            execution_count=40)),
                      cell("# NBVAL_CHECK_OUTPUT\n3 * 7", v4.new_output("execute_result", data={"text/plain": "22"},
                                                                            execution_count=1)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "--nbval-lax",
                           "--nbval-current-env", "cells.ipynb"], cwd=tmp_path, text=True, capture_output=True,
                          timeout=120)
    nbval_failed = sorted(int(n) for n in re.findall(r"^FAILED \S*::Cell (\d+)", proc.stdout, re.M))
    assert nbval_failed == [1, 3, 5, 7], proc.stdout[-3000:]
    ran = nbclient.NotebookClient(nbformat.read(tmp_path / "cells.ipynb", as_version=4), timeout=60,
                                  resources={"metadata": {"path": str(tmp_path)}}).execute()
    ours = sorted(int(re.match(r"code cell (\d+)", p).group(1)) for p in output_mismatches(ran, committed))
    assert ours == nbval_failed
