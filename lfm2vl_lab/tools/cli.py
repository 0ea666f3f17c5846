"""Command line: ``python -m lfm2vl_lab <command> [options]``.

``SUBCOMMANDS`` maps each command to ``(add_args, run)``: ``add_args(parser)`` adds its options and
``run(args) -> int`` does the work and returns the exit status (the first line of ``run.__doc__`` is
the help text). The encoder's commands live here, their options beside their run: ``bench``,
``check``, ``attention`` and ``graph-apis``; the whole-request ones, ``e2e`` and ``ttft``, in
:mod:`.cli_serving`; the text model's peers, ``engine``, in :mod:`.cli_engine`; vLLM itself,
``vllm``, in :mod:`.cli_vllm`; ``report`` and
``record`` beside what they drive (:mod:`.report`, :mod:`.record`). The measurements themselves
(:mod:`.bench`, :mod:`.check`, ...) know no argparse.

Examples::

    python -m lfm2vl_lab bench --preset tiny --mode lab-eager,hf-eager --workload 1x256 --repeats 5
    python -m lfm2vl_lab bench --mode lab-graph --budgets auto --budgets 256,1024 --cu-rule safe,repeat_last --profile
    python -m lfm2vl_lab bench --mode lab-graph --graph-config kit,pr --workload 16x512,stream
    python -m lfm2vl_lab report --root data/results --out data/figures
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from ..core.config import CU_SEQLENS_RULES, GRAPH_CONFIGS, MAX_SEQLEN_MODES, GraphOptions
from ..kernels.attention import ATTENTION_BACKENDS
from .args import (
    UsageError,
    budgets_arg,
    choice_arg,
    device_arg,
    dtype_arg,
    flatten,
    int_arg,
    list_arg,
    on_off_list,
    positive_int,
    preset_arg,
    workloads_arg,
)
from .check import PRESETS as CHECK_PRESETS  # check and attention run both presets by default
from .cli_engine import add_engine_args, run_engine_cli
from .cli_serving import add_e2e_args, add_ttft_args, run_e2e_cli, run_ttft_cli
from .cli_vllm import add_vllm_args, run_vllm_cli
from .graph_apis import NAME, RECORDERS, graphed_lines, reduce_overhead_lines, trace_lines
from .modes import COMPILE_MODES, DEFAULT_MODES, MODES
from .record import add_record_args, run_record_cli
from .report import add_report_args, run_report_cli
from .results import RESULTS_ROOT, gpu_slug, provenance, save_result
from .workloads import DEFAULT_WORKLOADS


def _command() -> str:
    return "python -m lfm2vl_lab " + " ".join(sys.argv[1:])


def _on_off(v: bool) -> str:
    return "on" if v else "off"


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------

# bench's setting flags (argparse dest -> the GraphOptions setting it sweeps): a comma list, or a
# repeated --budgets, is a sweep; each default is the setting's own (GraphOptions)
BENCH_SWEEPS = {"budgets": "budgets", "cu_rule": "cu_seqlens_rule", "max_seqlen_mode": "max_seqlen_mode",
                "attention": "attention", "fuse_qkv": "fuse_qkv", "fuse_elementwise": "fuse_elementwise",
                "dense_graphs": "dense_graphs"}


def add_bench_args(p) -> None:
    """Options of ``python -m lfm2vl_lab bench``. Every value is checked here (argparse types), so
    a bad one is a one-line error with exit status 2 before anything is built."""
    add, d = p.add_argument, GraphOptions
    add("--preset", type=preset_arg, default=None, help="model preset (default: lfm2-vl-450m on CUDA, tiny on CPU)")
    add("--mode", action="append", type=list_arg(choice_arg("mode", MODES)), default=None,
        help=f"mode(s), repeatable or comma list: {', '.join(MODES)} (default: all but "
             f"{' and '.join(m for m in MODES if m not in DEFAULT_MODES)})")
    add("--workload", action="append", type=workloads_arg, default=None,
        help=f"workload(s), repeatable or comma list: NxS (4x512), A..BxS (1..16x512), tiled, stream "
             f"(default: {','.join(DEFAULT_WORKLOADS)})")
    add("--dtype", type=dtype_arg, default=None, help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    add("--repeats", type=positive_int, default=None, help="timed calls per row (default: 50 CUDA / 5 CPU)")
    add("--warmup", type=int_arg(0), default=None, help="untimed calls before timing (default: 10 CUDA / 3 CPU)")
    add("--device", type=device_arg, default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    add("--stream-n", type=positive_int, default=200, help="requests in the stream workload (default: 200)")
    add("--budgets", action="append", type=budgets_arg, default=None,
        help="graph budget set, repeatable to sweep: 'auto' or a comma list of token counts (default: auto)")
    add("--cu-rule", type=list_arg(choice_arg("cu rule", CU_SEQLENS_RULES)), default=d.cu_seqlens_rule,
        help=f"cu_seqlens padding rule(s), comma list: {', '.join(CU_SEQLENS_RULES)} (default: {d.cu_seqlens_rule})")
    add("--max-seqlen-mode", type=list_arg(choice_arg("max-seqlen mode", MAX_SEQLEN_MODES)),
        default=d.max_seqlen_mode,
        help=f"max_seqlen mode(s), comma list: {', '.join(MAX_SEQLEN_MODES)} (default: {d.max_seqlen_mode})")
    add("--fused-compile-mode", dest="compile_mode", metavar="FUSED_COMPILE_MODE",
        type=choice_arg("compile mode", COMPILE_MODES),
        default="default", help="torch.compile mode of the lab-graph-fused body (default: default; the "
                                "max-autotune ones compile for minutes)")
    add("--attention", type=list_arg(choice_arg("attention backend", ("auto", *ATTENTION_BACKENDS))),
        default=d.attention, help=f"attention backend(s) of the lab modes, comma list: auto, "
                                  f"{', '.join(ATTENTION_BACKENDS)} (default: {d.attention})")
    add("--fuse-qkv", type=on_off_list, default=None,
        help=f"fused q/k/v GEMM in the lab modes, comma list: off, on (default: {_on_off(d.fuse_qkv)})")
    add("--fuse-elementwise", type=on_off_list, default=None,
        help="lab modes: residual add + LayerNorm in one Triton kernel and bias + GELU in the GEMM epilogue, "
             f"comma list: off, on (default: {_on_off(d.fuse_elementwise)})")
    add("--dense-graphs", type=on_off_list, default=None,
        help="lab-graph: dense-attention graph variants for runs of full-length items, comma list: off, on "
             f"(default: {_on_off(d.dense_graphs)})")
    add("--graph-config", type=list_arg(choice_arg("graph config", GRAPH_CONFIGS)), default=None,
        help=f"graph modes: named graph config(s), comma list: {', '.join(GRAPH_CONFIGS)} (pr: the budgets and "
             "item limit vLLM PR #44930 measured with; a named config sets the budgets, so not with --budgets; "
             "default: none named)")
    add("--profile", action="store_true", help="add torch.profiler metrics (GPU-busy, kernels, launches, timeline)")
    add("--trace-dir", default=None, help="with --profile: keep the Chrome traces here")
    add("--seed", type=int, default=0, help="seed of the random weights and the synthetic images (default: 0)")
    add("--out", default=str(RESULTS_ROOT), help="results root (default: data/results)")
    add("--name", default="bench", help="result file name prefix (default: bench)")
    add("--no-progress", action="store_true", help="no progress bars")
    add("--figure", default="auto",
        help="PNG of this run's latencies (default: data/figures/last-bench-<device>.png; 'none' to skip)")


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
    from .figure_source import save_figure, source_of
    from .plots import latency_figure

    p = result["provenance"]
    auto = RESULTS_ROOT.parent / "figures" / f"last-bench-{gpu_slug(p['gpu'])}.png"
    path = auto if figure == "auto" else Path(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"Encoder latency per mode: {p['preset']}, {p['dtype']}, {p['gpu']} (whisker: p90)"
    save_figure(latency_figure(result["rows"], title), path, [source_of({**result, "_path": source})], dpi=110)
    return path


def run_bench_cli(args) -> int:
    """Benchmark encoder modes on workloads; print a table and write a result JSON."""
    from .bench import run_bench
    from .table import print_table

    from_main = sys.argv and sys.argv[0].endswith("__main__.py")
    saved: dict = {}

    def checkpoint(partial: dict) -> None:  # a run killed by a time limit still leaves its finished modes
        saved["path"] = save_result(partial, args.out, args.name, saved.get("path"))

    result = run_bench(
        preset=args.preset, modes=flatten(args.mode) or DEFAULT_MODES,
        workloads=flatten(args.workload) or DEFAULT_WORKLOADS, dtype=args.dtype, repeats=args.repeats,
        warmup=args.warmup, device=args.device, stream_n=args.stream_n, sweep=bench_sweep(args),
        graph_configs=bench_graph_configs(args), compile_mode=args.compile_mode, profile=args.profile,
        progress=not args.no_progress, seed=args.seed, trace_dir=args.trace_dir,
        command=_command() if from_main else None, name=args.name, on_job=checkpoint)
    print_table(result)
    path = save_result(result, args.out, args.name, saved.get("path"))
    print(f"results: {path}")
    if args.figure != "none" and result["rows"]:
        print(f"figure: {_save_figure(result, args.figure, path)}")
    return 1 if result["errors"] else 0


# --------------------------------------------------------------------------------------------
# check and attention (GPU only)
# --------------------------------------------------------------------------------------------


def _need_cuda(what: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"{what} needs a CUDA GPU and none is available{_NO_CUDA_HINT.get(what, '')}")


_NO_CUDA_HINT = {"check": "; on a CPU run the test suite instead (make test)",
                 "graph-apis": "; without one, notebook 02 reads the recorded graph-apis-*.json from data/results/"}


def add_check_args(p) -> None:
    """Options of ``python -m lfm2vl_lab check``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help=f"preset(s) to check (repeatable; default: {' and '.join(CHECK_PRESETS)})")
    p.add_argument("--dtype", type=dtype_arg, default="bf16", help="bf16 | fp16 | fp32 (default: bf16)")
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def run_check_cli(args) -> int:
    """Correctness on the GPU: parity, no host sync, replay vs eager for every budget and rule."""
    from .check import main

    _need_cuda("check")
    result = main(presets=tuple(args.preset or CHECK_PRESETS), dtype=args.dtype, out_dir=args.out,
                  command=_command())
    return 0 if result["pass"] else 1


