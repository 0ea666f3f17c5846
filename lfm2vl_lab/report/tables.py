"""The generated parts of README.md and docs/*.md. A page marks each part with
``<!-- table:NAME -->`` … ``<!-- /table:NAME -->``; ``report`` redraws what lies between from the
reference set and ``report --check`` says which pages are stale, so prose outside the markers holds
no measured number. The parts live by topic in the ``tables_*`` modules."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..measure.results import REPO_ROOT, RESULTS_ROOT
from . import (
    tables_encoder,
    tables_engine,
    tables_goals,
    tables_graph_configs,
    tables_vllm,
)
from .frames import Refs, TableError, ms, table
from .reference import REFERENCE_GPU, load_manifest, manifest_path

OPEN = re.compile(r"<!-- table:([A-Za-z0-9._-]+) -->")
CLOSE = "<!-- /table:{} -->"
CLOSE_ANY = re.compile(r"<!-- /table:([A-Za-z0-9._-]+) -->")


# The reference set's own parts

def reference_block(refs: Refs) -> str:
    """The manifest: when and from which code the run was recorded, and each role's file."""
    man = refs.manifest
    code = {role: e.get("code_hash", man["code_hash"]) for role, e in man["files"].items()}
    rows = [[f"`{role}`", f"`{e['file']}`", e.get("part"), e.get("rc"), ms(e.get("seconds"), 0),
             f"`{code[role][7:19]}`"] for role, e in man["files"].items()]
    prov = refs(next(iter(man["files"])))["provenance"]
    failed = ", ".join(man.get("failed") or {}) or "none"
    versions = sorted(set(code.values()), key=list(code.values()).index)
    return "\n\n".join([
        f"`{man['command']}` on one {man['gpu']}, {man['started'][:16].replace('T', ' ')} to "
        f"{str(man['finished'])[:16].replace('T', ' ')} UTC; "
        + (f"code `{versions[0][:19]}…`; " if len(versions) == 1 else
           f"{len(versions)} code versions, each role's in the table (each recoverable from the commit that "
           f"recorded it); ")
        + f"{'complete' if man['complete'] else 'incomplete'}, failed steps: {failed}. torch {prov.get('torch')}, "
        f"CUDA {prov.get('cuda')}, transformers {prov.get('transformers')}, Python {prov.get('python')}.",
        table(["role", "file", "part", "exit status", "seconds", "code"], rows),
        f"Manifest: `{refs.shown(manifest_path(refs.gpu, refs.root))}`."])


def _beside_seconds(man: dict, step) -> str:
    """A role beside the set's seconds: the sum over the calls a resumable step took (``calls``), or,
    where its entry predates ``calls``, its last call's seconds, said to be only that."""
    entry = man["files"][step.role]
    calls = entry.get("calls")
    if calls:
        return f"{entry['seconds']:.0f} ({len(calls)} calls: " + " + ".join(f"{c:.0f}" for c in calls) + ")"
    if step.resumable:
        return f"{entry['seconds']:.0f} (its last call only: this manifest does not sum a resumed step's calls)"
    return f"{entry['seconds']:.0f}"


