"""``python -m lfm2vl_lab bench``: the options of :func:`bench.run_bench` on the command line,
the table, the result file (checkpointed after each configuration) and a latency figure."""

from __future__ import annotations

import sys
from pathlib import Path

from ..core.config import CU_SEQLENS_RULES, MAX_SEQLEN_MODES, GraphOptions
from ..kernels.attention import ATTENTION_BACKENDS
from .args import (
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
from .bench import run_bench
from .modes import DEFAULT_CU_RULE, DEFAULT_MAX_SEQLEN_MODE, DEFAULT_MODES, FUSED_COMPILE_MODES, MODES
from .results import RESULTS_ROOT, gpu_slug, save_result
from .table import print_table
from .workloads import DEFAULT_WORKLOADS


def add_bench_args(p) -> None:
    """Options of ``python -m lfm2vl_lab bench``. Every value is checked here (argparse types), so
    a bad one is a one-line error with exit status 2 before anything is built."""
    add = p.add_argument
    add("--preset", type=preset_arg, default=None, help="model preset (default: lfm2-vl-450m on CUDA, tiny on CPU)")
    add("--mode", action="append", type=list_arg(choice_arg("mode", MODES)), default=None,
        help=f"mode(s), repeatable or comma list: {', '.join(MODES)} (default: all but lab-graph-fused)")
    add("--workload", action="append", type=workloads_arg, default=None,
        help=f"workload(s), repeatable or comma list: NxS (4x512), A..BxS (1..16x512), tiled, stream "
             f"(default: {','.join(DEFAULT_WORKLOADS)})")
    add("--dtype", type=dtype_arg, default=None, help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    add("--repeats", type=positive_int, default=None, help="timed calls per row (default: 50 CUDA / 5 CPU)")
    add("--warmup", type=int_arg(0), default=None, help="untimed calls before timing (default: 10 CUDA / 3 CPU)")
    add("--device", type=device_arg, default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    add("--stream-n", type=positive_int, default=200, help="requests in the stream workload (default: 200)")
    add("--budgets", action="append", type=budgets_arg, default=None,
        help="graph budget set, repeatable to sweep: 'auto' or a comma list of token counts")
    add("--cu-rule", type=list_arg(choice_arg("cu rule", CU_SEQLENS_RULES)), default=DEFAULT_CU_RULE,
        help=f"cu_seqlens padding rule(s), comma list: {', '.join(CU_SEQLENS_RULES)}")
    add("--max-seqlen-mode", type=list_arg(choice_arg("max-seqlen mode", MAX_SEQLEN_MODES)),
        default=DEFAULT_MAX_SEQLEN_MODE, help=f"max_seqlen mode(s), comma list: {', '.join(MAX_SEQLEN_MODES)}")
    add("--fused-compile-mode", type=choice_arg("compile mode", FUSED_COMPILE_MODES), default="default",
        help="torch.compile mode of the lab-graph-fused body (default: default; the max-autotune ones compile "
             "for minutes)")
    add("--attention", type=list_arg(choice_arg("attention backend", ("auto", *ATTENTION_BACKENDS))), default="auto",
        help=f"attention backend(s) of the lab modes, comma list: auto, {', '.join(ATTENTION_BACKENDS)}")
    def on_off(v: bool) -> str:
        return "on" if v else "off"

    add("--fuse-qkv", type=on_off_list, default=None,
        help=f"fused q/k/v GEMM in the lab modes, comma list: off, on (default: {on_off(GraphOptions.fuse_qkv)})")
    add("--fuse-elementwise", type=on_off_list, default=None,
        help="lab modes: residual add + LayerNorm in one Triton kernel and bias + GELU in the GEMM epilogue, "
             f"comma list: off, on (default: {on_off(GraphOptions.fuse_elementwise)})")
    add("--dense-graphs", type=on_off_list, default=None,
        help="lab-graph: dense-attention graph variants for runs of full-length items, comma list: off, on "
             f"(default: {on_off(GraphOptions.dense_graphs)})")
    add("--profile", action="store_true", help="add torch.profiler metrics (GPU-busy, kernels, launches, timeline)")
    add("--trace-dir", default=None, help="with --profile: keep the Chrome traces here")
    add("--seed", type=int, default=0, help="seed of the random weights and the synthetic images (default: 0)")
    add("--out", default=str(RESULTS_ROOT), help="results root (default: data/results)")
    add("--name", default="bench", help="result file name prefix (default: bench)")
    add("--no-progress", action="store_true", help="no progress bars")
    add("--figure", default="auto",
        help="PNG of this run's latencies (default: data/figures/last-bench-<device>.png; 'none' to skip)")


def _save_figure(result: dict, figure: str) -> Path:
    from .plots import latency_figure

    p = result["provenance"]
    auto = RESULTS_ROOT.parent / "figures" / f"last-bench-{gpu_slug(p['gpu'])}.png"
    path = auto if figure == "auto" else Path(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"Encoder latency per mode: {p['preset']}, {p['dtype']}, {p['gpu']} (whisker: p90)"
    latency_figure(result["rows"], title).savefig(path, dpi=110)
    return path


def run_bench_cli(args) -> int:
    """Benchmark encoder modes on workloads; print a table and write a result JSON."""
    from_main = sys.argv and sys.argv[0].endswith("__main__.py")
    command = "python -m lfm2vl_lab " + " ".join(sys.argv[1:]) if from_main else None
    saved: dict = {}

    def checkpoint(partial: dict) -> None:  # a run killed by a time limit still leaves its finished modes
        saved["path"] = save_result(partial, args.out, args.name, saved.get("path"))

    result = run_bench(
        preset=args.preset, modes=flatten(args.mode) or DEFAULT_MODES,
        workloads=flatten(args.workload) or DEFAULT_WORKLOADS,
        dtype=args.dtype, repeats=args.repeats, warmup=args.warmup, device=args.device, stream_n=args.stream_n,
        budget_sets=args.budgets or [None],  # each --budgets is one set (None: auto); repeating it sweeps
        cu_rules=args.cu_rule, max_seqlen_modes=args.max_seqlen_mode, profile=args.profile,
        progress=not args.no_progress, seed=args.seed, fused_compile_mode=args.fused_compile_mode,
        trace_dir=args.trace_dir, command=command, name=args.name, attentions=args.attention,
        fuse_qkvs=args.fuse_qkv or (GraphOptions.fuse_qkv,),
        fuse_elementwises=args.fuse_elementwise or (GraphOptions.fuse_elementwise,),
        dense_graphs=args.dense_graphs or (GraphOptions.dense_graphs,), on_job=checkpoint)
    print_table(result)
    print(f"results: {save_result(result, args.out, args.name, saved.get('path'))}")
    if args.figure != "none" and result["rows"]:
        print(f"figure: {_save_figure(result, args.figure)}")
    return 1 if result["errors"] else 0
