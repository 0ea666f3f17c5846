"""Benchmark harness: the same inputs through every encoder path, timed the same way.

In the style of nanoGPT's ``bench.py`` and gpt-fast: build once, burn in, then measure, and report
derived numbers next to the raw ones.

Modes (``MODES``):

* ``hf-eager``        transformers' ``get_image_features`` (via :func:`encoder.hf_image_features`)
* ``lab-eager``       :meth:`PackedVisionEncoder.encode` — packed varlen, no graphs
* ``lab-graph``       :class:`GraphedEncoder` after ``capture()`` — one CUDA graph per budget
* ``compile``         ``torch.compile(mode="reduce-overhead")`` of a function calling transformers'
                      ``get_image_features`` (inductor + CUDA graph trees; records first-call compile
                      seconds and dynamo counters, which show recompiles per new shape)
* ``lab-graph-fused`` ``GraphedEncoder`` whose captured ``body`` is the packed forward compiled by
                      inductor (``mode="max-autotune-no-cudagraphs", dynamic=False``, ``fullgraph=True``
                      when it compiles, else with graph breaks); the compile cost is part of capture

The three graph modes need CUDA; on a CPU they are listed under ``skipped`` with the reason.
``DEFAULT_MODES`` leaves ``lab-graph-fused`` out: its max-autotune compile takes minutes.

Workloads: ``NxS`` (N synthetic S×S images, e.g. ``1x512``, ``4x512``), ``A..BxS`` (doubling
N from A to B: ``1..16x512`` → 1, 2, 4, 8, 16 images; ``1..16`` alone means ``1..16x512``),
``tiled`` (one 1024×768 image → tiles, plus a thumbnail on presets that use one), ``stream``
(``stream_n`` requests from :func:`inputs.synthetic_workload`, each timed once: p50/p99 over
requests, graph hit rate, one-off costs).

Timing: inputs are processed on the CPU and moved to the device *before* timing (every mode
alike; ``spatial_shapes`` stays on the CPU). Every call starts from an idle device. On CUDA a
call is timed with CUDA events, on the CPU with ``perf_counter``. The first three calls on a new
workload are timed on their own (``first_calls_ms``: compile, capture-time caches, re-records) and
count towards the warm-up. Derived: ``speedup_vs_hf`` (hf-eager median / median) and, with
profiling, ``pct_of_floor`` = 100 · median / GPU-busy time (100 % = the kernels never wait).

Results are JSON: ``{"provenance": {...}, "rows": [...], "skipped": [...], "errors": [...]}``
saved under ``data/results/<gpu-slug>/<name>-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.packing import tokens_for
from .meter import measured_capture
from .results import RESULTS_ROOT, gpu_slug, load_results, provenance, save_result  # noqa: F401(re-exported)

MODES = ("hf-eager", "lab-eager", "lab-graph", "compile", "lab-graph-fused")
# lab-graph-fused is opt-in: max-autotune compiles for minutes per budget (about 250 s for two
# budgets of the 450M preset on an H200, measured), which a default run should not pay.
DEFAULT_MODES = ("hf-eager", "lab-eager", "lab-graph", "compile")
CUDA_ONLY = {
    "lab-graph": "CUDA graphs need a CUDA device",
    "compile": "mode='reduce-overhead' is CUDA graphs (cudagraph trees); it needs a CUDA device",
    "lab-graph-fused": "CUDA graphs of an inductor-compiled body need a CUDA device",
}
GRAPH_MODES = ("lab-graph", "lab-graph-fused")  # the budget / cu-rule / max-seqlen sweeps apply to these
DEFAULT_WORKLOADS = ("1x512", "1x256", "4x512", "tiled")
TILED_SIZE = (1024, 768)  # width, height
FIRST_CALLS = 3
# torch.compile's modes, for the lab-graph-fused body
FUSED_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


# --------------------------------------------------------------------------------------------
# Provenance and result files
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------

_NXS = re.compile(r"(\d+)x(\d+)")
_RANGE = re.compile(r"(\d+)\.\.(\d+)(?:x(\d+))?")


def expand_workloads(specs) -> list[str]:
    """Workload specs (strings or comma lists) → workload names, ranges expanded, order kept."""
    if isinstance(specs, str):
        specs = [specs]
    out: list[str] = []
    for spec in specs:
        for part in (p.strip() for p in str(spec).split(",")):
            if not part:
                continue
            if m := _RANGE.fullmatch(part):
                a, b, side = int(m[1]), int(m[2]), int(m[3] or 512)
                if a < 1 or b < a:
                    raise ValueError(f"workload range {part!r}: need 1 <= A <= B")
                n = a
                while n < b:
                    out.append(f"{n}x{side}")
                    n *= 2
                out.append(f"{b}x{side}")
            elif m := _NXS.fullmatch(part):
                if int(m[1]) < 1 or int(m[2]) < 1:
                    raise ValueError(f"workload {part!r}: need at least one image of positive size")
                out.append(part)
            elif part in ("tiled", "stream"):
                out.append(part)
            else:
                raise ValueError(f"unknown workload {part!r}: use NxS (e.g. 4x512), A..BxS, tiled or stream")
    return list(dict.fromkeys(out))


def workload_images(name: str, seed: int = 0) -> list:
    """The PIL images of a fixed workload (``NxS`` or ``tiled``)."""
    from .workloads import synthetic_image

    if name == "tiled":
        return [synthetic_image(*TILED_SIZE, seed=seed)]
    m = _NXS.fullmatch(name)
    if not m:
        raise ValueError(f"{name!r} is not a fixed workload (NxS or tiled)")
    n, side = int(m[1]), int(m[2])
    if n < 1 or side < 1:
        raise ValueError(f"workload {name!r}: need at least one image of positive size")
    return [synthetic_image(side, side, seed=seed + i) for i in range(n)]


def to_device(inputs: dict, device, dtype) -> dict:
    """Processor output on the device: pixel values in the model dtype, the mask alongside, and
    ``spatial_shapes`` kept on the CPU (the encoders read it on the host)."""
    return {
        "pixel_values": inputs["pixel_values"].to(device, dtype),
        "pixel_attention_mask": inputs["pixel_attention_mask"].to(device),
        "spatial_shapes": inputs["spatial_shapes"].cpu(),
    }


def input_stats(inputs: dict, factor: int = 2) -> dict:
    shapes = [(int(h), int(w)) for h, w in inputs["spatial_shapes"].tolist()]
    return {"n_items": len(shapes), "tokens": sum(tokens_for(s, factor) for s in shapes),
            "patch_rows": sum(h * w for h, w in shapes)}


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """One call from an idle device, in ms: CUDA events on CUDA (host launch time included, since
    the start event fires at once on an idle stream), ``perf_counter`` on the CPU."""
    _sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int, device) -> list[float]:
    """``warmup`` untimed calls, then ``repeats`` timed calls (ms each)."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    return [time_call(fn, device)[0] for _ in range(repeats)]


