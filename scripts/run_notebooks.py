"""Execute notebooks in place with nbclient (the H200 image has no Jupyter; its wheels travel).

    python scripts/run_notebooks.py notebooks/*.ipynb [--out DIR]

Each notebook runs with notebooks/ as its working directory; the executed copy is written back
(or into --out) so it can be committed with its GPU outputs.
"""

import argparse
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", default=None, help="write executed copies here instead of in place")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args()
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
        dest = Path(args.out) / p.name if args.out else p
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        print(f"{p.name}: {status} in {time.time() - t0:.1f}s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
