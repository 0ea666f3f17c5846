"""Command line: ``python -m lfm2vl_lab <command> [options]``.

``SUBCOMMANDS`` maps each command to ``(add_args, run)``: ``add_args(parser)`` adds its options and
``run(args) -> int`` does the work and returns the exit status (the first line of ``run.__doc__`` is
the help text). Every ``add_args`` lives in :mod:`.cli_options`, which imports no torch, so ``--help``
answers at once; each run imports what it needs when it runs. The encoder's runs live here:
``bench``, ``check`` and ``attention``; the others are loaded by name (:func:`lazy`) when they run:
``graph-apis`` from :mod:`.cli_graph_apis`, the whole-request ones, ``e2e`` and ``ttft``, from
:mod:`.cli_serving`, the text model's peers, ``engine``, from :mod:`.cli_engine`, vLLM itself,
``vllm``, from :mod:`.cli_vllm`, the kit's pipeline on vLLM's A/B, ``pipeline``, from :mod:`.cli_pipeline`,
and ``report`` and ``record`` from :mod:`.cli_report` and :mod:`.cli_record`, beside the layers they
drive (:mod:`lfm2vl_lab.report`, :mod:`lfm2vl_lab.measure.record`). The measurements themselves
(:mod:`.bench`, :mod:`.check`, ...) and the report layer know no argparse.

Examples::

    python -m lfm2vl_lab bench --preset tiny --mode lab-eager,hf-eager --workload 1x256 --repeats 5
    python -m lfm2vl_lab bench --mode lab-graph --budgets auto --budgets 256,1024 --cu-rule safe,repeat_last --profile
    python -m lfm2vl_lab bench --mode lab-graph --graph-config kit,pr --workload 16x512,stream
    python -m lfm2vl_lab report --root data/results --out data/figures
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from ..measure.results import RESULTS_ROOT, gpu_slug
from ..measure.values import UsageError
from .args import flatten
from .cli_options import (
    CHECK_PRESETS,
    DEFAULT_MODES,
    DEFAULT_WORKLOADS,
    add_attention_args,
    add_bench_args,
    add_check_args,
    add_e2e_args,
    add_engine_args,
    add_graph_apis_args,
    add_pipeline_args,
    add_record_args,
    add_report_args,
    add_roofline_args,
    add_ttft_args,
    add_vllm_args,
)


def command_line() -> str:
    """The command as typed: how result files name the run."""
    return "python -m lfm2vl_lab " + " ".join(sys.argv[1:])


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------

# bench's setting flags (argparse dest -> the GraphOptions setting it sweeps): a comma list, or a
# repeated --budgets, is a sweep; each default is the setting's own (GraphOptions)
BENCH_SWEEPS = {"budgets": "budgets", "cu_rule": "cu_seqlens_rule", "max_seqlen_mode": "max_seqlen_mode",
                "attention": "attention", "fuse_qkv": "fuse_qkv", "fuse_elementwise": "fuse_elementwise",
                "dense_graphs": "dense_graphs"}


def bench_sweep(args) -> dict[str, list]:
    """The sweep bench's flags ask for: ``{GraphOptions setting: [values]}`` of each flag given."""
    return {field: getattr(args, dest) for dest, field in BENCH_SWEEPS.items() if getattr(args, dest)}


def bench_graph_configs(args) -> list[str] | None:
    """The named graph configs ``--graph-config`` sweeps (None: none named). A named config sets the
    budgets and the item limit itself, so ``--budgets`` beside it is a :class:`UsageError`."""
    if not args.graph_config:
        return None
    if args.budgets:
        raise UsageError(f"--graph-config {','.join(args.graph_config)} sets the budgets itself: leave out --budgets")
    return list(dict.fromkeys(args.graph_config))


