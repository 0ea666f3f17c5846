"""Learner copies of the notebooks for a workshop: the cells tagged ``solution`` removed.

    python scripts/handout.py [notebooks/*.ipynb] [--out handout] [--keep-outputs]

By default every output is cleared as well, so learners run each cell themselves; ``--keep-outputs``
keeps the committed H200 outputs (figures included) of the cells that stay, for rooms without GPUs.
The exercise cells that ask for a prediction stay. ``make handout`` runs this on every notebook.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbformat

SOLUTION_TAG = "solution"
REPO_ROOT = Path(__file__).resolve().parents[1]


def handout(nb: nbformat.NotebookNode, keep_outputs: bool = False) -> tuple[nbformat.NotebookNode, int]:
    """``nb`` without its solution cells (and, unless ``keep_outputs``, without outputs): returns the
    new notebook and the number of cells removed. ``nb`` itself is not changed."""
    out = nbformat.from_dict(nb)
    kept = [c for c in out.cells if SOLUTION_TAG not in c.get("metadata", {}).get("tags", [])]
    removed = len(out.cells) - len(kept)
    if not keep_outputs:
        for cell in kept:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
    out.cells = kept
    return out, removed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "handout", help="folder for the copies (default handout/)")
    ap.add_argument("--keep-outputs", action="store_true", help="keep the outputs of the cells that stay")
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
    args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        nb, removed = handout(nbformat.read(path, as_version=4), args.keep_outputs)
        nbformat.write(nb, args.out / path.name)
        print(f"{path.name}: {removed} solution cell(s) removed -> {args.out / path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