def time_paired(calls: dict, repeats: int, warmup: int, device) -> dict[str, list[float]]:
    """Time several alternatives in turns: ``calls`` maps a name to ``fn`` or ``(fn, context)``.

    Round ``i`` times each alternative once, in the given order on even rounds and reversed on odd
    ones. A drift in the machine (clocks, a busy host) then lands on every alternative alike,
    instead of on whichever ran second, and sample ``i`` of one is paired with sample ``i`` of
    another. ``context`` (a context-manager factory, e.g. ``GraphedEncoder.installed``) is entered
    around each call but outside its timing. Returns ms per call, per name, in round order.
    """
    device = torch.device(device)
    norm = {k: (v if isinstance(v, tuple) else (v, None)) for k, v in calls.items()}

    def timed(fn, ctx):
        with (ctx or contextlib.nullcontext)():
            return time_call(fn, device)[0]

    for fn, ctx in norm.values():
        for _ in range(warmup):
            timed(fn, ctx)
    out: dict[str, list[float]] = {k: [] for k in norm}
    names = list(norm)
    for i in range(repeats):
        for k in names if i % 2 == 0 else names[::-1]:
            out[k].append(timed(*norm[k]))
    return out


def percentile(values, q: float) -> float:
    from .profiling import percentile as _p

    return _p(values, q)


