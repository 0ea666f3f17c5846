"""Committed notebook outputs carry no machine paths and no tqdm widget warning (scripts/run_notebooks.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from script_loader import load_script

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TQDM_WARNING = ("/opt/torch/.venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. "
                "Please update jupyter and ipywidgets. See https://ipywidgets.readthedocs.io/en/stable/user_install.html\n"
                "  from .autonotebook import tqdm as notebook_tqdm\n")


rn = load_script("run_notebooks.py")


@pytest.mark.parametrize("raw,clean", [
    ("/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/__init__.py:1270: UserWarning",
     "<site-packages>/torch/cuda/__init__.py:1270: UserWarning"),
    ("/usr/lib/python3/dist-packages/x.py", "<site-packages>/x.py"),
    ('File "/usr/lib/python3.12/warnings.py", line 3', 'File "<stdlib>/warnings.py", line 3'),
    ("PosixPath('/srv/ck/lab/data/results/x.json')", "PosixPath('<repo>/data/results/x.json')"),
    ("cwd /srv/ck/lab", "cwd <repo>"),
    ("--out /root/out/w/x/res --no-progress", "--out ~/out/w/x/res --no-progress"),
    ("/home/alice/lab/a.py:3", "~/lab/a.py:3"),
    # Not paths of this machine: left alone.
    ("/srv/ck/lab2/a.py /work/root/b https://ipywidgets.readthedocs.io/en/stable/", "/srv/ck/lab2/a.py /work/root/b "
     "https://ipywidgets.readthedocs.io/en/stable/"),
])
def test_sanitize_text(raw, clean):
    assert rn.sanitize_text(raw, "/srv/ck/lab") == clean


def make_notebook(*outputs):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("print(1)", outputs=list(outputs)))
    return nb


def test_tqdm_warning_is_dropped_and_other_stderr_kept():
    only_warning = nbformat.v4.new_output("stream", name="stderr", text=TQDM_WARNING)
    mixed = nbformat.v4.new_output("stream", name="stderr", text=TQDM_WARNING + "real warning\n")
    stdout = nbformat.v4.new_output("stream", name="stdout", text="DEVICE=cpu\n")
    nb = make_notebook(only_warning, mixed, stdout)
    assert rn.sanitize_notebook(nb) == 1
    assert [(o.name, o.text) for o in nb.cells[0].outputs] == [("stderr", "real warning\n"), ("stdout", "DEVICE=cpu\n")]
    assert rn.sanitize_notebook(nb) == 0, "sanitising twice must change nothing"


def test_errors_and_rich_outputs_are_sanitised():
    err = nbformat.v4.new_output("error", ename="ValueError", evalue=f"bad file {ROOT}/x.json",
                                 traceback=[f"File {ROOT}/lfm2vl_lab/a.py:1",
                                            "/root/.venv/lib/python3.11/site-packages/t.py"])
    shown = nbformat.v4.new_output("execute_result", data={"text/plain": f"PosixPath('{ROOT}/data')"},
                                   execution_count=1)
    nb = make_notebook(err, shown)
    rn.sanitize_notebook(nb)
    err, shown = nb.cells[0].outputs
    assert err.evalue == "bad file <repo>/x.json"
    assert err.traceback == ["File <repo>/lfm2vl_lab/a.py:1", "<site-packages>/t.py"]
    assert shown.data["text/plain"] == "PosixPath('<repo>/data')"


def test_nbval_checked_cells_are_left_alone():
    # nbval compares these outputs with a fresh run: a path in them comes from data (a result
    # file's recorded command), and rewriting it would make the comparison fail.
    recorded = nbformat.v4.new_output("stream", name="stdout", text="by `bench --out /root/out/res`\n")
    nb = make_notebook(recorded)
    nb.cells[0].source = "# NBVAL_CHECK_OUTPUT\nprint(label)"
    assert rn.sanitize_notebook(nb) == 0
    assert nb.cells[0].outputs[0].text == "by `bench --out /root/out/res`\n"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_are_sanitised(path):
    nb = nbformat.read(path, as_version=4)
    before = copy.deepcopy(nb)
    changed = rn.sanitize_notebook(nb)
    bad = [i for i, (a, b) in enumerate(zip(before.cells, nb.cells)) if a.get("outputs") != b.get("outputs")]
    assert changed == 0, f"{path.name}: cells {bad} carry machine paths or tqdm's widget warning; " \
                         f"run `python scripts/run_notebooks.py --sanitize-only {path.relative_to(ROOT)}`"
