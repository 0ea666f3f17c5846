"""Execute notebooks in place with nbclient, then clean their outputs for committing.

    python scripts/run_notebooks.py notebooks/*.ipynb [--out DIR]
    python scripts/run_notebooks.py --sanitize-only notebooks/*.ipynb

Each notebook runs with notebooks/ as its working directory; the executed copy is written back
(or into --out) so it can be committed with its GPU outputs. (The H200 image has no Jupyter:
scripts/h200_run.sh carries nbclient's wheels there.)

Before a notebook is written, its outputs are sanitised (see ``sanitize_notebook``): absolute
paths of the machine that ran it (the checkout, site-packages, the Python library, home
folders) become placeholders, and tqdm's "IProgress not found" warning, which says something
about the kernel's environment and nothing about the notebook, is dropped.
``--sanitize-only`` applies just that to notebooks that are already committed.

When a kernel dies (a crash in native code leaves nbclient nothing but "DeadKernelError"), the
notebook's code cells are run once more as an IPython script in a child process with
faulthandler on, and the tail of its output and its exit status (a negative status is the signal)
are printed: that is the diagnosis a GPU log needs.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat

REPO_ROOT = Path(__file__).resolve().parents[1]

NBVAL_CHECK = "# NBVAL_CHECK_OUTPUT"
# tqdm.auto inside a kernel without ipywidgets: the warning line, then the source line it quotes.
TQDM_WIDGET_WARNING = re.compile(
    r"^[^\n]*TqdmWarning: IProgress not found[^\n]*(?:\n|$)(?:[ \t]+from \.autonotebook import[^\n]*(?:\n|$))?", re.M)
# A path element: anything but whitespace, quotes, backticks and the ':' that ends "file.py:21:".
_PART = r"[^\s'\"`:/\\]+"
# .../lib/python3.12/site-packages, .../dist-packages (Debian), a --target folder named site-packages.
SITE_PACKAGES = re.compile(rf"(?<![\w.~<>-])(?:/{_PART})*/(?:site|dist)-packages(?=/|\b)")
# The standard library of any CPython 3 (after site-packages is gone, only the stdlib is left there).
STDLIB = re.compile(rf"(?<![\w.~<>-])(?:/{_PART})*/lib/python3\.\d+(?=/)")
# Home folders: /root and /home/<user>.
HOME = re.compile(rf"(?<![\w.~<>-])(?:/root|/home/{_PART})(?=[/\s'\"`),:]|$)")


def sanitize_text(text: str, repo_root: Path | str = REPO_ROOT) -> str:
    """``text`` with machine-specific absolute paths replaced by placeholders.

    site-packages → ``<site-packages>``, the standard library → ``<stdlib>``, the checkout
    (``repo_root``, also through symlinks) → ``<repo>``, a home folder → ``~``. The order matters:
    a venv inside the checkout or the home folder must become ``<site-packages>``, not
    ``<repo>/.venv/...``.
    """
    text = SITE_PACKAGES.sub("<site-packages>", text)
    text = STDLIB.sub("<stdlib>", text)
    roots = sorted({str(repo_root), os.path.realpath(repo_root)}, key=len, reverse=True)
    for root in roots:
        text = re.sub(rf"{re.escape(root.rstrip('/'))}(?=[/\s'\"`),:]|$)", "<repo>", text)
    return HOME.sub("~", text)


def _sanitize_output(out, repo_root) -> bool:
    """Clean one output in place; returns False when nothing is left of it (drop it)."""
    kind = out.get("output_type")
    if kind == "stream":
        text = out["text"]
        if out.get("name") == "stderr":
            text = TQDM_WIDGET_WARNING.sub("", text)
        out["text"] = sanitize_text(text, repo_root)
        return bool(out["text"])
    if kind in ("execute_result", "display_data"):
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/"):  # images and widget states carry no paths worth a rewrite
                joined = "".join(value) if isinstance(value, list) else value
                out["data"][mime] = sanitize_text(joined, repo_root)
    elif kind == "error":
        out["evalue"] = sanitize_text(out.get("evalue", ""), repo_root)
        out["traceback"] = [sanitize_text(line, repo_root) for line in out.get("traceback", [])]
    return True


def sanitize_notebook(nb, repo_root: Path | str = REPO_ROOT) -> int:
    """Sanitise the code cells' outputs in place (see ``sanitize_text``), drop tqdm's
    "IProgress not found" warning from stderr streams and the notebook's saved widget state. Returns
    how many cells (and metadata entries) changed.

    Cells marked ``# NBVAL_CHECK_OUTPUT`` are left alone: nbval compares their committed output
    with a fresh run on another machine, so it cannot hold that machine's paths, and any path in
    it comes from data (e.g. a result file's recorded command) that a rewrite would falsify.
    """
    changed = 0
    # ipywidgets' saved state: it means nothing outside a live kernel, and nbconvert answers it with a
    # widget manager fetched from a CDN on the docs site (which must load offline)
    if nb.metadata.pop("widgets", None) is not None:
        changed += 1
    for cell in nb.cells:
        if cell.cell_type != "code" or NBVAL_CHECK in cell.source:
            continue
        before = copy.deepcopy(cell.outputs)
        cell.outputs = [out for out in cell.outputs if _sanitize_output(out, repo_root)]
        changed += cell.outputs != before
    return changed


def diagnose_dead_kernel(nb, path: Path, timeout: int) -> str:
    """Rerun the notebook's code as an IPython script (magics and display() work there)."""
    script = path.with_suffix(".diagnose.ipy")
    script.write_text("\n\n".join(c.source for c in nb.cells if c.cell_type == "code"))
    try:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "IPython", "--no-banner", "--colors=NoColor",
                               script.name], cwd=path.parent, capture_output=True, text=True, timeout=timeout)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-40:]
        return f"exit status {proc.returncode}\n" + "\n".join(tail)
    except subprocess.TimeoutExpired:
        return f"no result within {timeout} s"
    finally:
        script.unlink(missing_ok=True)


def execute(nb, path: Path, timeout: int) -> str:
    """Run ``nb`` with nbclient (cwd: the notebook's folder); returns "ok" or why it failed."""
    from nbclient import NotebookClient  # only needed here: --sanitize-only works without Jupyter

    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        return "ok"
    except Exception as exc:  # report it and go on to the next notebook
        if type(exc).__name__ == "DeadKernelError":
            print(f"{path.name}: the kernel died; rerunning its code as a script to see why", flush=True)
            print(diagnose_dead_kernel(nb, path, timeout), flush=True)
        return f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", default=None, help="write executed copies here instead of in place")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--sanitize-only", action="store_true",
                    help="do not execute: only sanitise the outputs the notebooks already have")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # kernels inherit it: a native crash prints a traceback
    failed = 0
    for p in map(Path, args.notebooks):
        nb = nbformat.read(p, as_version=4)
        t0 = time.time()
        status = "sanitised" if args.sanitize_only else execute(nb, p, args.timeout)
        failed += status.startswith("FAILED")
        cleaned = sanitize_notebook(nb)
        dest = Path(args.out) / p.name if args.out else p
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        print(f"{p.name}: {status} in {time.time() - t0:.1f}s ({cleaned} cells cleaned)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