def _save_figure(result: dict, figure: str, source: Path) -> Path:
    """This run's latency figure, naming its result file ``source`` in the PNG (no role: a file of no
    reference set)."""
    from ..report.figure_source import save_figure, source_of
    from ..report.plots import latency_figure

    p = result["provenance"]
    auto = RESULTS_ROOT.parent / "figures" / f"last-bench-{gpu_slug(p['gpu'])}.png"
    path = auto if figure == "auto" else Path(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"Encoder latency per mode: {p['preset']}, {p['dtype']}, {p['gpu']} (whisker: p90)"
    save_figure(latency_figure(result["rows"], title), path, [source_of({**result, "_path": source})], dpi=110)
    return path


def run_bench_cli(args) -> int:
    """Benchmark encoder modes on workloads; print a table and write a result JSON."""
    from ..measure.bench import run_bench
    from ..measure.results import ResultFile
    from ..measure.table import print_table

    from_main = sys.argv and sys.argv[0].endswith("__main__.py")
    file = ResultFile(args.out, args.name)  # saved after every job: a run killed by a time limit keeps them

    result = run_bench(
        preset=args.preset, modes=flatten(args.mode) or DEFAULT_MODES,
        workloads=flatten(args.workload) or DEFAULT_WORKLOADS, dtype=args.dtype, repeats=args.repeats,
        warmup=args.warmup, device=args.device, stream_n=args.stream_n, sweep=bench_sweep(args),
        graph_configs=bench_graph_configs(args), compile_mode=args.compile_mode, profile=args.profile,
        progress=not args.no_progress, seed=args.seed, trace_dir=args.trace_dir,
        command=command_line() if from_main else None, name=args.name, on_job=file.save)
    print_table(result)
    path = file.save(result)
    print(f"results: {path}")
    if args.figure != "none" and result["rows"]:
        print(f"figure: {_save_figure(result, args.figure, path)}")
    return 1 if result["errors"] else 0


# --------------------------------------------------------------------------------------------
# check and attention (GPU only)
# --------------------------------------------------------------------------------------------


def need_cuda(what: str) -> None:
    """A :class:`UsageError` naming ``what`` where this machine has no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"{what} needs a CUDA GPU and none is available{_NO_CUDA_HINT.get(what, '')}")


_NO_CUDA_HINT = {"check": "; on a CPU run the test suite instead (make test)",
                 "graph-apis": "; without one, notebook 02 reads the recorded graph-apis-*.json from data/results/"}


def run_check_cli(args) -> int:
    """Correctness on the GPU: parity, no host sync, replay vs eager for every budget and rule."""
    from ..measure.check import main

    need_cuda("check")
    result = main(presets=tuple(args.preset or CHECK_PRESETS), dtype=args.dtype, out_dir=args.out,
                  command=command_line())
    return 0 if result["pass"] else 1


def run_attention_cli(args) -> int:
    """Time the capturable attention kernels inside CUDA graphs (GPU only)."""
    from ..measure.attention_probe import probe
    from ..measure.results import provenance, save_result

    need_cuda("the attention probe")
    rows = [r for name in args.preset or CHECK_PRESETS for r in probe(name)]
    result = {"name": "attention", "provenance": provenance(command_line(), dtype="bfloat16"), "rows": rows}
    for r in rows:
        what = (f"{1000 * r['graph_ms_per_layer']:8.1f} us/layer  err {r['rel_err_vs_fp32']:.1e}"
                if "error" not in r else f"FAILED {r['error'][:90]}")
        print(f"{r['preset']:>14} h{r['heads']}x{r['head_dim']} {str(r['layout'])[:28]:>28} {r['backend']:>15} {what}")
    print("results:", save_result(result, args.out or RESULTS_ROOT, "attention"))
    return 0



# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


def lazy(module: str, function: str, help: str) -> Callable:
    """A subcommand's ``run(args)`` that imports ``lfm2vl_lab.<module>`` only when it runs, then calls
    its ``function``; ``help`` is that function's first docstring line (tests/test_cli_lazy.py checks)."""

    def run(args) -> int:
        return getattr(importlib.import_module(f"lfm2vl_lab.{module}"), function)(args)

    run.__doc__, run.__name__, run.target = help, function, (module, function)
    return run


# name → (add_args(parser), run(args) -> exit status). Add new subcommands here (see module docstring).
SUBCOMMANDS: dict[str, tuple[Callable, Callable]] = {
    "bench": (add_bench_args, run_bench_cli),
    "report": (add_report_args, lazy("cli.cli_report", "run_report_cli",
                                     "Draw every figure of the reference set, and rewrite the docs' tables from it.")),
    "check": (add_check_args, run_check_cli),
    "e2e": (add_e2e_args, lazy("cli.cli_serving", "run_e2e_cli", "End to end: generate() TTFT and latency, "
                               "transformers' image path vs the graphed encoder.")),
    "attention": (add_attention_args, run_attention_cli),
    "ttft": (add_ttft_args, lazy("cli.cli_serving", "run_ttft_cli", "TTFT like an engine: text eager/graphed x encoder "
                                 "eager/graphed, phases, decode, parity.")),
    "engine": (add_engine_args, lazy("cli.cli_engine", "run_engine_cli", "The text model's peers: generate, "
                                     "transformers' static compile, torch.compile, the engine, fused.")),
    "graph-apis": (add_graph_apis_args, lazy("cli.cli_graph_apis", "run_graph_apis_cli",
                                             "Record the graph-API demos of notebook 02 (capture trace, "
                                             "make_graphed_callables, reduce-overhead).")),
    "record": (add_record_args, lazy("cli.cli_record", "run_record_cli", "Record the reference set on this GPU: "
                                     "every file the notebooks, figures and tables read.")),
    "vllm": (add_vllm_args, lazy("cli.cli_vllm", "run_vllm_cli", "vLLM itself on the GPU: encoder graphs off, the PR's "
                                 "config and the kit's.")),
    "pipeline": (add_pipeline_args, lazy("cli.cli_pipeline", "run_pipeline_cli", "The kit's pipeline on vLLM's A/B: "
                                         "the same cases, arms, weights and parity judge.")),
    "roofline": (add_roofline_args, lazy("cli.cli_roofline", "run_roofline_cli", "After the graphs: the GPU's "
                                         "roofs, a kernel boundary's cost, a decode step's kernels against them.")),
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
    without CUDA) raises ``UsageError``, reported the same way; so is a checkpoint folder that does
    not load (``LFM2VL_CHECKPOINT``, :class:`~lfm2vl_lab.model.presets.CheckpointError`), whichever
    command loads it. Other exceptions are real bugs and keep their traceback.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except UsageError as exc:
        args._parser.error(str(exc))  # prints usage + "error: ..." to stderr, exits 2
    except ValueError as exc:
        from ..model.presets import CheckpointError  # loaded already where a checkpoint was read

        if not isinstance(exc, CheckpointError):
            raise
        args._parser.error(str(exc))



if __name__ == "__main__":
    sys.exit(main())
