"""Execute notebooks in place with nbclient (the H200 image has no Jupyter; its wheels travel).

    python scripts/run_notebooks.py notebooks/*.ipynb [--out DIR]

Each notebook runs with notebooks/ as its working directory; the executed copy is written back
(or into --out) so it can be committed with its GPU outputs.

When a kernel dies (a crash in native code leaves nbclient nothing but "DeadKernelError"), the
notebook's code cells are run once more as an IPython script in a child process with
faulthandler on, and the tail of its output and its exit status (a negative status is the signal)
are printed: that is the diagnosis a GPU log needs.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", default=None, help="write executed copies here instead of in place")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # kernels inherit it: a native crash prints a traceback
    failed = 0
    for p in map(Path, args.notebooks):
        nb = nbformat.read(p, as_version=4)
        t0 = time.time()
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(p.parent)}}).execute()
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - report and go on to the next notebook
            status, failed = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[-1][:200]}", failed + 1
            if type(exc).__name__ == "DeadKernelError":
                print(f"{p.name}: the kernel died; rerunning its code as a script to see why", flush=True)
                print(diagnose_dead_kernel(nb, p, args.timeout), flush=True)
        dest = Path(args.out) / p.name if args.out else p
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        print(f"{p.name}: {status} in {time.time() - t0:.1f}s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
