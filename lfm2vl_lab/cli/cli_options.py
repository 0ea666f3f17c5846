"""Every option of ``python -m lfm2vl_lab``: each subcommand's ``add_args(parser)``, and nothing heavy.

``--help``, the command's and each subcommand's, builds the parser and nothing else, so it must not
wait seconds for torch, transformers or matplotlib: this module imports none of them (nor any module
that does). The choices the options offer are therefore copies of the values the code defines,
each named beside its source, and tests/test_cli_lazy.py keeps every copy equal to its source. A
value is checked when it is parsed (:mod:`.args`), the run imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from ..measure.record import DEFAULT_PARTS, PARTS
from ..measure.results import FIGURES_ROOT, RESULTS_ROOT
from .args import (
    budgets_arg,
    choice_arg,
    device_arg,
    dtype_arg,
    int_arg,
    list_arg,
    on_off_list,
    positive_int,
    preset_arg,
    workloads_arg,
)

# Copies, each of the value named in its comment (tests/test_cli_lazy.py compares them).
MODES = ("hf-eager", "lab-eager", "lab-graph", "compile", "compile-max", "lab-graph-fused")  # .modes.MODES
DEFAULT_MODES = ("hf-eager", "lab-eager", "lab-graph", "compile")  # .modes.DEFAULT_MODES
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # .modes.COMPILE_MODES
DEFAULT_WORKLOADS = ("1x512", "1x256", "4x512", "tiled")  # .workloads.DEFAULT_WORKLOADS
CU_SEQLENS_RULES = ("safe", "repeat_last")  # core.config.CU_SEQLENS_RULES
MAX_SEQLEN_MODES = ("tight", "loose")  # core.config.MAX_SEQLEN_MODES
GRAPH_CONFIGS = ("kit", "pr")  # the names of core.config.GRAPH_CONFIGS
ATTENTION_BACKENDS = ("varlen", "sdpa_blockmask")  # kernels.attention.ATTENTION_BACKENDS
# core.config.GraphOptions(): the defaults of the settings bench sweeps
GRAPH_DEFAULTS = {"cu_seqlens_rule": "safe", "max_seqlen_mode": "tight", "attention": "auto", "fuse_qkv": True,
                  "fuse_elementwise": True, "dense_graphs": True}
CHECK_PRESETS = ("lfm2-vl-450m", "lfm2-vl-1.6b")  # .check.PRESETS: check and attention run both by default
E2E_IMAGES = ("1x512", "tiled")  # the names of .e2e.IMAGES
DECODE_TOKENS = 16  # .ttft.DECODE_TOKENS
THROUGHPUT_BATCH = 8  # .request.THROUGHPUT_BATCH
ENGINE_MODES = ("generate", "hf-static-compile", "compile-ro", "engine", "engine-fused")  # .engine_peers.MODES
VLLM_PRESETS = ("lfm2-vl-3b", "lfm2-vl-450m", "lfm2-vl-1.6b")  # .vllm_ab.PRESETS
VLLM_NAME = "vllm"  # .cli_vllm.NAME


def _on_off(v: bool) -> str:
    return "on" if v else "off"


def add_bench_args(p) -> None:
    """Options of ``python -m lfm2vl_lab bench``. Every value is checked here (argparse types), so
    a bad one is a one-line error with exit status 2 before anything is built."""
    add, d = p.add_argument, SimpleNamespace(**GRAPH_DEFAULTS)
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


def add_check_args(p) -> None:
    """Options of ``python -m lfm2vl_lab check``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help=f"preset(s) to check (repeatable; default: {' and '.join(CHECK_PRESETS)})")
    p.add_argument("--dtype", type=dtype_arg, default="bf16", help="bf16 | fp16 | fp32 (default: bf16)")
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def add_attention_args(p) -> None:
    """Options of ``python -m lfm2vl_lab attention``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help=f"preset(s) (default: {', '.join(CHECK_PRESETS)})")
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def add_graph_apis_args(p) -> None:
    """Options of ``python -m lfm2vl_lab graph-apis``."""
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def add_e2e_args(p) -> None:
    """Options of ``python -m lfm2vl_lab e2e``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help="preset(s) (repeatable; default: lfm2-vl-450m on CUDA, tiny on CPU)")
    p.add_argument("--image", type=list_arg(choice_arg("image", E2E_IMAGES)), default="1x512,tiled",
                   help="images, comma list of: " + ", ".join(E2E_IMAGES))
    p.add_argument("--requests", type=list_arg(positive_int), default="1,2,4",
                   help="requests per generate call, comma list")
    p.add_argument("--new-tokens", type=list_arg(positive_int), default="16,64",
                   help="new tokens for the total-latency columns, comma list")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed rounds per row, the two modes in turns (default: 5)")
    p.add_argument("--dtype", type=dtype_arg, default=None,
                   help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--out", default=None, help="results root (default: data/results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--profile", action="store_true",
                   help="also profile one TTFT call per mode (1x512, one request): encoder vs text model, "
                        "GPU-busy vs wall")


def add_ttft_args(p) -> None:
    """Options of ``python -m lfm2vl_lab ttft``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help="preset(s) (repeatable; default: lfm2-vl-450m on CUDA, tiny on CPU)")
    p.add_argument("--image", type=list_arg(choice_arg("image", E2E_IMAGES)), default="1x512,tiled",
                   help="images, comma list of: " + ", ".join(E2E_IMAGES))
    p.add_argument("--requests", type=list_arg(positive_int), default="1,2,4,8", help="requests per call, comma list")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed rounds per row, the modes in turns (default: 5)")
    p.add_argument("--decode-tokens", type=positive_int, default=DECODE_TOKENS,
                   help="tokens after the first in the decode calls (decode ms per token)")
    p.add_argument("--dtype", type=dtype_arg, default=None,
                   help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--out", default=None, help="results root (default: data/results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--profile", action="store_true", help="also profile one 1x512 request per mode (GPU-busy vs wall)")
    p.add_argument("--image-path", action="store_true",
                   help="also time encode() from the CPU processor output vs GPU-resident input, and the "
                        "processor on the CPU vs on the GPU")
    p.add_argument("--fuse", choices=("on", "off"), default="off",
                   help="the graphed text model's engine: fused (TextEngine(fuse=True): inductor-compiled layers "
                        "inside its graphs; the first capture compiles, tens of seconds per preset) or not")
    p.add_argument("--graph-config", choices=GRAPH_CONFIGS, default="kit",
                   help="the encoder graphs' named config: kit (the kit's defaults) or pr (the budgets and item "
                        "limit vLLM PR #44930 was benchmarked with); default: kit")
    p.add_argument("--request-tokens", type=int_arg(0), default=0,
                   help="also time whole requests of this many output tokens (e.g. 128; 0: off): measured with "
                        "the text model graphed, composed from the measured parts with it eager")
    p.add_argument("--throughput", type=int_arg(0), default=0, metavar="REQUESTS",
                   help="also run this many requests of the seeded workload's mixed images in batches of up to "
                        f"{THROUGHPUT_BATCH}, text model graphed, encoder eager vs graphed (0: off)")
    p.add_argument("--name", default="ttft", help="result file name prefix (default: ttft)")


def add_engine_args(p) -> None:
    """Options of ``python -m lfm2vl_lab engine``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help="preset(s) (repeatable; default: lfm2-vl-450m on CUDA, tiny on CPU)")
    p.add_argument("--modes", type=list_arg(choice_arg("mode", ENGINE_MODES)), default=",".join(ENGINE_MODES),
                   help=f"modes, comma list of: {', '.join(ENGINE_MODES)} (default: all)")
    p.add_argument("--repeats", type=positive_int, default=30, help="timed rounds, the modes in turns (default: 30)")
    p.add_argument("--decode-tokens", type=positive_int, default=16,
                   help="tokens after the first in the decode calls (decode ms per token; default: 16)")
    p.add_argument("--dtype", type=dtype_arg, default=None,
                   help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one prefill and one decode step per mode (kernels, kernel classes)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.add_argument("--out", default=None, help="results root (default: data/results)")
    p.add_argument("--name", default="engine", help="result file name prefix (default: engine)")


def add_vllm_args(p) -> None:
    """Options of ``python -m lfm2vl_lab vllm``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help=f"preset(s) (repeatable; default: {', '.join(VLLM_PRESETS)})")
    p.add_argument("--rounds", type=positive_int, default=20,
                   help="rounds of the A/B: every case once per engine, the engines in rotating turns (default: 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for this call: presets that no longer fit are left for --resume")
    p.add_argument("--resume", default=None, help="continue this vllm-*.json: run only the presets it lacks")
    p.add_argument("--out", default=str(RESULTS_ROOT), help="results root (default: data/results)")
    p.add_argument("--name", default=VLLM_NAME, help=f"result file name prefix (default: {VLLM_NAME})")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    # how the command runs each preset in a process of its own (not for users: no help line)
    p.add_argument("--one-preset", default=None, help=argparse.SUPPRESS)
    p.add_argument("--section-out", default=None, help=argparse.SUPPRESS)


def add_pipeline_args(p) -> None:
    """Options of ``python -m lfm2vl_lab pipeline``."""
    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help=f"preset(s) (repeatable; default: {', '.join(VLLM_PRESETS)}, as vllm)")
    p.add_argument("--repeats", type=positive_int, default=6,
                   help="rounds of every case, the arms in turns (default: 6)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0, as vllm)")
    p.add_argument("--out", default=str(RESULTS_ROOT), help="results root (default: data/results)")
    p.add_argument("--name", default="pipeline", help="result file name prefix (default: pipeline)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")


def add_roofline_args(p) -> None:
    """Options of ``python -m lfm2vl_lab roofline``."""
    p.add_argument("--preset", type=preset_arg, default="lfm2-vl-450m",
                   help="whose decode-step shapes the kernels take (default: lfm2-vl-450m)")
    p.add_argument("--trials", type=positive_int, default=7, help="timed trials of each graph (default: 7)")
    p.add_argument("--out", default=str(RESULTS_ROOT), help="results root (default: data/results)")
    p.add_argument("--name", default="roofline", help="result file name prefix (default: roofline)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")


def add_record_args(p) -> None:
    """Options of ``python -m lfm2vl_lab record``."""
    p.add_argument("--part", action="append", choices=PARTS, default=None,
                   help=f"only the steps of this part (repeatable; default: {', '.join(DEFAULT_PARTS)}; "
                        f"{', '.join(p for p in PARTS if p not in DEFAULT_PARTS)} only when named)")
    p.add_argument("--out", default=str(RESULTS_ROOT),
                   help="results root (default: data/results; there, record ends by redrawing the figures and the "
                        "docs' tables: `report` does that for another root once its files are in the repo)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for this call: steps whose limit no longer fits are left for the next call")
    p.add_argument("--again", action="store_true", help="run steps the manifest of this code already holds too")
    p.add_argument("--role", action="append", default=None, metavar="ROLE",
                   help="only this role, whether or not this tree recorded it (repeatable; `--dry-run` lists the "
                        "roles)")
    p.add_argument("--changed", action="store_true",
                   help="a partial re-record: only the roles missing or whose own files changed since they were "
                        "recorded (default: every role not recorded by exactly this tree)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the steps, their limits and whether each would run (and why), run nothing")
    p.add_argument("--take", metavar="DIR", default=None,
                   help="no GPU: bring a device call's --out DIR into data/results, moving the files its manifest "
                        "no longer names into archive/")


def add_report_args(p) -> None:
    """Options of ``python -m lfm2vl_lab report``. The defaults are the repo's own folders, wherever
    the command runs from (figures of CPU results land in ``data/figures/cpu-*``, which git ignores)."""
    p.add_argument("--root", default=str(RESULTS_ROOT),
                   help="results root whose <gpu>/reference.json sets to draw (default: data/results)")
    p.add_argument("--out", default=str(FIGURES_ROOT),
                   help="folder for the PNGs (default: data/figures)")
    add_table_args(p)  # --tables-only, --check: the generated tables of README.md and docs/*.md


def add_table_args(p) -> None:
    """``report``'s table options."""
    p.add_argument("--tables-only", action="store_true",
                   help="only rewrite the generated tables of README.md and docs/*.md, no figures")
    p.add_argument("--check", action="store_true",
                   help="write nothing: exit 1 if a generated table of README.md or docs/*.md is stale, or a "
                        "figure in --out names another source than the reference set's")