def add_attention_args(p) -> None:
    """Options of ``python -m lfm2vl_lab attention``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help=f"preset(s) (default: {', '.join(CHECK_PRESETS)})")
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def run_attention_cli(args) -> int:
    """Time the capturable attention kernels inside CUDA graphs (GPU only)."""
    from .attention_probe import probe

    _need_cuda("the attention probe")
    rows = [r for name in args.preset or CHECK_PRESETS for r in probe(name)]
    result = {"name": "attention", "provenance": provenance(_command(), dtype="bfloat16"), "rows": rows}
    for r in rows:
        what = (f"{1000 * r['graph_ms_per_layer']:8.1f} us/layer  err {r['rel_err_vs_fp32']:.1e}"
                if "error" not in r else f"FAILED {r['error'][:90]}")
        print(f"{r['preset']:>14} h{r['heads']}x{r['head_dim']} {str(r['layout'])[:28]:>28} {r['backend']:>15} {what}")
    print("results:", save_result(result, args.out or RESULTS_ROOT, "attention"))
    return 0


# --------------------------------------------------------------------------------------------
# graph-apis: notebook 02's demos recorded on a GPU
# --------------------------------------------------------------------------------------------


# each part's result as the terminal shows it
FORMATTERS: dict[str, Callable] = {
    "trace": trace_lines, "graphed_callables": graphed_lines, "reduce_overhead": reduce_overhead_lines,
    "capture_errors": lambda errs: "\n".join(
        f"capture of {name:<24} {'captured' if o['captured'] else o['error']}" for name, o in errs.items())}


def record_graph_apis(root=None, command: str | None = None, device="cuda",
                      recorders: dict | None = None) -> tuple[dict, Path]:
    """Run ``recorders`` (default: every part of :data:`~.graph_apis.RECORDERS`: the API calls of
    capture and replay, the ``make_graphed_callables`` demo, the ``reduce-overhead`` demo, what
    breaks a capture) on ``device`` in turn; return the result and the path of the
    ``graph-apis-<date>.json`` that holds it, rewritten after each part. ``seconds`` says how long
    each part took; ``errors`` lists the parts that failed (their entry is then ``None``), each
    with its traceback, while the next part runs."""
    prov = provenance(command or "python -m lfm2vl_lab graph-apis", device=device, preset="toy-mlp",
                      dtype="float32")
    result: dict = {"name": NAME, "provenance": prov, "seconds": {}, "errors": []}
    path = None
    for part, fn in (RECORDERS if recorders is None else recorders).items():
        t0 = time.perf_counter()
        try:
            result[part] = fn(device)
        except Exception as exc:  # recorded with its traceback, then the next part
            result[part] = None
            result["errors"].append({"part": part, "error": repr(exc), "traceback": traceback.format_exc(),
                                     "recovery": _recover()})
        result["seconds"][part] = round(time.perf_counter() - t0, 2)
        path = save_result(result, root if root is not None else RESULTS_ROOT, NAME, path)
    return result, path


def _recover() -> str:
    """After a failed part, put torch's stream and CUDA RNG back in case it failed inside a capture
    (see :func:`~lfm2vl_lab.core.capture.recover_from_failed_capture`), so the next part can run.
    Returns what that did, or why it could not: the next part then shows what is still broken."""
    from ..core.capture import recover_from_failed_capture

    try:
        return str(recover_from_failed_capture())
    except Exception as exc:  # recorded, not raised: the run goes on
        return f"recovery failed: {exc!r}"


def add_graph_apis_args(p) -> None:
    """Options of ``python -m lfm2vl_lab graph-apis``."""
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def run_graph_apis_cli(args) -> int:
    """Record the graph-API demos of notebook 02 (capture trace, make_graphed_callables, reduce-overhead)."""
    _need_cuda("graph-apis")
    result, path = record_graph_apis(args.out, _command())
    for part, fmt in FORMATTERS.items():
        if result.get(part) is not None:
            print(fmt(result[part]), flush=True)
    for err in result["errors"]:
        print(f"{err['part']} FAILED: {err['error']}\n{err['traceback']}", flush=True)
    print("results:", path)
    return 1 if result["errors"] else 0


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------

# name → (add_args(parser), run(args) -> exit status). Add new subcommands here (see module docstring).
SUBCOMMANDS: dict[str, tuple[Callable, Callable]] = {
    "bench": (add_bench_args, run_bench_cli),
    "report": (add_report_args, run_report_cli),
    "check": (add_check_args, run_check_cli),
    "e2e": (add_e2e_args, run_e2e_cli),
    "attention": (add_attention_args, run_attention_cli),
    "ttft": (add_ttft_args, run_ttft_cli),
    "engine": (add_engine_args, run_engine_cli),
    "graph-apis": (add_graph_apis_args, run_graph_apis_cli),
    "record": (add_record_args, run_record_cli),
    "vllm": (add_vllm_args, run_vllm_cli),
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