def summarize(times_ms: list[float]) -> dict:
    """median / p90 / p99 / mean / min / max / std of a list of timings (ms)."""
    n = len(times_ms)
    if n == 0:
        return {k: None for k in ("median_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "std_ms")}
    mean = sum(times_ms) / n
    return {
        "median_ms": percentile(times_ms, 50), "p90_ms": percentile(times_ms, 90), "p99_ms": percentile(times_ms, 99),
        "mean_ms": mean, "min_ms": min(times_ms), "max_ms": max(times_ms),
        "std_ms": math.sqrt(sum((t - mean) ** 2 for t in times_ms) / n),
    }


# --------------------------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------------------------


@dataclass
class Runner:
    """One mode, set up once and reused across workloads."""

    mode: str
    call: Callable[[dict], list]
    info: dict = field(default_factory=dict)  # config and one-off costs, copied into every row
    graphed: Any = None  # the GraphedEncoder of graph modes, for its stats

    def graph_stats(self) -> dict:
        if self.graphed is None:
            return {}
        s = self.graphed.stats
        return {"hit_rate": s.hit_rate, "hits": s.hits, "misses": s.misses, "overflow": s.overflow,
                "padding_waste": s.padding_waste, "replays": {str(k): v for k, v in sorted(s.replays.items())}}

    def reset_stats(self) -> None:
        if self.graphed is not None:
            self.graphed.reset_stats()


# The dynamo / inductor counters worth keeping per row: graphs compiled, frames, graph breaks,
# CUDA-graph (re-)recordings and skips. Others are per-kernel details, and the keys of
# "graph_break" / "unimplemented" are whole messages, so those two are kept as totals only.
_COUNTER_CATS = ("stats", "frames", "recompiles")
_COUNTER_TOTALS = ("graph_break", "unimplemented")


def dynamo_counters() -> dict[str, int]:
    """A flat snapshot of the informative parts of ``torch._dynamo.utils.counters``."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    flat = {}
    for cat, counter in list(counters.items()):
        if cat in _COUNTER_TOTALS:
            flat[f"{cat}.total"] = sum(v for v in counter.values() if isinstance(v, (int, float)))
        elif cat in _COUNTER_CATS or cat == "inductor":
            for key, val in counter.items():
                if isinstance(val, (int, float)) and (cat != "inductor" or "cudagraph" in key):
                    flat[f"{cat}.{key}"] = val
    return flat


def counter_diff(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] != before.get(k, 0)}


def budgets_label(budgets) -> str:
    return "auto" if budgets is None else ",".join(str(b) for b in budgets)


def _graph_info(genc, rows: list[dict], t_capture: float) -> dict:
    from .meter import graph_memory

    cfg = genc.config
    return {
        "budgets": list(cfg.budgets), "max_items": cfg.max_items, "cu_rule": cfg.cu_seqlens_rule,
        "max_seqlen_mode": cfg.max_seqlen_mode, "attention": genc.encoder.attention_backend,
        "capture_s": t_capture, "capture_info": rows,
        **{f"graph_{k}": v for k, v in graph_memory(rows).items() if k != "per_budget"},
    }


def make_runner(mode: str, model, *, budgets=None, cu_rule: str = "safe", max_seqlen_mode: str = "tight",
                fused_compile_mode: str = "default", progress: bool = False, attention: str = "auto",
                fuse_qkv: bool = False, single_item_graphs: bool | None = None) -> Runner:
    """Build (and for graph modes capture) one mode on ``model``. Raises for unknown modes."""
    from ..core.encoder import PackedVisionEncoder
    from ..core.hf import hf_image_features
    from ..core.graphs import SINGLE_ITEM_GRAPHS, GraphedEncoder

    if mode == "hf-eager":
        return Runner(mode, lambda inp: hf_image_features(model, inp))
    if mode == "lab-eager":
        enc = PackedVisionEncoder(model, attention=attention, fuse_qkv=fuse_qkv)
        return Runner(mode, enc.encode, {"attention": enc.attention_backend, "fuse_qkv": fuse_qkv})
    if mode == "lab-graph":
        single_item_graphs = SINGLE_ITEM_GRAPHS if single_item_graphs is None else single_item_graphs
        genc = GraphedEncoder(model, budgets=budgets, cu_seqlens_rule=cu_rule, max_seqlen_mode=max_seqlen_mode,
                              attention=attention, fuse_qkv=fuse_qkv, single_item_graphs=single_item_graphs)
        t0 = time.perf_counter()
        rows = measured_capture(genc, progress=progress)
        return Runner(mode, genc.encode, {"budget_set": budgets_label(budgets), "attention": genc.encoder.attention_backend,
                                          "fuse_qkv": fuse_qkv, "single_item_graphs": single_item_graphs,
                                          **_graph_info(genc, rows, time.perf_counter() - t0)}, genc)
    if mode == "lab-graph-fused":
        return _make_fused(model, budgets, cu_rule, max_seqlen_mode, fused_compile_mode, progress, attention, fuse_qkv)
    if mode == "compile":
        return _make_compile(model)
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def _make_fused(model, budgets, cu_rule, max_seqlen_mode, compile_mode, progress, attention="auto",
                fuse_qkv=False) -> Runner:
    """GraphedEncoder with an inductor-compiled body. ``fullgraph=True`` first: one fused program
    per budget; if dynamo cannot trace it whole, fall back to a body with graph breaks and say so."""
    from ..core.encoder import PackedVisionEncoder
    from ..core.graphs import GraphedEncoder

    error = None
    for fullgraph in (True, False):
        torch._dynamo.reset()
        body = torch.compile(PackedVisionEncoder(model, attention=attention, fuse_qkv=fuse_qkv), mode=compile_mode,
                             dynamic=False, fullgraph=fullgraph)
        genc = GraphedEncoder(model, budgets=budgets, cu_seqlens_rule=cu_rule, max_seqlen_mode=max_seqlen_mode, body=body,
                              attention=attention)
        t0 = time.perf_counter()
        try:
            rows = measured_capture(genc, progress=progress)
        except Exception as exc:  # noqa: BLE001 - any trace failure means: try with graph breaks
            if not fullgraph:
                raise
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            del genc, body
            gc.collect()
            torch.cuda.empty_cache()
            continue
        info = {"budget_set": budgets_label(budgets), **_graph_info(genc, rows, time.perf_counter() - t0),
                "compile_mode": compile_mode, "fullgraph": fullgraph, "fullgraph_error": error,
                "attention": genc.encoder.attention_backend, "fuse_qkv": fuse_qkv}
        # capture() timed compile + warm-up + capture together: that sum is the one-off cost here
        info["compile_s"] = info["capture_s"]
        return Runner("lab-graph-fused", genc.encode, info, genc)
    raise AssertionError("unreachable")


def _make_compile(model) -> Runner:
    """torch.compile(mode="reduce-overhead") around transformers' own image path."""
    from ..core.encoder import lfm2vl_parts

    torch._dynamo.reset()  # counters and caches of earlier modes must not leak into this one
    vt = lfm2vl_parts(model)[0]
    w = vt.embeddings.patch_embedding.weight

    def hf_features(pixel_values, spatial_shapes, pixel_attention_mask):
        return model.get_image_features(pixel_values=pixel_values, spatial_shapes=spatial_shapes,
                                        pixel_attention_mask=pixel_attention_mask)

    compiled = torch.compile(hf_features, mode="reduce-overhead")
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    @torch.no_grad()
    def call(inp):
        if mark_step is not None:  # tell cudagraph trees a new inference step begins
            mark_step()
        out = compiled(inp["pixel_values"].to(w.device, w.dtype), inp["spatial_shapes"].to(w.device),
                       inp["pixel_attention_mask"].to(w.device))
        feats = out.pooler_output if hasattr(out, "pooler_output") else out
        # Clone: cudagraph trees overwrite their outputs on the next replay.
        return [f.clone() for f in feats]

    return Runner("compile", call, {"compile_mode": "reduce-overhead"})


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


def _max_err(outs, refs) -> float | None:
    from ..core.parity import max_rel_error

    try:
        return max_rel_error(list(outs), list(refs))
    except ValueError:
        return None


def measure_fixed(runner: Runner, inputs: dict, device, repeats: int, warmup: int, ref=None,
                  profile: bool = False, profile_iters: int = 5, trace_path=None) -> dict:
    """Time one mode on one prepared input: first calls, warm-up, ``repeats`` timed calls."""
    device = torch.device(device)
    fn = lambda: runner.call(inputs)  # noqa: E731
    before = dynamo_counters() if runner.mode == "compile" else None
    first, err = [], None
    for i in range(FIRST_CALLS):
        ms, out = time_call(fn, device)
        first.append(ms)
        if i == 0 and ref is not None:
            err = _max_err(out, ref)
        del out
    runner.reset_stats()
    times = time_calls(fn, repeats, max(0, warmup - FIRST_CALLS), device)
    row = {**summarize(times), "repeats": repeats, "warmup": max(warmup, FIRST_CALLS), "first_calls_ms": first,
           "first_call_ms": first[0], "max_rel_err_vs_hf": err, **runner.graph_stats()}
    if before is not None:
        row["dynamo"] = counter_diff(before, dynamo_counters())
        row["compile_first_call_s"] = first[0] / 1e3
    if profile:
        from .profiling import profile_callable

        rep = profile_callable(fn, warmup=1, iters=profile_iters, trace_path=trace_path, device=device)
        d = rep.as_dict(gaps=False)
        row.update({"gpu_busy_ms": d["gpu_busy_ms"] if rep.has_gpu else None, "kernels": d["kernels"],
                    "launch_calls": d["launch_calls"], "launch_cpu_ms": d["launch_cpu_ms"],
                    "graph_launches": d["graph_launches"], "kernel_sum_ms": d["kernel_sum_ms"],
                    "profile_wall_ms": d["wall_ms"], "gap_count": d["gap_count"], "gap_median_us": d["gap_median_us"],
                    "gap_p90_us": d["gap_p90_us"], "gap_total_us": d["gap_total_us"], "timeline": d["timeline"],
                    "timeline_cpu_lane": d["cpu_lane"], "trace_path": d["trace_path"]})
    return row


def measure_stream(runner: Runner, requests: list[dict], device, warmup: int, progress: bool = False) -> dict:
    """Each request once, in order, from an idle device: p50/p99 over requests, hit rate, one-offs.

    ``requests`` hold CPU tensors; each is moved to the device before its (timed) call.
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    dtype = runner.info.get("dtype")
    for req in requests[: max(0, warmup)]:
        runner.call(to_device(req, device, dtype))
    runner.reset_stats()
    before = dynamo_counters() if runner.mode == "compile" else None
    times = []
    for req in tqdm(requests, desc=f"stream {runner.mode}", leave=False, disable=not progress, unit="req"):
        inp = to_device(req, device, dtype)
        ms, out = time_call(lambda inp=inp: runner.call(inp), device)
        times.append(ms)
        del out, inp
    stats = summarize(times)
    # Outliers: calls over 5x the median. With compile they are mostly recompiles / re-records of
    # new shapes (one-off costs); with eager modes they are simply the largest requests.
    outliers = [t for t in times if t > 5 * stats["median_ms"]]
    total_s = sum(times) / 1e3
    signatures = {tuple(map(tuple, r["spatial_shapes"].tolist())) for r in requests}
    row = {**stats, "repeats": len(times), "warmup": min(warmup, len(requests)), "first_call_ms": times[0],
           "total_s": total_s, "requests_per_s": len(times) / total_s if total_s else None,
           "distinct_shapes": len(signatures), "outlier_calls": len(outliers), "outlier_s": sum(outliers) / 1e3,
           **runner.graph_stats()}
    if before is not None:
        row["dynamo"] = counter_diff(before, dynamo_counters())
    return row


def stream_requests(n: int, preset, seed: int = 0, progress: bool = False) -> tuple[list[dict], dict]:
    """Processor output (CPU) of ``n`` seeded requests, and totals over them."""
    from tqdm.auto import tqdm

    from ..core.inputs import process_images

    from .workloads import synthetic_workload

    reqs = []
    for r in tqdm(synthetic_workload(n, seed), desc="processing stream images", leave=False, disable=not progress):
        out = process_images([r.image()], preset)
        reqs.append({k: out[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")})
    totals = [input_stats(r) for r in reqs]
    return reqs, {"n_images": n, "n_items": sum(t["n_items"] for t in totals), "tokens": sum(t["tokens"] for t in totals),
                  "patch_rows": sum(t["patch_rows"] for t in totals)}


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def check_choice(kind: str, value, allowed) -> None:
    """Raise ``ValueError("unknown <kind> <value>; choose from ...")`` unless ``value`` is allowed."""
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}; choose from {', '.join(map(str, allowed))}")


def parse_dtype(dtype) -> torch.dtype:
    """``"bf16"``, ``"float32"``, … (case-insensitive) or a ``torch.dtype`` → the ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    check_choice("dtype", str(dtype).lower(), DTYPES)
    return DTYPES[str(dtype).lower()]


def parse_device(spec) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a ``torch.device``) → ``torch.device``. A CUDA device
    on a machine without CUDA, or an index past the last GPU, is a ``ValueError`` naming it."""
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {str(spec)!r}; choose from cpu, cuda, cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(spec)!r} requested but CUDA is not available on this machine; use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(spec)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def parse_budgets(spec) -> list[int] | None:
    """``"auto"``/None → None (automatic budgets); ``"64,256,1024"`` or a list → sorted positive ints."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return None
    parts = [s for s in spec.replace(" ", "").split(",") if s] if isinstance(spec, str) else list(spec)
    try:
        budgets = sorted(int(b) for b in parts)
    except (TypeError, ValueError):
        budgets = []
    if not budgets or budgets[0] < 1:
        raise ValueError(f"budget set {spec!r}: use 'auto' or a comma list of positive token counts like 64,256,1024")
    return budgets


def run_bench(preset: str | None = None, modes=DEFAULT_MODES, workloads=DEFAULT_WORKLOADS, dtype=None, repeats: int | None = None,
              warmup: int | None = None, device=None, stream_n: int = 200, budget_sets=(None,), cu_rules=("safe",),
              max_seqlen_modes=("tight",), profile: bool = False, progress: bool = True, seed: int = 0,
              fused_compile_mode: str = "default", trace_dir=None, command: str | None = None,
              name: str = "bench", attentions=("auto",), fuse_qkvs=(False,), single_item_graphs=(None,),
              on_job=None) -> dict:
    """Run every (mode, config) on every workload; return the result dict (see module docstring).

    Defaults follow the device: CUDA → preset ``lfm2-vl-450m``, bf16, 50 repeats, 10 warm-up
    calls; CPU → preset ``tiny``, fp32, 5 repeats, 3 warm-up calls. ``budget_sets`` /
    ``cu_rules`` / ``max_seqlen_modes`` are swept for the graph modes only (each combination is
    its own row); the other modes run once per workload. ``attentions`` / ``fuse_qkvs`` are swept
    for the lab modes (packed encoder: attention backend, fused q/k/v GEMM); ``single_item_graphs``
    for ``lab-graph`` (dense-attention graphs for one item, see ``GraphedEncoder``). ``on_job(result)`` is
    called after each mode/config finishes (``result["complete"]`` is False until the end): the CLI
    saves a checkpoint with it. Bad arguments (``repeats`` < 1, ``warmup`` < 0, an unknown mode,
    workload, dtype, device, budget set, cu rule, max-seqlen mode or attention backend) raise a
    ``ValueError`` naming the value, before a model is built.
    """
    from tqdm.auto import tqdm

    from ..core.config import CU_SEQLENS_RULES, MAX_SEQLEN_MODES
    from ..core.encoder import ATTENTION_BACKENDS
    from ..core.inputs import process_images
    from ..core.presets import as_preset, build_model

    # Every bad argument is a ValueError here, before a model is built or anything is timed.
    dev = parse_device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = dev.type == "cuda"
    preset = as_preset(preset or ("lfm2-vl-450m" if on_cuda else "tiny"))
    dt = parse_dtype(dtype) if dtype is not None else (torch.bfloat16 if on_cuda else torch.float32)
    repeats = repeats if repeats is not None else (50 if on_cuda else 5)
    warmup = warmup if warmup is not None else (10 if on_cuda else 3)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    modes = list(dict.fromkeys(modes))
    for kind, values, allowed in (("mode", modes, MODES), ("cu rule", cu_rules, CU_SEQLENS_RULES),
                                  ("max-seqlen mode", max_seqlen_modes, MAX_SEQLEN_MODES),
                                  ("attention backend", attentions, ("auto", *ATTENTION_BACKENDS))):
        for v in values:
            check_choice(kind, v, allowed)
    workloads = expand_workloads(workloads)
    if "stream" in workloads and stream_n < 1:
        raise ValueError(f"the stream workload needs stream_n >= 1, got {stream_n}")
    budget_sets = [parse_budgets(b) for b in budget_sets] or [None]

    result = {
        "name": name,
        "provenance": provenance(command, device=dev, dtype=str(dt).replace("torch.", ""), preset=preset.name,
                                 repeats=repeats, warmup=warmup, stream_n=stream_n, seed=seed,
                                 profile=profile),
        "rows": [], "skipped": [], "errors": [], "complete": False,
    }
    model = build_model(preset, dtype=dt, device=dev, seed=seed)

    # Inputs: processed once, on the CPU, outside any timing.
    fixed = {}
    for w in workloads:
        if w == "stream":
            continue
        images = workload_images(w, seed)
        cpu_in = process_images(images, preset)
        fixed[w] = (to_device(cpu_in, dev, dt), {"n_images": len(images), **input_stats(cpu_in)})
    stream = stream_requests(stream_n, preset, seed, progress) if "stream" in workloads else None
    refs: dict[str, list] = {}

    jobs = []  # (mode, budgets, cu_rule, max_seqlen_mode, attention, fuse_qkv, single_item_graphs)
    lab_opts = [(a, f) for a in attentions for f in fuse_qkvs]
    for m in modes:
        if m in CUDA_ONLY and not on_cuda:
            result["skipped"].append({"mode": m, "reason": f"{CUDA_ONLY[m]} (device is {dev.type})"})
            continue
        opts = lab_opts if m.startswith("lab-") else [(None, None)]
        singles = single_item_graphs if m == "lab-graph" else [None]
        if m in GRAPH_MODES:
            jobs += [(m, b, c, s, a, f, si) for b in budget_sets for c in cu_rules for s in max_seqlen_modes
                     for a, f in opts for si in singles]
        else:
            jobs += [(m, None, None, None, a, f, None) for a, f in opts]

    bar = tqdm(total=len(jobs) * len(workloads), desc="bench", disable=not progress, unit="run")
    for mode, budgets, cu_rule, seq_mode, attention, fuse_qkv, single in jobs:
        bar.set_description(f"bench {mode}")
        try:
            runner = make_runner(mode, model, budgets=budgets, cu_rule=cu_rule or "safe",
                                 max_seqlen_mode=seq_mode or "tight", fused_compile_mode=fused_compile_mode,
                                 progress=False, attention=attention or "auto", fuse_qkv=bool(fuse_qkv),
                                 single_item_graphs=single)
        except Exception as exc:  # noqa: BLE001 - one broken mode must not lose the other rows
            result["errors"].append({"mode": mode, "budget_set": budgets_label(budgets), "cu_rule": cu_rule,
                                     "max_seqlen_mode": seq_mode, "stage": "setup", "error": f"{type(exc).__name__}: {exc}"[:500]})
            bar.update(len(workloads))
            continue
        runner.info["dtype"] = dt
        for w in workloads:
            base = {"preset": preset.name, "mode": mode, "workload": w, "device": dev.type,
                    "dtype": str(dt).replace("torch.", ""), "gpu_busy_ms": None, "kernels": None}
            try:
                if w == "stream":
                    reqs, totals = stream
                    row = {**base, **totals, **measure_stream(runner, reqs, dev, warmup, progress)}
                else:
                    inputs, totals = fixed[w]
                    if w not in refs:
                        from ..core.hf import hf_image_features

                        refs[w] = [t.detach().float().cpu() for t in hf_image_features(model, inputs)]
                    trace = Path(trace_dir) / f"{mode}-{w}.pt.trace.json" if trace_dir else None
                    row = {**base, **totals, **measure_fixed(runner, inputs, dev, repeats, warmup, refs[w], profile,
                                                             5 if on_cuda else 2, trace)}
                info = {k: v for k, v in runner.info.items() if k != "dtype"}
                row.update(info)
                if w == "stream" and row.get("total_s"):
                    row["tokens_per_s"] = row["tokens"] / row["total_s"]
                elif row.get("median_ms"):
                    row["tokens_per_s"] = row["tokens"] / (row["median_ms"] / 1e3)
                result["rows"].append(row)
            except Exception as exc:  # noqa: BLE001
                result["errors"].append({"mode": mode, "workload": w, "budget_set": budgets_label(budgets),
                                         "stage": "measure", "error": f"{type(exc).__name__}: {exc}"[:500]})
            bar.update(1)
        del runner
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()
        if on_job is not None:
            add_derived(result["rows"])
            on_job(result)
    bar.close()
    result["complete"] = True
    add_derived(result["rows"])
    return result


def add_derived(rows: list[dict]) -> list[dict]:
    """``speedup_vs_hf`` (hf-eager median of the same preset/workload/device/dtype ÷ this median)
    and ``pct_of_floor`` (100 · median ÷ GPU-busy, where profiled). Modifies and returns ``rows``."""
    key = lambda r: (r.get("preset"), r.get("workload"), r.get("device"), r.get("dtype"))  # noqa: E731
    hf = {key(r): r["median_ms"] for r in rows if r.get("mode") == "hf-eager" and r.get("median_ms")}
    for r in rows:
        base, med, busy = hf.get(key(r)), r.get("median_ms"), r.get("gpu_busy_ms")
        r["speedup_vs_hf"] = base / med if base and med else None
        r["pct_of_floor"] = 100.0 * med / busy if med and busy else None
    return rows


# --------------------------------------------------------------------------------------------
# Terminal table
# --------------------------------------------------------------------------------------------


def _fmt(v, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def format_table(result_or_rows) -> str:
    """Rows as an aligned text table: latency, speedup vs hf-eager, GPU-busy and % of floor."""
    res = result_or_rows if isinstance(result_or_rows, dict) else {"rows": result_or_rows}
    rows = res.get("rows", [])
    sweep = any(r.get("mode") in GRAPH_MODES for r in rows)
    head = ["mode", "workload", "items"] + (["graphs"] if sweep else []) + \
           ["median ms", "p90 ms", "p99 ms", "speedup", "busy ms", "% floor", "kernels", "hit %"]
    lines = []
    for r in rows:
        cfg = f"{r.get('budget_set', '')}/{r.get('cu_rule', '')}/{r.get('max_seqlen_mode', '')}" if r.get("mode") in GRAPH_MODES else ""
        cfg += "/single-item" if r.get("single_item_graphs") else ""
        hit = r.get("hit_rate")
        lines.append([r.get("mode", "?"), r.get("workload", "?"), _fmt(r.get("n_items"), "d")] + ([cfg] if sweep else []) + [
            _fmt(r.get("median_ms"), ".3f"), _fmt(r.get("p90_ms"), ".3f"), _fmt(r.get("p99_ms"), ".3f"),
            _fmt(r.get("speedup_vs_hf"), ".2f", "x"), _fmt(r.get("gpu_busy_ms"), ".3f"), _fmt(r.get("pct_of_floor"), ".0f", "%"),
            _fmt(r.get("kernels"), ".0f"), _fmt(None if hit is None else 100 * hit, ".0f"),
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt_line = lambda cells: "  ".join(c.ljust(w) if i < 3 + sweep else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [fmt_line(head), fmt_line(["-" * w for w in widths])] + [fmt_line(line) for line in lines]
    for s in res.get("skipped", []):
        out.append(f"skipped {s['mode']}: {s['reason']}")
    for e in res.get("errors", []):
        out.append(f"ERROR {e.get('mode')} {e.get('workload', '')} ({e.get('stage')}): {e.get('error')}")
    for r in rows:
        if r.get("capture_s") is not None and r is next(x for x in rows if x.get("mode") == r["mode"] and x.get("budget_set") == r.get("budget_set")):
            extra = f", compile+capture {r['compile_s']:.1f} s, fullgraph={r.get('fullgraph')}" if r.get("compile_s") is not None else ""
            out.append(f"{r['mode']} [{r.get('budget_set')}]: {len(r.get('capture_info', []))} graphs captured in "
                       f"{r['capture_s']:.2f} s, {graph_memory_label(r)}{extra}")
        if r.get("mode") == "compile" and r.get("compile_first_call_s") is not None:
            dyn = r.get("dynamo", {})
            out.append(f"compile [{r['workload']}]: first call {r['compile_first_call_s']:.1f} s, "
                       f"{dyn.get('stats.unique_graphs', 0)} graphs compiled, {dyn.get('graph_break.total', 0)} graph breaks, "
                       f"{dyn.get('inductor.cudagraph_skips', 0)} cudagraph skips")
    return "\n".join(out)


def graph_memory_label(row: dict) -> str:
    """What a graph mode's captures hold, from a result row: the pool plus the persistent buffers.
    Rows recorded before that split (one reserved-memory delta, which could go negative) say so."""
    if row.get("graph_total_mb") is not None:
        return (f"{row['graph_total_mb']:.1f} MiB held (graph pool {row['graph_pool_mb']:.1f} + "
                f"buffers {row['graph_buffers_mb']:.1f})")
    return "graph memory not recorded in this row's format"


def print_table(result_or_rows) -> None:
    print(format_table(result_or_rows))


# --------------------------------------------------------------------------------------------
# CLI (wired into ``python -m lfm2vl_lab bench`` by __main__)
# --------------------------------------------------------------------------------------------


class UsageError(ValueError):
    """Bad command-line input found after parsing (e.g. a GPU-only command on a machine without
    CUDA). ``python -m lfm2vl_lab`` prints it as one ``error:`` line and exits with status 2."""


def arg_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse ``type=`` from ``parse(text)``: its ``ValueError`` becomes argparse's one-line
    ``error: argument --x: <message>`` and exit status 2 (argparse would swallow the message)."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def choice_arg(kind: str, allowed, lower: bool = False):
    """argparse type: one of ``allowed`` (``lower``: case-insensitive, returned lower-cased)."""
    def parse(text: str) -> str:
        value = text.strip().lower() if lower else text.strip()
        check_choice(kind, value, allowed)
        return value

    return arg_type(parse, kind)


def int_arg(minimum: int):
    """argparse type: an int ``>= minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise ValueError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return arg_type(parse, f"int >= {minimum}")


def list_arg(item_type: Callable[[str], Any]):
    """argparse type: a comma list, each part through ``item_type`` (an argparse type); a list."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise ValueError(f"expected a comma list, got {text!r}")
        return [item_type(p) for p in parts]

    return arg_type(parse, f"list of {getattr(item_type, '__name__', 'values')}")


def preset_arg(text: str) -> str:
    """argparse type: a preset name (``presets.available_presets()``)."""
    from ..core.presets import available_presets

    return choice_arg("preset", available_presets())(text)


ON_OFF = {"on": True, "off": False}
on_off_list = list_arg(lambda t: ON_OFF[choice_arg("value", tuple(ON_OFF), lower=True)(t)])
device_arg = arg_type(parse_device, "device")
budgets_arg = arg_type(parse_budgets, "budget set")
workloads_arg = arg_type(expand_workloads, "workloads")
dtype_arg = choice_arg("dtype", tuple(DTYPES), lower=True)
positive_int = int_arg(1)


def flatten(lists) -> list:
    """Repeated list options (``action="append"`` of comma lists) → one list, order kept."""
    return [v for values in lists or [] for v in values]


def add_bench_args(p) -> None:
    """Options of ``python -m lfm2vl_lab bench``. Every value is checked here (argparse types), so
    a bad one is a one-line error with exit status 2 before anything is built."""
    from ..core.config import CU_SEQLENS_RULES, MAX_SEQLEN_MODES
    from ..core.encoder import ATTENTION_BACKENDS

    p.add_argument("--preset", type=preset_arg, default=None, help="model preset (default: lfm2-vl-450m on CUDA, tiny on CPU)")
    p.add_argument("--mode", action="append", type=list_arg(choice_arg("mode", MODES)), default=None,
                   help=f"mode(s), repeatable or comma list: {', '.join(MODES)} (default: all but lab-graph-fused)")
    p.add_argument("--workload", action="append", type=workloads_arg, default=None,
                   help="workload(s), repeatable or comma list: NxS (4x512), A..BxS (1..16x512), tiled, stream "
                        f"(default: {','.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--dtype", type=dtype_arg, default=None, help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed calls per row (default: 50 CUDA / 5 CPU)")
    p.add_argument("--warmup", type=int_arg(0), default=None, help="untimed calls before timing (default: 10 CUDA / 3 CPU)")
    p.add_argument("--device", type=device_arg, default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--stream-n", type=positive_int, default=200, help="requests in the stream workload (default: 200)")
    p.add_argument("--budgets", action="append", type=budgets_arg, default=None,
                   help="graph budget set, repeatable to sweep: 'auto' or a comma list like 64,256,1024")
    p.add_argument("--cu-rule", type=list_arg(choice_arg("cu rule", CU_SEQLENS_RULES)), default="safe",
                   help=f"cu_seqlens padding rule(s), comma list: {', '.join(CU_SEQLENS_RULES)}")
    p.add_argument("--max-seqlen-mode", type=list_arg(choice_arg("max-seqlen mode", MAX_SEQLEN_MODES)), default="tight",
                   help=f"max_seqlen mode(s), comma list: {', '.join(MAX_SEQLEN_MODES)}")
    p.add_argument("--fused-compile-mode", type=choice_arg("compile mode", FUSED_COMPILE_MODES), default="default",
                   help="torch.compile mode of the lab-graph-fused body (default: default; max-autotune-no-cudagraphs "
                        "took 251 s for two budgets on the H200 and ran slower)")
    p.add_argument("--attention", type=list_arg(choice_arg("attention backend", ("auto", *ATTENTION_BACKENDS))),
                   default="auto", help=f"attention backend(s) of the lab modes, comma list: auto, {', '.join(ATTENTION_BACKENDS)}")
    p.add_argument("--fuse-qkv", type=on_off_list, default="off", help="fused q/k/v GEMM in the lab modes, comma list: off, on")
    p.add_argument("--single-item-graphs", type=on_off_list, default=None,
                   help="lab-graph: dense-attention graphs for one item that fills a budget, comma list: off, on "
                        "(default: GraphedEncoder's, which is on)")
    p.add_argument("--profile", action="store_true", help="add torch.profiler metrics (GPU-busy, kernels, launches, timeline)")
    p.add_argument("--trace-dir", default=None, help="with --profile: keep the Chrome traces here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS_ROOT), help="results root (default: data/results)")
    p.add_argument("--name", default="bench", help="result file name prefix (default: bench)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--figure", default="auto",
                   help="PNG of this run's latencies (default: data/figures/last-bench-<device>.png; 'none' to skip)")


def run_bench_cli(args) -> int:
    """Benchmark encoder modes on workloads; print a table and write a result JSON."""
    command = "python -m lfm2vl_lab " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py") else None
    saved: dict = {}

    def checkpoint(partial: dict) -> None:  # a run killed by a time limit still leaves its finished modes
        saved["path"] = save_result(partial, args.out, args.name, saved.get("path"))

    result = run_bench(
        preset=args.preset, modes=flatten(args.mode) or DEFAULT_MODES, workloads=flatten(args.workload) or DEFAULT_WORKLOADS,
        dtype=args.dtype, repeats=args.repeats, warmup=args.warmup, device=args.device, stream_n=args.stream_n,
        budget_sets=args.budgets or [None],  # each --budgets is one set (None: auto); repeating it sweeps
        cu_rules=args.cu_rule, max_seqlen_modes=args.max_seqlen_mode, profile=args.profile,
        progress=not args.no_progress, seed=args.seed, fused_compile_mode=args.fused_compile_mode,
        trace_dir=args.trace_dir, command=command, name=args.name,
        attentions=args.attention, fuse_qkvs=args.fuse_qkv, single_item_graphs=args.single_item_graphs or (None,),
        on_job=checkpoint,
    )
    print_table(result)
    path = save_result(result, args.out, args.name, saved.get("path"))
    print(f"results: {path}")
    if args.figure != "none" and result["rows"]:
        from .plots import latency_figure

        fig_path = Path(args.figure) if args.figure != "auto" else \
            RESULTS_ROOT.parent / "figures" / f"last-bench-{gpu_slug(result['provenance']['gpu'])}.png"
        fig_path.parent.mkdir(parents=True, exist_ok=True)
        p = result["provenance"]
        latency_figure(result["rows"], f"Encoder latency per mode: {p['preset']}, {p['dtype']}, {p['gpu']} "
                                       "(whisker: p90)").savefig(fig_path, dpi=110)
        print(f"figure: {fig_path}")
    return 1 if result["errors"] else 0