def record_cost_block(refs: Refs) -> str:
    """What a re-record costs: every role, then what `record --changed` re-runs after a change to each
    group of files (the files that move the same roles), with the seconds those roles took in the set."""
    from ..measure.record import STEPS
    from ..measure.role_code import measured_files

    man, groups = refs.manifest, {}
    recorded = [s for s in STEPS if s.role in man["files"]]
    seconds = {s.role: man["files"][s.role].get("seconds") or 0 for s in recorded}
    closure = {s.role: set(measured_files(s.modules)) for s in recorded}
    for f in sorted(set().union(*closure.values())):
        groups.setdefault(tuple(r for r in closure if f in closure[r]), []).append(f)
    own = [s.role for s in recorded if not s.beside]
    rows = [[f"every role of the kit's own ({len(own)})", "a full `record`", f"{sum(seconds[r] for r in own):.0f}"]]
    rows += [[f"`{s.role}` (beside the set, timed apart)", f"`record --part {s.part}`", _beside_seconds(man, s)]
             for s in recorded if s.beside]
    # a resumed role whose entry holds only its last call's seconds: a sum with it is a lower bound
    last_only = {s.role for s in recorded if s.resumable and not man["files"][s.role].get("calls")}
    for roles, files in sorted(groups.items(), key=lambda kv: (-sum(seconds[r] for r in kv[0]), kv[1])):
        shown = ", ".join(f"`{f.removeprefix('lfm2vl_lab/')}`" for f in files[:6])
        rows.append([shown + (f" and {len(files) - 6} more" if len(files) > 6 else ""),
                     "all" if len(roles) == len(recorded) else ", ".join(f"`{r}`" for r in roles),
                     ("≥ " if last_only & set(roles) else "") + f"{sum(seconds[r] for r in roles):.0f}"])
    return "\n\n".join([
        table(["a change to", "re-records", "seconds of steps"], rows),
        "Seconds of steps: what each role's step took when the set was recorded (the manifest's `seconds`), "
        "summed; a call adds the machine's start and the copy of the tree; ≥: the sum holds a resumed role's last "
        "call only. Which roles a file moves is the "
        "import closure of each role's command (`lfm2vl_lab.measure.role_code`); a file in no row (a table, a "
        "figure, the site) moves none.", f"Manifest: `{refs.shown(manifest_path(refs.gpu, refs.root))}`."])


BLOCKS = {"reference-set": reference_block, "record-cost": record_cost_block}


def blocks() -> dict[str, Callable[[Refs], str]]:
    """Every part a page may mark, by name."""
    return {**BLOCKS, **tables_encoder.BLOCKS, **tables_engine.BLOCKS, **tables_goals.BLOCKS,
            **tables_graph_configs.BLOCKS, **tables_vllm.BLOCKS}


def marked(text: str, where: str = "page") -> list[tuple[str, int, int]]:
    """The marked parts of ``text``: ``(name, start, end)`` of what lies between each pair of markers."""
    out, pos = [], 0
    while True:
        m = OPEN.search(text, pos)
        stray = CLOSE_ANY.search(text, pos, m.start() if m else len(text))
        if stray:
            raise TableError(f"{where}: {stray.group(0)} closes a table that was never opened")
        if m is None:
            return out
        name, close = m.group(1), CLOSE.format(m.group(1))
        end = text.find(close, m.end())
        if end < 0:
            raise TableError(f"{where}: <!-- table:{name} --> is never closed (expected {close})")
        inner = OPEN.search(text, m.end(), end)
        if inner is not None:
            raise TableError(f"{where}: <!-- table:{inner.group(1)} --> opens inside table {name!r}")
        out.append((name, m.end(), end))
        pos = end + len(close)


def render_text(text: str, refs: Refs, where: str = "page", known: dict | None = None) -> str:
    """``text`` with every marked part redrawn from ``refs``."""
    known = blocks() if known is None else known
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
    """Redraw the marked parts of ``paths`` (default :func:`pages`). Returns the pages that changed
    (with ``check``: that would change; nothing is written)."""
    refs = refs or Refs()
    known, stale = blocks(), []
    for path in [Path(p) for p in (paths or pages())]:
        text = path.read_text(encoding="utf-8")
        new = render_text(text, refs, str(path), known)
        if new != text:
            stale.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
            say(f"{'stale' if check else 'rewrote'} tables in {path}")
    return stale


def run_tables(args) -> int:
    """Rewrite (``--check``: compare) the generated tables from the reference set under ``--root``."""
    from ..measure.values import UsageError
    from .reference import ReferenceError

    only = args.check or getattr(args, "tables_only", False)
    if not only and Path(args.root).resolve() != RESULTS_ROOT.resolve():
        # the pages describe the repo's own reference set: a report of other results draws figures only
        print(f"tables: {args.root} is not the repo's data/results; the pages' tables are left as they are")
        return 0
    if not only and load_manifest(REFERENCE_GPU, args.root) is None:
        print(f"tables: no reference set under {args.root}; the pages' tables are left as they are")
        return 0
    try:
        stale = write_tables(refs=Refs(root=args.root), check=args.check)
    except (TableError, ReferenceError) as exc:
        raise UsageError(str(exc)) from None
    if args.check and stale:
        print("generated tables are stale: run `python -m lfm2vl_lab report --tables-only`")
        return 1
    return 0
