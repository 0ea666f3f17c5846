"""The encoder paths the benchmark compares (``MODES``), each built once into a :class:`Runner`.

* ``hf-eager``        transformers' ``get_image_features`` (via :func:`lfm2vl_lab.model.hf.hf_image_features`)
* ``lab-eager``       :meth:`PackedVisionEncoder.encode`: packed varlen, no graphs
* ``lab-graph``       :class:`GraphedEncoder` after capture: one CUDA graph per budget
* ``compile``         ``torch.compile(mode="reduce-overhead")`` of a function calling transformers'
                      ``get_image_features`` (inductor + CUDA graph trees; rows record the first
                      call's seconds and dynamo counters, which show recompiles per new shape)
* ``compile-max``     the same function under ``torch.compile(mode="max-autotune")``: a user's strongest
                      off-the-shelf alternative (inductor autotunes its GEMMs and kernels, CUDA
                      graph trees as above; same row fields)
* ``lab-graph-fused`` ``GraphedEncoder`` whose captured ``body`` is the packed forward compiled by
                      inductor (``dynamic=False``; ``fullgraph=True`` when dynamo traces it whole,
                      else with graph breaks); the compile cost is part of capture

The four graph modes need CUDA (``CUDA_ONLY`` says why). ``DEFAULT_MODES`` leaves
``lab-graph-fused`` and ``compile-max`` out: the one's compile per budget and the other's first call
are slow (the ``compile_s`` of recorded ``lab-graph-fused`` rows and the ``compile_first_call_s``
of ``compile-max`` rows under ``data/results`` say how slow), which a default run should not pay.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..core.config import GraphOptions
from .meter import graph_memory, measured_capture

MODES = ("hf-eager", "lab-eager", "lab-graph", "compile", "compile-max", "lab-graph-fused")
DEFAULT_MODES = ("hf-eager", "lab-eager", "lab-graph", "compile")
CUDA_ONLY = {
    "lab-graph": "CUDA graphs need a CUDA device",
    "compile": "mode='reduce-overhead' is CUDA graphs (cudagraph trees); it needs a CUDA device",
    "compile-max": "mode='max-autotune' autotunes GPU kernels and runs them as CUDA graphs; it needs a CUDA device",
    "lab-graph-fused": "CUDA graphs of an inductor-compiled body need a CUDA device",
}
GRAPH_MODES = ("lab-graph", "lab-graph-fused")  # the graph settings (budgets, cu rule, max-seqlen ...) apply to these
LAB_MODES = ("lab-eager", "lab-graph", "lab-graph-fused")  # the packed encoder: attention / kernel-option settings
# Which modes each GraphOptions setting concerns; a mode is built with the others at their defaults, so
# a sweep of a setting repeats only the modes it concerns. A setting missing here concerns GRAPH_MODES.
SETTING_MODES = {
    "budgets": GRAPH_MODES, "max_budget": GRAPH_MODES, "max_items": GRAPH_MODES, "cu_seqlens_rule": GRAPH_MODES,
    "max_seqlen_mode": GRAPH_MODES, "attention": LAB_MODES, "fuse_qkv": LAB_MODES, "fuse_elementwise": LAB_MODES,
    "dense_graphs": ("lab-graph",), "max_run_items": ("lab-graph",),  # a compiled body gets no dense graphs
    "stage_rows": GRAPH_MODES, "check_finite": GRAPH_MODES, "layout_cache_size": GRAPH_MODES,
}
# How result rows name a setting where it is not the field's name (data/results files are read by these)
ROW_NAMES = {"budgets": "budget_set", "cu_seqlens_rule": "cu_rule"}
# The settings every row of a mode they concern names; the others are named only off their default
ROW_SETTINGS = ("budgets", "cu_seqlens_rule", "max_seqlen_mode", "attention", "fuse_qkv", "fuse_elementwise",
                "dense_graphs")
# torch.compile's modes, for the lab-graph-fused body (the instrument's own setting, ``compile_mode``)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_MODE_OF_COMPILE = "reduce-overhead"  # the ``compile`` mode's own, fixed
# The modes that torch.compile transformers' image path (make_compile), each with its fixed torch.compile mode.
# Their rows record the first call's seconds and the dynamo counters.
COMPILED_MODES = {"compile": COMPILE_MODE_OF_COMPILE, "compile-max": "max-autotune"}

# What dynamo and inductor raise when they cannot compile a body whole (torch 2.11 to 2.14): a graph
# break under fullgraph=True (Unsupported), an op failing on fake tensors (TorchRuntimeError), the
# backend failing (BackendCompilerFailed), a tracing rule broken by the code (UserError).
TRACE_FAILURES: tuple[type[BaseException], ...] = tuple(
    getattr(torch._dynamo.exc, name) for name in ("Unsupported", "TorchRuntimeError", "BackendCompilerFailed",
                                                  "UserError") if hasattr(torch._dynamo.exc, name))


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
    from torch._dynamo.utils import counters

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
    """The counters that changed between two :func:`dynamo_counters` snapshots, by how much."""
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] != before.get(k, 0)}


def budgets_label(budgets) -> str:
    """How rows name a budget set: ``"auto"`` or ``"64,256"``."""
    return "auto" if budgets is None else ",".join(str(b) for b in budgets)


def concerns(setting: str, mode: str) -> bool:
    """Whether the GraphOptions field ``setting`` changes what ``mode`` builds (:data:`SETTING_MODES`)."""
    return mode in SETTING_MODES.get(setting, GRAPH_MODES)


def mode_options(mode: str, options: GraphOptions | None = None) -> GraphOptions:
    """``options`` as ``mode`` is built with them: the settings that do not concern it at their defaults."""
    options = options if options is not None else GraphOptions()
    return GraphOptions().with_(**{f.name: getattr(options, f.name) for f in fields(GraphOptions)
                                   if concerns(f.name, mode)})


def row_labels(mode: str, options: GraphOptions | None = None, compile_mode: str = "default",
               graph_config: str | None = None) -> dict:
    """The one way a configuration names itself in result rows and error entries: ``mode``, the
    ``graph_config`` it was built from in graph modes (a name of
    :data:`~lfm2vl_lab.core.config.GRAPH_CONFIGS`, where the run named one; other modes never), each
    setting of ``options`` that concerns the mode (:data:`ROW_SETTINGS` always, under their row names
    ``budget_set``, ``cu_rule``, ``max_seqlen_mode``, ``attention``, ``fuse_qkv``, ``fuse_elementwise``,
    ``dense_graphs``; any other only where it is off its default), and the ``compile_mode`` of the
    modes that compile (``lab-graph-fused``'s body; ``compile``'s and ``compile-max``'s own, fixed:
    :data:`COMPILED_MODES`). A built runner's
    ``info`` replaces ``attention`` by the backend that ran (``auto`` resolved)."""
    options = options if options is not None else GraphOptions()
    labels = {"mode": mode}
    if graph_config is not None and mode in GRAPH_MODES:
        labels["graph_config"] = graph_config
    for f in fields(GraphOptions):
        value = getattr(options, f.name)
        if concerns(f.name, mode) and (f.name in ROW_SETTINGS or value != f.default):
            labels[ROW_NAMES.get(f.name, f.name)] = budgets_label(value) if f.name == "budgets" else value
    if mode == "lab-graph-fused" or mode in COMPILED_MODES:
        labels["compile_mode"] = compile_mode if mode == "lab-graph-fused" else COMPILED_MODES[mode]
    return labels


def is_trace_failure(exc: BaseException) -> bool:
    """Whether ``exc``, or any exception it was raised from or during (``__cause__`` and
    ``__context__``, followed all the way), is one of ``TRACE_FAILURES``: dynamo or inductor could
    not compile the body whole. A failed capture wraps the body's error (often as the context of
    the error that ending the capture raised), so the whole chain is searched."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, TRACE_FAILURES):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
    return False


