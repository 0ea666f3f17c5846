"""Working copies of the notebooks for ``make lab``, so that the committed ones keep their outputs.

    python scripts/lab_copies.py [--dest lab-notebooks] [--fresh]

``notebooks/`` holds the outputs recorded on the H200 and is what git tracks. Learners work in
``lab-notebooks/`` (git-ignored, at the same depth as ``notebooks/``): running a cell there, and
JupyterLab's autosave, change only the copy. This script makes those copies:

- a notebook without a copy is copied;
- a copy the learner has not changed follows its source (after a ``git pull``, say);
- a copy the learner has changed is never overwritten; if its source changed since, it says so and
  names ``make lab-fresh``;
- ``--fresh`` (``make lab-fresh``) takes new copies of every notebook; the copies the learner changed
  move aside first, into ``lab-notebooks/previous-<date-time>/``, and the script prints where.

``lab-notebooks/.sources.json`` remembers, per notebook, the source each copy was made from; a
notebook counts as changed when its JSON differs from that (key order and indentation aside).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "notebooks"
DEST = ROOT / "lab-notebooks"
MANIFEST = ".sources.json"


def digest(path: Path) -> str:
    """sha256 of a notebook's JSON with sorted keys: the same for a copy JupyterLab saved unchanged."""
    raw = path.read_bytes()
    try:
        raw = json.dumps(json.loads(raw), sort_keys=True).encode()
    except ValueError:  # not JSON (any more): its bytes, so it counts as changed and is kept
        pass
    return hashlib.sha256(raw).hexdigest()


def _aside(dest: Path) -> Path:
    """A new folder ``dest/previous-<date-time>`` (with a suffix if that exists already)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = dest / f"previous-{stamp}", 1
    while folder.exists():
        n += 1
        folder = dest / f"previous-{stamp}-{n}"
    folder.mkdir()
    return folder


def prepare(source: Path = SOURCE, dest: Path = DEST, fresh: bool = False, say=print) -> dict[str, str]:
    """Bring ``dest`` up to date with ``source``'s notebooks; returns {notebook name: what happened}.

    What happened is one of ``copied``, ``updated`` (an unchanged copy followed its source),
    ``kept`` (the copy is its source), ``yours`` (the learner changed the copy: kept as it is),
    ``yours, source changed`` (kept too, though its source is newer) and, with ``fresh``,
    ``moved aside to <folder>`` for a changed copy before the new one is taken."""
    notebooks = sorted(source.glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"lab_copies: no notebooks in {source}")
    if dest.resolve() == source.resolve():
        raise SystemExit(f"lab_copies: the working copies cannot live in {source} itself")
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    try:
        made_from = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    except ValueError:  # a damaged record: every existing copy counts as the learner's
        made_from = {}
    done, aside = {}, None
    for src in notebooks:
        copy, new = dest / src.name, digest(src)
        if copy.is_file():
            mine = digest(copy)
            untouched = mine in (made_from.get(src.name), new)  # as copied, or already the source
            if untouched and mine == new:
                made_from[src.name] = new
                done[src.name] = "kept"
                continue
            if not untouched and not fresh:
                changed = made_from.get(src.name) not in (None, new)  # None: a copy this script did not make
                done[src.name] = "yours, source changed" if changed else "yours"
                continue
            if not untouched:
                aside = aside or _aside(dest)
                shutil.move(copy, aside / copy.name)
                done[src.name] = f"moved aside to {aside}"
            else:
                done[src.name] = "updated"
        else:
            done[src.name] = "copied"
        shutil.copyfile(src, copy)
        made_from[src.name] = new
    manifest_path.write_text(json.dumps(made_from, indent=1, sort_keys=True) + "\n")
    _report(done, source, dest, say)
    return done


def _report(done: dict[str, str], source: Path, dest: Path, say) -> None:
    for name, what in done.items():
        if what not in ("kept", "yours"):
            say(f"  {name}: {what}")
    say(f"lab: working copies in {_rel(dest)}/ (git ignores them); the recorded H200 outputs stay in "
        f"{_rel(source)}/ (git checkout {_rel(source)}/ restores them)")
    yours = [name for name, what in done.items() if what.startswith("yours")]
    newer = [name for name in yours if done[name] == "yours, source changed"]
    if yours:
        also = f" ({', '.join(newer)}: newer in {_rel(source)}/)" if newer else ""
        say(f"lab: {len(yours)} of the copies hold your own runs or edits{also}; `make lab-fresh` takes new "
            "copies and moves yours aside")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=SOURCE, help="the committed notebooks (default: notebooks/)")
    p.add_argument("--dest", type=Path, default=DEST, help="the working copies (default: lab-notebooks/)")
    p.add_argument("--fresh", action="store_true", help="new copies of every notebook; changed ones move aside")
    args = p.parse_args(argv)
    prepare(args.source, args.dest, fresh=args.fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
