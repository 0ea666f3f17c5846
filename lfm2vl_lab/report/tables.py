"""The generated parts of README.md and docs/*.md. A page marks each part with ``<!-- table:NAME -->`` …
``<!-- /table:NAME -->``; ``report`` redraws what lies between from the reference set and ``report --check``
says which pages are stale, so prose outside the markers holds no measured number. The ``tables_*`` modules
declare the parts by topic; this one the set's own, ``reference-set`` (the manifest)."""

from __future__ import annotations

import re
from pathlib import Path

from ..measure.results import REPO_ROOT
from . import tables_encoder, tables_goals, tables_vllm
from .frames import Refs, TableError, ms, part, table
from .reference import role_code_hash

MARKER = re.compile(r"<!-- (/?)table:([A-Za-z0-9._-]+) -->")


def reference_set(refs) -> list:
    """The manifest: when and from which code the run was recorded, and each role's file."""
    man = refs.manifest
    code = {role: role_code_hash(man, role) for role in man["files"]}
    prov = refs(next(iter(man["files"])))["provenance"]
    return [f"`{man['command']}` on one {man['gpu']}, {man['started'][:16].replace('T', ' ')} to "
            f"{str(man['finished'])[:16].replace('T', ' ')} UTC; {len(set(code.values()))} code version(s); "
            f"{'complete' if man['complete'] else 'incomplete'}, failed steps: "
            f"{', '.join(man.get('failed') or {}) or 'none'}. torch {prov.get('torch')}, CUDA {prov.get('cuda')}, "
            f"transformers {prov.get('transformers')}, Python {prov.get('python')}.",
            table(["role", "file", "part", "exit status", "seconds", "code"], [
                [f"`{role}`", f"`{e['file']}`", e.get("part"), e.get("rc"), ms(e.get("seconds"), 0),
                 f"`{code[role][7:19]}`"] for role, e in man["files"].items()]), refs.source()]


BLOCKS = {"reference-set": part((), reference_set), **tables_encoder.BLOCKS, **tables_goals.BLOCKS,
          **tables_vllm.BLOCKS}


def marked(text: str, where: str = "page") -> list[tuple[str, int, int]]:
    """The marked parts of ``text``: ``(name, start, end)`` of what lies between each pair of markers."""
    out, opened = [], None
    for m in MARKER.finditer(text):
        closes, name = m.group(1), m.group(2)
        if closes and (opened is None or opened.group(2) != name):
            raise TableError(f"{where}: {m.group(0)} closes a table that was never opened")
        if not closes and opened is not None:
            raise TableError(f"{where}: <!-- table:{name} --> opens inside table {opened.group(2)!r}")
        if closes:
            out.append((name, opened.end(), m.start()))
        opened = None if closes else m
    if opened is not None:
        raise TableError(f"{where}: {opened.group(0)} is never closed (expected <!-- /table:{opened.group(2)} -->)")
    return out


def render_text(text: str, refs: Refs, where: str = "page", known: dict = BLOCKS) -> str:
    """``text`` with every marked part redrawn from ``refs``."""
    parts, pos = [], 0
    for name, start, end in marked(text, where):
        if name not in known:
            raise TableError(f"{where}: unknown table {name!r} (known: {', '.join(sorted(known))})")
        parts += [text[pos:start], "\n\n", known[name](refs).strip("\n"), "\n\n"]
        pos = end
    return "".join(parts) + text[pos:]


def pages(repo: Path = REPO_ROOT) -> list[Path]:
    """The pages that may hold marked parts: README.md and docs/*.md."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def write_tables(paths=None, refs: Refs | None = None, check: bool = False, say=print) -> list[Path]:
    """Redraw the marked parts of ``paths`` (default :func:`pages`); the pages that changed (``check``: would)."""
    refs, stale = refs or Refs(), []
    for path in [Path(p) for p in (paths or pages())]:
        text = path.read_text(encoding="utf-8")
        new = render_text(text, refs, str(path))
        if new != text:
            stale.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
            say(f"{'stale' if check else 'rewrote'} tables in {path}")
    return stale