def _graph_info(genc, rows: list[dict], seconds: float) -> dict:
    """What capture resolved and cost (the settings themselves are :func:`row_labels`')."""
    cfg = genc.config
    return {
        "budgets": list(cfg.budgets), "max_items": cfg.max_items, "attention": genc.encoder.attention_backend,
        "capture_s": seconds, "capture_info": rows,
        **{f"graph_{k}": v for k, v in graph_memory(rows).items() if k != "per_budget"},
    }


def _captured(genc, progress: bool) -> dict:
    """Capture ``genc`` through the meter; the graph part of a row's info."""
    t0 = time.perf_counter()
    rows = measured_capture(genc, progress=progress)
    return _graph_info(genc, rows, time.perf_counter() - t0)


def make_runner(mode: str, model, options: GraphOptions | None = None, *, compile_mode: str = "default",
                progress: bool = False, graph_config: str | None = None) -> Runner:
    """Build (and for graph modes capture) one mode on ``model`` with the settings of ``options``
    that concern it (default: ``GraphOptions()``; :func:`mode_options`); ``compile_mode``: the
    ``torch.compile`` mode of ``lab-graph-fused``'s body; ``graph_config``: the named config
    ``options`` came from, for the rows. The runner's ``info`` starts with :func:`row_labels`.
    Raises ``ValueError`` for an unknown mode."""
    from ..core.encoder import PackedVisionEncoder
    from ..core.graphed_encoder import GraphedEncoder
    from ..model.hf import hf_image_features

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    opts = mode_options(mode, options)
    labels = row_labels(mode, opts, compile_mode, graph_config)
    if mode == "hf-eager":
        return Runner(mode, lambda inp: hf_image_features(model, inp), labels)
    if mode == "lab-eager":
        enc = PackedVisionEncoder(model, attention=opts.attention, fuse_qkv=opts.fuse_qkv,
                                  fuse_elementwise=opts.fuse_elementwise)
        return Runner(mode, enc.encode, {**labels, "attention": enc.attention_backend})
    if mode == "lab-graph":
        genc = GraphedEncoder(model, opts)
        return Runner(mode, genc.encode, {**labels, **_captured(genc, progress)}, genc)
    if mode == "lab-graph-fused":
        return make_fused(model, opts, compile_mode, progress, graph_config)
    return make_compile(model, mode)


