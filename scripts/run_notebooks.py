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

Every notebook's kernel is started before the first notebook runs, all at once, and imports the
libraries the course uses (:data:`WARM_UP`: torch, transformers, matplotlib and the kit; nothing that
touches the GPU). A kernel spends about 6 s on those imports, every notebook's first cell would pay them
one notebook after another, and the GPU idles meanwhile; done side by side beforehand, they cost about
one notebook's imports in all. The notebooks still run one at a time, each alone on the GPU, and
import what they import themselves (a name already imported costs nothing). ``--cold`` starts each
kernel only when its notebook runs, as before.

When a kernel dies (a crash in native code leaves nbclient nothing but "DeadKernelError"), the
notebook's code cells are run once more as an IPython script in a child process with
faulthandler on, and the tail of its output and its exit status (a negative status is the signal)
are printed: that is the diagnosis a GPU log needs.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
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
# What a warm kernel imports before its notebook runs: what the notebooks' first cells import, and the
# transformers classes their presets build (a lazy import inside transformers, about 2 s). No CUDA call.
# Inside a function, so the notebook's namespace starts empty: a notebook that forgets an import still
# fails here as it would for a learner. The kernel keeps the seconds the imports took.
WARM_UP = """\
def _lfm2vl_warm_up():
    import time
    t0 = time.perf_counter()
    import matplotlib.pyplot, torch, transformers
    from transformers import Lfm2VlForConditionalGeneration, Lfm2VlProcessor
    import lfm2vl_lab, lfm2vl_lab.measure
    from lfm2vl_lab.report import setup
    return time.perf_counter() - t0
_lfm2vl_warm_s = _lfm2vl_warm_up()
"""
WARM_DONE = "del _lfm2vl_warm_up, _lfm2vl_warm_s"
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


READY_S = 60  # a warm kernel that has not answered by then is dead (one that lost its TCP port, say)


def _run(coro):
    """``asyncio.run(coro)`` in a thread of its own: the caller may be running an event loop already
    (a test under pytest, a notebook), where ``asyncio.run`` refuses to start another."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _start_warm(path: Path, timeout: int, start_lock: asyncio.Lock):
    """One try at a warm kernel: started (one start at a time, so that the ports it picks cannot race
    another start of this process), ready within :data:`READY_S`, then :data:`WARM_UP` run in it."""
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="python3")
    try:
        async with start_lock:
            await km.start_kernel(cwd=str(path.parent))
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=READY_S)
            # silent: no output, no history, no execution count; the notebook's cells count from 1
            reply = await kc.execute_interactive(WARM_UP, silent=True, timeout=timeout, output_hook=lambda msg: None,
                                                 user_expressions={"s": "_lfm2vl_warm_s"})
            content = reply["content"]
            if content["status"] != "ok" or content["user_expressions"]["s"]["status"] != "ok":
                raise RuntimeError(content.get("evalue", "the warm-up failed"))
            await kc.execute_interactive(WARM_DONE, silent=True, timeout=timeout, output_hook=lambda msg: None)
        finally:
            kc.stop_channels()
        return km, float(content["user_expressions"]["s"]["data"]["text/plain"])
    except BaseException:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
        raise


async def _warm_kernel(path: Path, timeout: int, start_lock: asyncio.Lock):
    """A kernel started in ``path``'s folder that has run :data:`WARM_UP`, and the seconds its imports
    took; tried twice, then (None, None): the notebook starts its own kernel, as with ``--cold``."""
    for attempt in (1, 2):
        try:
            return await _start_warm(path, timeout, start_lock)
        except Exception as exc:  # a cold start is slower, not wrong
            print(f"{path.name}: no warm kernel, try {attempt} ({type(exc).__name__}: {exc})", flush=True)
    print(f"{path.name}: it starts its own kernel", flush=True)
    return None, None


def warm_kernels(paths: list[Path], timeout: int) -> list[tuple]:
    """One warm kernel per notebook and its import seconds (:func:`_warm_kernel`), warmed side by side."""
    async def all_of_them():
        lock = asyncio.Lock()
        return await asyncio.gather(*(_warm_kernel(p, timeout, lock) for p in paths))
    return _run(all_of_them())


def execute(nb, path: Path, timeout: int, km=None) -> str:
    """Run ``nb`` with nbclient (cwd: the notebook's folder), on ``km`` where given (a warm kernel, shut
    down here afterwards); returns "ok" or why it failed."""
    from nbclient import NotebookClient  # only needed here: --sanitize-only works without Jupyter

    try:
        client = NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
        return "ok"
    except Exception as exc:  # report it and go on to the next notebook
        if type(exc).__name__ == "DeadKernelError":
            print(f"{path.name}: the kernel died; rerunning its code as a script to see why", flush=True)
            print(diagnose_dead_kernel(nb, path, timeout), flush=True)
        return f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"
    finally:
        if km is not None and km.has_kernel:  # nbclient leaves a kernel it did not start running
            _run(km.shutdown_kernel(now=True))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", default=None, help="write executed copies here instead of in place")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--sanitize-only", action="store_true",
                    help="do not execute: only sanitise the outputs the notebooks already have")
    ap.add_argument("--cold", action="store_true",
                    help="start each notebook's kernel when it runs, not all of them warm beforehand")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # kernels inherit it: a native crash prints a traceback
    paths = list(map(Path, args.notebooks))
    t_start = time.time()
    kms = [None] * len(paths)
    if not (args.sanitize_only or args.cold):
        kms, secs = zip(*warm_kernels(paths, args.timeout))
        took = [s for s in secs if s is not None]
        print(f"{len(took)} of {len(paths)} kernels warm in {time.time() - t_start:.1f}s"
              + (f" (their imports took {min(took):.1f}-{max(took):.1f}s each, side by side; a kernel started"
                 " for one notebook pays them in its first cell)" if took else ""), flush=True)
    failed = 0
    for p, km in zip(paths, kms):
        nb = nbformat.read(p, as_version=4)
        t0 = time.time()
        status = "sanitised" if args.sanitize_only else execute(nb, p, args.timeout, km)
        failed += status.startswith("FAILED")
        cleaned = sanitize_notebook(nb)
        dest = Path(args.out) / p.name if args.out else p
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        print(f"{p.name}: {status} in {time.time() - t0:.1f}s ({cleaned} cells cleaned)", flush=True)
    if not args.sanitize_only:
        print(f"{len(paths)} notebooks in {time.time() - t_start:.1f}s, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
