"""``python -m lfm2vl_lab report``, the command: the docs' generated tables (:mod:`..report.tables`) and
the figures (:mod:`..report.report`) from the reference set under ``--root``, or ``--check`` that the
committed ones are what the set draws."""

from __future__ import annotations

from pathlib import Path

from ..measure.results import RESULTS_ROOT
from ..measure.values import UsageError
from ..report.frames import Refs, TableError
from ..report.reference import REFERENCE_GPU, ReferenceError, load_manifest
from ..report.report import report, unexplained_figures
from ..report.tables import write_tables


def run_tables(args) -> int:
    """Rewrite (``--check``: compare) the generated tables from the reference set under ``--root``."""
    # the pages describe the repo's own reference set: a report of other results draws figures only
    why = (not args.check and not getattr(args, "tables_only", False)) and (
        f"{args.root} is not the repo's data/results" if Path(args.root).resolve() != RESULTS_ROOT.resolve() else
        f"no reference set under {args.root}" if load_manifest(REFERENCE_GPU, args.root) is None else "")
    if why:
        print(f"tables: {why}; the pages' tables are left as they are")
        return 0
    try:
        stale = write_tables(refs=Refs(root=args.root), check=args.check)
    except (TableError, ReferenceError) as exc:
        raise UsageError(str(exc)) from None
    if args.check and stale:
        print("generated tables are stale: run `python -m lfm2vl_lab report --tables-only`")
        return 1
    return 0


def run_report_cli(args) -> int:
    """Draw every figure of the reference set, and rewrite the docs' tables from it."""
    tables = run_tables(args)  # from the reference set under --root
    if args.check and (why := unexplained_figures(args.out, args.root)):
        print("figures not drawn from the reference set: " + "; ".join(why)
              + " (`python -m lfm2vl_lab report` redraws them)")
        return 1
    if args.tables_only or args.check:
        return tables
    return (0 if report(args.root, args.out) else 1) or tables
