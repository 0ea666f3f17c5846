"""Command line: ``python -m lfm2vl_lab <subcommand> [options]``.

Subcommands live in ``SUBCOMMANDS``: name → ``(add_args, run)``, where ``add_args(parser)`` adds
the options and ``run(args) -> int`` does the work and returns the exit status (the first line of
``run.__doc__`` becomes the help text). A new subcommand is a module of its own exposing those two
functions plus one line here, e.g.::

    from .check import add_check_args, run_check_cli
    SUBCOMMANDS["check"] = (add_check_args, run_check_cli)

Examples::

    python -m lfm2vl_lab bench --preset tiny --mode lab-eager,hf-eager --workload 1x256 --repeats 5
    python -m lfm2vl_lab bench --mode lab-graph --budgets auto --budgets 256,1024 --cu-rule safe,repeat_last --profile
    python -m lfm2vl_lab report --root data/results --out data/figures
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .args import UsageError
from .attention_probe import add_attention_args, run_attention_cli
from .bench_cli import add_bench_args, run_bench_cli
from .check import add_check_args, run_check_cli
from .e2e import add_e2e_args, run_e2e_cli
from .graph_apis_cli import add_graph_apis_args, run_graph_apis_cli
from .record import add_record_args, run_record_cli
from .report import add_report_args, run_report_cli
from .ttft_cli import add_ttft_args, run_ttft_cli

# name → (add_args(parser), run(args) -> exit status). Add new subcommands here (see module docstring).
SUBCOMMANDS: dict[str, tuple[Callable, Callable]] = {
    "bench": (add_bench_args, run_bench_cli),
    "report": (add_report_args, run_report_cli),
    "check": (add_check_args, run_check_cli),
    "e2e": (add_e2e_args, run_e2e_cli),
    "attention": (add_attention_args, run_attention_cli),
    "ttft": (add_ttft_args, run_ttft_cli),
    "graph-apis": (add_graph_apis_args, run_graph_apis_cli),
    "record": (add_record_args, run_record_cli),
}


def _help(run: Callable) -> str:
    doc = (run.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lfm2vl_lab",
                                     description="lfm2vl-lab: encoder CUDA graphs for LFM2-VL")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name, (add_args, run) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=_help(run), description=_help(run))
        add_args(sp)
        sp.set_defaults(_run=run, _parser=sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns its exit status.

    Bad input never ends in a traceback: argparse's types reject bad values (usage line, one
    ``error:`` line, exit 2), and a subcommand that finds a problem only after parsing (``check``
    without CUDA) raises ``UsageError``, reported the same way. Other exceptions are real bugs and
    keep their traceback.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except UsageError as exc:
        args._parser.error(str(exc))  # prints usage + "error: ..." to stderr, exits 2


if __name__ == "__main__":
    sys.exit(main())
