"""The notebook runner's warm kernels (scripts/run_notebooks.py): a notebook run on a kernel warmed
beforehand sees what it would see on a fresh one, so a warm run cannot hide a notebook's own bug."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from script_loader import load_script

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")



rn = load_script("run_notebooks.py")
# What a notebook can see of its kernel: its names, the kernel's execution counter and input history.
PROBE = ("import torch\nprint(torch.zeros(2).sum().item())",
         "print(sorted(dir()))\n"
         "print(get_ipython().execution_count, len(In))")


def with_a_running_loop(fn):
    """``fn()`` called while an event loop runs in this thread, as under a test runner or in a notebook
    (an earlier test's browser driver may have left one running: then as it is)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async def inside():
            return fn()
        return asyncio.run(inside())
    return fn()


def notebook(tmp_path: Path, name: str, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def run(path: Path, km) -> tuple[str, list]:
    nb = nbformat.read(path, as_version=4)
    status = rn.execute(nb, path, 300, km)
    return status, [[o.get("text") for o in c.outputs] for c in nb.cells]


def test_a_warm_kernel_shows_a_notebook_what_a_fresh_one_shows(tmp_path):
    probe = notebook(tmp_path, "probe.ipynb", *PROBE)
    forgot = notebook(tmp_path, "forgot.ipynb", "print(torch.zeros(1))")  # no import: must fail, warm or not
    warm = rn.warm_kernels([probe, forgot], timeout=300)
    assert all(km is not None and s > 0 for km, s in warm), f"the warm-up failed: {warm}"
    warm_probe = run(probe, warm[0][0])
    assert warm_probe == run(probe, None), "a warm kernel showed names, counts or history that a fresh one does not"
    status, _ = run(forgot, warm[1][0])
    assert status.startswith("FAILED") and "torch" in status, status
    assert not warm[0][0].has_kernel and not warm[1][0].has_kernel, "a warm kernel outlived its notebook"


def test_a_warm_kernel_that_fails_is_tried_once_more_then_left_to_start_cold(tmp_path, monkeypatch, capsys):
    """A kernel can die before it answers (two processes took the same TCP port): the runner tries once
    more, and after a second failure the notebook starts its own kernel; it never waits out the run."""
    tries = []

    async def failing(path, timeout, lock):
        tries.append(path.name)
        raise RuntimeError("Kernel died before replying to kernel_info")

    monkeypatch.setattr(rn, "_start_warm", failing)

    assert with_a_running_loop(lambda: rn.warm_kernels([tmp_path / "a.ipynb"], timeout=5)) == [(None, None)]
    assert tries == ["a.ipynb", "a.ipynb"]
    assert "it starts its own kernel" in capsys.readouterr().out
    assert rn.READY_S <= 120, "a dead kernel must be noticed long before a device call's limit"
