"""Rewrite the outputs of the notebooks' ``NBVAL_CHECK_OUTPUT`` cells from a run on this CPU, nothing else.

    python scripts/refresh_checked_outputs.py notebooks/06_measuring_the_savings.ipynb [--dry-run]

The committed notebooks carry the outputs of a GPU run (scripts/run_notebooks.py on the H200). Their
``NBVAL_CHECK_OUTPUT`` cells are device-independent by contract: they read the recorded reference set
or compute on the host, and the test suite reruns them on a CPU and requires the committed outputs
(tests/nbcheck.py). A change to such a cell's source therefore needs new outputs, and a CPU run gives
exactly what the GPU would; rerunning the whole notebook on the GPU for it would also replace every
live measurement. This script runs the notebook on the CPU and takes from that run only the outputs
(and execution count) of the checked cells whose outputs nbval would find different: every other
byte of the file, sources, metadata and the GPU outputs of ``NBVAL_IGNORE_OUTPUT`` cells among them,
stays as committed.

It runs the notebook as the test suite does: kernel ``python3`` of the Python running this script,
the notebook's folder as working directory (scripts/run_notebooks.py's convention), this checkout
first on ``PYTHONPATH`` (the Makefile's), no model hub (``HF_HUB_OFFLINE``), and no CUDA device, so a
GPU machine gives the CPU's outputs too. The committed file itself is never executed in place: the
run works on a copy in memory.

It prints every checked cell whose outputs changed. A changed cell whose source is the same as at
``--base`` (a git revision, default ``HEAD``) is a surprise, not an update: a device-independent cell
that nobody edited must come out the same, so the script writes nothing to that notebook and exits 2
(``--allow-unedited`` accepts it, for a deliberate change outside the cell, e.g. a helper's format).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# One rule for which cells are checked and when two outputs differ: the one the tests apply (nbval's).
nbcheck = _load("nbcheck", REPO_ROOT / "tests" / "nbcheck.py")
run_notebooks = _load("run_notebooks", HERE / "run_notebooks.py")


def dumps(raw: dict) -> str:
    """A notebook's JSON as nbformat writes it (``nbformat.writes``: one-space indent, sorted keys)."""
    return json.dumps(raw, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def kernel_env(repo_root: Path = REPO_ROOT) -> dict[str, str]:
    """The environment of the run's kernel: this checkout first on the path (the Makefile's rule, so the
    kernel imports this checkout's package and not another editable install's), no hub, no CUDA device."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               PYTHONFAULTHANDLER="1")
    env.pop("LFM2VL_CHECKPOINT", None)  # the committed outputs are the presets' (tests/conftest.py)
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


@contextlib.contextmanager
def kernel_environment(repo_root: Path = REPO_ROOT):
    """:func:`kernel_env` in ``os.environ`` while the block runs (a kernel inherits it), as it was after."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(kernel_env(repo_root))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def source_at(rev: str, path: Path) -> list[str] | None:
    """The code cells' sources of ``path`` at git revision ``rev``; None where git has no such file."""
    try:
        rel = path.resolve().relative_to(REPO_ROOT)
        proc = subprocess.run(["git", "show", f"{rev}:{rel.as_posix()}"], cwd=REPO_ROOT, capture_output=True,
                              text=True)
    except ValueError:
        return None
    if proc.returncode != 0:
        return None
    return [c.source for c in nbcheck.code_cells(nbformat.reads(proc.stdout, as_version=4))]


def merge(committed_text: str, ran) -> tuple[str, list[int]]:
    """``committed_text`` (a notebook file's text) with the outputs and execution counts of ``ran`` (the
    same notebook, executed) in its checked code cells whose outputs nbval would find different; returns
    the new text and those cells (0-based among the code cells). Nothing else changes: the file is
    edited as JSON, and a file that nbformat would not write back byte for byte is refused."""
    raw = json.loads(committed_text)
    if dumps(raw) != committed_text:
        raise ValueError("the notebook is not in nbformat's layout (indent 1, sorted keys); "
                         "rewriting it would change more than its checked outputs")
    committed = nbformat.reads(committed_text, as_version=4)
    ran_cells, cells = nbcheck.code_cells(ran), [c for c in raw["cells"] if c["cell_type"] == "code"]
    if len(ran_cells) != len(cells):
        raise ValueError(f"the run has {len(ran_cells)} code cells, the notebook {len(cells)}")
    # the run's cells as nbformat stores them (multi-line strings as lists of lines)
    stored = [c for c in json.loads(nbformat.writes(ran))["cells"] if c["cell_type"] == "code"]
    changed = []
    for i in nbcheck.checked_cells(committed):
        if ran_cells[i].source != nbcheck.code_cells(committed)[i].source:
            raise ValueError(f"code cell {i}: the run's source is not the notebook's")
        if cells[i].get("execution_count") is not None and nbcheck.compare_outputs(
                ran_cells[i].get("outputs", []), nbcheck.code_cells(committed)[i].get("outputs", [])) is None:
            continue
        cells[i]["outputs"], cells[i]["execution_count"] = stored[i]["outputs"], stored[i]["execution_count"]
        changed.append(i)
    return dumps(raw), changed


def refresh(path: Path, timeout: int, base: str, allow_unedited: bool, dry_run: bool) -> int:
    """Run ``path`` on the CPU and write its changed checked outputs back. Returns 0 (written, or nothing
    to write), 1 (the run failed, or a changed checked cell wrote to stderr: nothing written) or 2 (an
    unedited cell changed: nothing written)."""
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    with kernel_environment():
        status = run_notebooks.execute(nb, path, timeout)
    if status != "ok":
        print(f"{path.name}: {status}; nothing written", flush=True)
        return 1
    new_text, changed = merge(text, nb)
    before = source_at(base, path)
    sources = [c.source for c in nbcheck.code_cells(nb)]
    unedited = [i for i in changed if before is not None and len(before) == len(sources) and before[i] == sources[i]]
    committed = nbformat.reads(text, as_version=4)
    position = {id(c): j for j, c in enumerate(committed.cells)}  # code cell i is cell position[...] of nb.cells
    for i in changed:
        cell = nbcheck.code_cells(committed)[i]
        why = nbcheck.compare_outputs(nbcheck.code_cells(nb)[i].get("outputs", []), cell.get("outputs", []))
        tag = f"UNEDITED since {base}" if i in unedited else "source edited"
        print(f"{path.name}: code cell {i} (cells[{position[id(cell)]}], {tag}): {why or 'had never run'}",
              flush=True)
    noisy = [i for i in changed if any(o.get("output_type") == "error" or o.get("name") == "stderr"
                                       for o in nbcheck.code_cells(nb)[i].get("outputs", []))]
    if noisy:  # a learner would see a red box, and the JupyterLab test fails on one
        print(f"{path.name}: checked cells {noisy} wrote to stderr or raised; nothing written", flush=True)
        return 1
    if unedited and not allow_unedited:
        print(f"{path.name}: checked cells {unedited} changed their outputs although their sources are as at "
              f"{base}: a bug (or a change elsewhere); nothing written", flush=True)
        return 2
    if not changed:
        print(f"{path.name}: every checked cell shows what is committed", flush=True)
    elif dry_run:
        print(f"{path.name}: {len(changed)} checked cells would change (--dry-run: nothing written)", flush=True)
    else:
        path.write_text(new_text, encoding="utf-8")
        print(f"{path.name}: wrote the outputs of checked cells {changed}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--base", default="HEAD", help="git revision whose cell sources count as unedited (HEAD)")
    ap.add_argument("--allow-unedited", action="store_true",
                    help="also write changed outputs of checked cells whose source is as at --base")
    ap.add_argument("--dry-run", action="store_true", help="run and report, write nothing")
    args = ap.parse_args(argv)
    worst = 0
    for path in args.notebooks:
        worst = max(worst, refresh(path, args.timeout, args.base, args.allow_unedited, args.dry_run))
    return worst


if __name__ == "__main__":
    sys.exit(main())
