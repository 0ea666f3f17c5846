"""Write the recorded versions of the measured files that a device call needs into ``.blobs/``.

``record --changed`` keeps a role whose files changed only in comments, blank lines or docstrings
(lfm2vl_lab/measure/role_code.py, ``same_code``). To see that, it reads the version each role
recorded, by its blob id. A clone has them in git; a device call gets the working tree without its
history, so before such a call run this, and name ``.blobs`` in the call's ``carry``:

    python scripts/carry_blobs.py          # every manifest under data/results/
    python scripts/carry_blobs.py --check  # on the device: exit 1 if a recorded version is unreadable

It writes each blob that a manifest entry (recorded or partial) names and the tree no longer holds,
and nothing else (a few hundred KB at most). Git ignores the folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lfm2vl_lab.measure.role_code import BLOBS, blob_ids, recorded_bytes  # noqa: E402


def needed(root: Path) -> dict[str, str]:
    """blob id -> the file it is a version of, for every measured file whose recorded version the
    tree under ``root`` no longer holds."""
    out = {}
    for manifest in sorted((root / "data" / "results").glob("*/reference.json")):
        man = json.loads(manifest.read_text())
        for entry in [*man.get("files", {}).values(), *man.get("partial", {}).values()]:
            then = entry.get("measures", {})
            now = blob_ids(then, root)
            out.update((blob, path) for path, blob in then.items() if now[path] != blob)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the repo (default: this one)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: exit 1 naming each recorded version neither git nor .blobs/ holds "
                        "(scripts/h200_run.sh runs this before it records: such a role would record again)")
    args = p.parse_args(argv)
    root = Path(args.root)
    if args.check:
        unread = [f"{path} ({blob[:12]})" for blob, path in sorted(needed(root).items())
                  if recorded_bytes(blob, root) is None]
        print(f"carry_blobs --check: {len(needed(root))} recorded versions needed"
              + (f"; UNREADABLE, so their roles would record again: {', '.join(unread)} (run "
                 "`python scripts/carry_blobs.py` where git is, and carry .blobs)" if unread else ", all readable"))
        return 1 if unread else 0
    folder = root / BLOBS
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    written, unread = 0, []
    for blob, path in sorted(needed(root).items()):
        data = recorded_bytes(blob, root)
        if data is None:
            unread.append(f"{path} ({blob[:12]})")
            continue
        (folder / blob).write_bytes(data)
        written += len(data)
    print(f"carry_blobs: {len(list(folder.iterdir()))} recorded versions, {written / 1024:.0f} KB, in {folder}"
          + (f"; not in git, so those roles count as changed: {', '.join(unread)}" if unread else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