def make_fused(model, options: GraphOptions | None = None, compile_mode: str = "default",
               progress: bool = False, graph_config: str | None = None) -> Runner:
    """GraphedEncoder with an inductor-compiled body (``torch.compile(mode=compile_mode)``) of the
    packed encoder ``options`` describe. ``fullgraph=True`` first: one fused program per budget. If
    dynamo or inductor cannot compile it whole (:func:`is_trace_failure`), fall back to a body with
    graph breaks and say so in ``fullgraph_error``; any other error propagates."""
    from ..core.encoder import PackedVisionEncoder
    from ..core.graphed_encoder import GraphedEncoder

    opts = mode_options("lab-graph-fused", options)
    error = None
    for fullgraph in (True, False):
        torch._dynamo.reset()
        enc = PackedVisionEncoder(model, attention=opts.attention, fuse_qkv=opts.fuse_qkv,
                                  fuse_elementwise=opts.fuse_elementwise)
        body = torch.compile(enc, mode=compile_mode, dynamic=False, fullgraph=fullgraph)
        genc = GraphedEncoder(model, opts, body=body)
        try:
            graph = _captured(genc, progress)
        except Exception as exc:
            if not fullgraph or not is_trace_failure(exc):
                raise
            error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            del genc, body
            gc.collect()
            torch.cuda.empty_cache()
            continue
        # capture timed compile + warm-up + capture together: that sum is the one-off cost here
        info = {**row_labels("lab-graph-fused", opts, compile_mode, graph_config), **graph, "fullgraph": fullgraph,
                "fullgraph_error": error, "compile_s": graph["capture_s"]}
        return Runner("lab-graph-fused", genc.encode, info, genc)
    raise AssertionError("unreachable")


def make_compile(model, mode: str = "compile") -> Runner:
    """``torch.compile`` around transformers' own image path, in the torch.compile mode of ``mode``
    (:data:`COMPILED_MODES`: ``compile`` is ``"reduce-overhead"``, ``compile-max`` ``"max-autotune"``;
    both run CUDA graph trees)."""
    from ..core.encoder import lfm2vl_parts

    if mode not in COMPILED_MODES:
        raise ValueError(f"make_compile: unknown mode {mode!r}; choose from {', '.join(COMPILED_MODES)}")
    torch._dynamo.reset()  # counters and caches of earlier modes must not leak into this one
    w = lfm2vl_parts(model)[0].embeddings.patch_embedding.weight

    def hf_features(pixel_values, spatial_shapes, pixel_attention_mask):
        return model.get_image_features(pixel_values=pixel_values, spatial_shapes=spatial_shapes,
                                        pixel_attention_mask=pixel_attention_mask)

    compiled = torch.compile(hf_features, mode=COMPILED_MODES[mode])

    @torch.no_grad()
    def call(inp):
        torch.compiler.cudagraph_mark_step_begin()  # tell cudagraph trees a new inference step begins
        out = compiled(inp["pixel_values"].to(w.device, w.dtype), inp["spatial_shapes"].to(w.device),
                       inp["pixel_attention_mask"].to(w.device))
        feats = out.pooler_output if hasattr(out, "pooler_output") else out
        # Clone: cudagraph trees overwrite their outputs on the next replay.
        return [f.clone() for f in feats]

    return Runner(mode, call, row_labels(mode))
