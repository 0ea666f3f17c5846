"""``python -m lfm2vl_lab record``, the command: the reference run (:mod:`.record`), then what derives
from the set (:func:`derive_set`); ``--take`` and ``--dry-run`` need no GPU."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from ..measure import schedule
from ..measure.record import DEFAULT_PARTS, STEPS, run_record, stale, take, why_text
from ..measure.results import code_hash
from ..measure.values import UsageError
from ..report.reference import load_manifest


def derive_set(man: dict, before: str, out, repo_root, say=print) -> None:
    """After ``record``: redraw the figures and generated pages when the call changed a role (``before``:
    the manifest's files as they were) or completed the set, and only where it wrote into the repo's
    results (files recorded elsewhere are derived when ``record --take`` brings them in). The report
    layer is imported only then: a record into another folder (a lent machine's output) never loads it."""
    changed = json.dumps([man["files"], man.get("partial")]) != before
    if not (changed or man.get("complete")) or Path(out).resolve() != Path(repo_root).resolve():
        return
    from ..report.report import report
    from . import cli_report  # through the module: a test stands in for its run_tables

    figures = Path(repo_root).parent / "figures"
    try:  # the recorded files and the manifest stand whatever happens here: `report` can redo this
        cli_report.run_tables(SimpleNamespace(root=str(out), tables_only=False, check=False))
        say(f"figures: {len(report(out, figures, verbose=False))} drawn from the set into {figures}")
    except Exception as exc:
        say(f"figures and tables: not redrawn ({type(exc).__name__}: {exc}); `python -m lfm2vl_lab report` redoes it")


def asked_roles(args) -> tuple[str, ...] | None:
    """The roles ``--role`` names (None: none named), each checked against the steps (:mod:`.schedule`)."""
    if not args.role:
        return None
    schedule.asked_roles(args.role, STEPS)
    return tuple(dict.fromkeys(args.role))


def dry_run(args, parts) -> None:
    """Each step of ``parts``, its limit, and whether this call would run it and why."""
    man, hash_ = load_manifest(root=args.out) or {"files": {}}, code_hash()
    roles = asked_roles(args)
    for e in man["files"].values():
        e.setdefault("code_hash", man.get("code_hash"))
    for s in STEPS:
        if roles is not None and s.role in roles:
            print(f"{s.part:>8} {s.role:<16} {s.limit_s:>4} s  runs: asked for  {s.command}")
        elif roles is None and s.part in parts:
            why = ["--again"] if args.again else stale(man, s, args.changed, hash_)
            print(f"{s.part:>8} {s.role:<16} {s.limit_s:>4} s  {'runs: ' + why_text(why) if why else 'kept'}  "
                  f"{s.command}")


def run_record_cli(args) -> int:
    """Record the reference set on this GPU: every file the notebooks, figures and tables read."""
    parts, roles = tuple(args.part or DEFAULT_PARTS), asked_roles(args)
    if args.take:
        if not list(Path(args.take).glob("*/reference.json")):
            raise UsageError(f"--take {args.take}: no <gpu>/reference.json under it (give the --out of a record)")
        take(args.take, args.out)
        for man in Path(args.out).glob("*/reference.json"):  # then what derives from the set, as record does
            derive_set(json.loads(man.read_text()), "", args.out, args.out)
        return 0
    if args.dry_run:
        dry_run(args, parts)
        return 0
    import torch

    if not torch.cuda.is_available():
        raise UsageError("record needs a CUDA GPU and none is available: the reference set is a GPU run "
                         "(`--dry-run` lists its steps)")
    man = run_record(parts, args.out, deadline_s=args.deadline, again=args.again, changed=args.changed,
                     derive=derive_set, roles=roles)
    return 0 if not man["failed"] else 1
