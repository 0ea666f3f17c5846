"""Benchmark harness: the same inputs through every encoder path, timed the same way.

In the style of nanoGPT's ``bench.py`` and gpt-fast: build once, burn in, then measure, and report
derived numbers next to the raw ones. The parts live beside this module: the modes
(:mod:`.modes`), the workloads (:mod:`.workloads`), the timing (:mod:`.timing`), the table
(:mod:`.table`) and the command-line types (:mod:`.args`). A :class:`RunSpec` is one configuration
of one mode; :func:`expand_specs` turns the sweeps of :func:`run_bench` into them.

Timing: inputs are processed on the CPU and moved to the device *before* timing (every mode
alike; ``spatial_shapes`` stays on the CPU). Every call starts from an idle device. The first
three calls on a new workload are timed on their own (``first_calls_ms``: compile, capture-time
caches, re-records) and count towards the warm-up. Each fixed workload's first output is compared
with transformers' (``max_rel_err_vs_hf``); an output that cannot be compared (other shapes,
another item count) is an error of the row (``error``) and of the run, never a blank.
Derived: ``speedup_vs_hf`` (hf-eager median / median) and, with profiling, ``pct_of_floor``
= 100 · median / GPU-busy time (100 % = the kernels never wait). The ``stream`` workload times
each request once: p50/p99 over requests, graph hit rate, one-off costs.

With ``LFM2VL_CHECKPOINT`` set, the model is that checkpoint (:func:`~lfm2vl_lab.model.presets.model_for`):
its weights, its image processor, and transformers on those weights as the parity judge; the
provenance then names it (``checkpoint``: folder name and config hash).

Results are JSON: ``{"provenance": {...}, "rows": [...], "skipped": [...], "errors": [...]}``
saved under ``data/results/<gpu-slug>/<name>-<timestamp>.json``. An error entry keeps the
exception (``error``) and its full ``traceback``; the table shows the first line.
"""

from __future__ import annotations

import gc
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..core.config import CU_SEQLENS_RULES, MAX_SEQLEN_MODES, GraphOptions
from ..kernels.attention import ATTENTION_BACKENDS
from ..model.parity import max_rel_error
from .args import (
    check_choice,
    dtype_name,
    parse_budgets,
    parse_device,
    parse_dtype,
)
from .modes import (
    CUDA_ONLY,
    DEFAULT_CU_RULE,
    DEFAULT_MAX_SEQLEN_MODE,
    DEFAULT_MODES,
    FUSED_COMPILE_MODES,
    GRAPH_MODES,
    LAB_MODES,
    MODES,
    Runner,
    budgets_label,
    counter_diff,
    dynamo_counters,
    make_runner,
)
from .results import provenance
from .table import add_derived
from .timing import summarize, time_call, time_calls
from .workloads import (
    DEFAULT_WORKLOADS,
    default_device,
    device_defaults,
    expand_workloads,
    input_stats,
    stream_requests,
    to_device,
    workload_images,
)

FIRST_CALLS = 3
REPEATS = {"cuda": 50, "cpu": 5}  # timed calls per row, by device type
WARMUP = {"cuda": 10, "cpu": 3}  # untimed calls before timing
PROFILE_ITERS = {"cuda": 5, "cpu": 2}
PROFILE_KEYS = {"kernels": "kernels", "launch_calls": "launch_calls", "launch_cpu_ms": "launch_cpu_ms",
                "graph_launches": "graph_launches", "kernel_sum_ms": "kernel_sum_ms", "wall_ms": "profile_wall_ms",
                "gap_count": "gap_count", "gap_median_us": "gap_median_us", "gap_p90_us": "gap_p90_us",
                "gap_total_us": "gap_total_us", "timeline": "timeline", "cpu_lane": "timeline_cpu_lane",
                "trace_path": "trace_path"}  # profiler report field -> row field


@dataclass(frozen=True)
class RunSpec:
    """One benchmark configuration: a mode and everything it is built with, defaults explicit.
    ``budgets=None`` means the automatic budgets (``GraphedEncoder``'s own choice)."""

    mode: str
    budgets: tuple[int, ...] | None = None
    cu_rule: str = DEFAULT_CU_RULE
    max_seqlen_mode: str = DEFAULT_MAX_SEQLEN_MODE
    attention: str = "auto"
    fuse_qkv: bool = GraphOptions.fuse_qkv
    fuse_elementwise: bool = GraphOptions.fuse_elementwise
    dense_graphs: bool = GraphOptions.dense_graphs
    fused_compile_mode: str = "default"

    def runner(self, model, progress: bool = False) -> Runner:
        """Build (and for graph modes capture) this configuration on ``model``."""
        kw = asdict(self)
        mode, budgets = kw.pop("mode"), kw.pop("budgets")
        return make_runner(mode, model, budgets=None if budgets is None else list(budgets), progress=progress, **kw)

    def labels(self) -> dict:
        """The configuration as result rows and error entries name it."""
        return {"mode": self.mode, "budget_set": budgets_label(self.budgets), "cu_rule": self.cu_rule,
                "max_seqlen_mode": self.max_seqlen_mode}


def expand_specs(modes, budget_sets=(None,), cu_rules=(DEFAULT_CU_RULE,), max_seqlen_modes=(DEFAULT_MAX_SEQLEN_MODE,),
                 attentions=("auto",), fuse_qkvs=(GraphOptions.fuse_qkv,),
                 fuse_elementwises=(GraphOptions.fuse_elementwise,),
                 dense_graphs=(GraphOptions.dense_graphs,), fused_compile_mode: str = "default") -> list[RunSpec]:
    """Every configuration to run, in order: the graph modes sweep budget sets × cu rules ×
    max-seqlen modes, the lab modes attention backends × fuse_qkv × fuse_elementwise, ``lab-graph``
    dense graphs; a setting that does not apply to a mode keeps its default (one spec, not a copy per value)."""
    for kind, values in (("fuse_qkv", fuse_qkvs), ("fuse_elementwise", fuse_elementwises),
                         ("dense_graphs", dense_graphs)):
        if not all(isinstance(v, bool) for v in values):
            raise ValueError(f"{kind} values must be True or False, got {list(values)!r}")
    out = []
    for m in dict.fromkeys(modes):
        graph, lab = m in GRAPH_MODES, m in LAB_MODES
        out += [RunSpec(m, None if b is None else tuple(b), c, s, att, f, fe, dg, fused_compile_mode)
                for b in (budget_sets if graph else [None]) for c in (cu_rules if graph else [DEFAULT_CU_RULE])
                for s in (max_seqlen_modes if graph else [DEFAULT_MAX_SEQLEN_MODE])
                for att in (attentions if lab else ["auto"]) for f in (fuse_qkvs if lab else [GraphOptions.fuse_qkv])
                for fe in (fuse_elementwises if lab else [GraphOptions.fuse_elementwise])
                for dg in (dense_graphs if m == "lab-graph" else [GraphOptions.dense_graphs])]
    return list(dict.fromkeys(out))


def error_entry(stage: str, exc: BaseException, **where) -> dict:
    """A failure as a result file keeps it: where, the stage, the message and the full traceback."""
    return {**where, "stage": stage, "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}


def _profile_fields(fn, device, iters: int, trace_path) -> dict:
    from .profiling import profile_callable

    rep = profile_callable(fn, warmup=1, iters=iters, trace_path=trace_path, device=device)
    d = rep.as_dict(gaps=False)
    return {"gpu_busy_ms": d["gpu_busy_ms"] if rep.has_gpu else None, **{v: d[k] for k, v in PROFILE_KEYS.items()}}


def measure_fixed(runner: Runner, inputs: dict, device, repeats: int, warmup: int, ref=None,
                  profile: bool = False, profile_iters: int = 5, trace_path=None) -> dict:
    """Time one mode on one prepared input: first calls, warm-up, ``repeats`` timed calls. With
    ``ref``, the first output is compared with it; one that cannot be (``ValueError``: shapes or
    item counts differ) gives the row an ``error`` instead of a ``max_rel_err_vs_hf``."""
    device = torch.device(device)

    def fn():
        return runner.call(inputs)

    before = dynamo_counters() if runner.mode == "compile" else None
    first, check = [], {"max_rel_err_vs_hf": None}
    for i in range(FIRST_CALLS):
        ms, out = time_call(fn, device)
        first.append(ms)
        if i == 0 and ref is not None:
            try:
                check["max_rel_err_vs_hf"] = max_rel_error(list(out), list(ref))
            except ValueError as exc:
                check["error"] = f"output does not match hf-eager's: {exc}"
        del out
    runner.reset_stats()
    times = time_calls(fn, repeats, max(0, warmup - FIRST_CALLS), device)
    row = {**summarize(times), "repeats": repeats, "warmup": max(warmup, FIRST_CALLS), "first_calls_ms": first,
           "first_call_ms": first[0], **check, **runner.graph_stats()}
    if before is not None:
        row["dynamo"] = counter_diff(before, dynamo_counters())
        row["compile_first_call_s"] = first[0] / 1e3
    if profile:
        row.update(_profile_fields(fn, device, profile_iters, trace_path))
    return row


def measure_stream(runner: Runner, requests: list[dict], device, dtype, warmup: int, progress: bool = False) -> dict:
    """Each request once, in order, from an idle device: p50/p99 over requests, hit rate, one-offs.
    ``requests`` hold CPU tensors; each is moved to the device (``dtype``) before its timed call."""
    from tqdm.auto import tqdm

    device = torch.device(device)
    for req in requests[: max(0, warmup)]:
        runner.call(to_device(req, device, dtype))
    runner.reset_stats()
    before = dynamo_counters() if runner.mode == "compile" else None
    times = []
    for req in tqdm(requests, desc=f"stream {runner.mode}", leave=False, disable=not progress, unit="req"):
        inp = to_device(req, device, dtype)
        times.append(time_call(lambda inp=inp: runner.call(inp), device)[0])
        del inp
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


@dataclass
class _Session:
    """What every spec of one run shares: the model, the prepared inputs and the settings."""

    model: object
    preset: object
    device: torch.device
    dtype: torch.dtype
    repeats: int
    warmup: int
    profile: bool
    progress: bool
    trace_dir: str | None
    fixed: dict  # workload -> (device inputs, totals)
    stream: tuple | None
    refs: dict

    def base_row(self, spec: RunSpec, workload: str) -> dict:
        return {"preset": self.preset.name, "mode": spec.mode, "workload": workload, "device": self.device.type,
                "dtype": dtype_name(self.dtype), "gpu_busy_ms": None, "kernels": None}

    def measure(self, runner: Runner, spec: RunSpec, w: str) -> dict:
        """One row: ``spec``'s runner on workload ``w``."""
        from ..model.hf import hf_image_features

        if w == "stream":
            reqs, totals = self.stream
            row = {**totals, **measure_stream(runner, reqs, self.device, self.dtype, self.warmup, self.progress)}
            tps = row["tokens"] / row["total_s"] if row.get("total_s") else None
        else:
            inputs, totals = self.fixed[w]
            if w not in self.refs:
                self.refs[w] = [t.detach().float().cpu() for t in hf_image_features(self.model, inputs)]
            trace = Path(self.trace_dir) / f"{spec.mode}-{w}.pt.trace.json" if self.trace_dir else None
            row = {**totals, **measure_fixed(runner, inputs, self.device, self.repeats, self.warmup, self.refs[w],
                                             self.profile, PROFILE_ITERS[self.device.type], trace)}
            tps = row["tokens"] / (row["median_ms"] / 1e3) if row.get("median_ms") else None
        row = {**self.base_row(spec, w), **row, **runner.info}
        if tps is not None:
            row["tokens_per_s"] = tps
        return row


def _run_spec(s: _Session, spec: RunSpec, workloads: list[str], result: dict, bar) -> None:
    """Build ``spec`` once and measure it on every workload; failures become error entries."""
    bar.set_description(f"bench {spec.mode}")
    try:
        runner = spec.runner(s.model)
    except Exception as exc:  # one broken mode must not lose the other rows
        result["errors"].append(error_entry("setup", exc, **spec.labels()))
        bar.update(len(workloads))
        return
    for w in workloads:
        try:
            row = s.measure(runner, spec, w)
            result["rows"].append(row)
            if row.get("error"):
                result["errors"].append({**spec.labels(), "workload": w, "stage": "parity", "error": row["error"]})
        except Exception as exc:  # a failed workload must not lose the others
            result["errors"].append(error_entry("measure", exc, workload=w, **spec.labels()))
        bar.update(1)
    del runner
    gc.collect()
    if s.device.type == "cuda":
        torch.cuda.empty_cache()


def _check_choices(modes, cu_rules, max_seqlen_modes, attentions) -> None:
    for kind, values, allowed in (("mode", modes, MODES), ("cu rule", cu_rules, CU_SEQLENS_RULES),
                                  ("max-seqlen mode", max_seqlen_modes, MAX_SEQLEN_MODES),
                                  ("attention backend", attentions, ("auto", *ATTENTION_BACKENDS))):
        for v in values:
            check_choice(kind, v, allowed)


def _prepare_inputs(workloads, preset, dev, dt, stream_n: int, seed: int, progress: bool) -> tuple[dict, tuple | None]:
    """Inputs processed once, on the CPU, outside any timing; fixed ones moved to the device."""
    from ..model.inputs import process_images

    fixed = {}
    for w in (w for w in workloads if w != "stream"):
        images = workload_images(w, seed)
        cpu_in = process_images(images, preset)
        fixed[w] = (to_device(cpu_in, dev, dt), {"n_images": len(images), **input_stats(cpu_in)})
    return fixed, stream_requests(stream_n, preset, seed, progress) if "stream" in workloads else None


def run_bench(preset: str | None = None, modes=DEFAULT_MODES, workloads=DEFAULT_WORKLOADS, dtype=None,
              repeats: int | None = None, warmup: int | None = None, device=None, stream_n: int = 200,
              budget_sets=(None,), cu_rules=(DEFAULT_CU_RULE,), max_seqlen_modes=(DEFAULT_MAX_SEQLEN_MODE,),
              profile: bool = False, progress: bool = True, seed: int = 0, fused_compile_mode: str = "default",
              trace_dir=None, command: str | None = None, name: str = "bench", attentions=("auto",),
              fuse_qkvs=(GraphOptions.fuse_qkv,), fuse_elementwises=(GraphOptions.fuse_elementwise,),
              dense_graphs=(GraphOptions.dense_graphs,),
              on_job=None) -> dict:
    """Run every configuration (:func:`expand_specs` of the sweeps) on every workload; return the
    result dict (see the module docstring).

    Defaults follow the device (:func:`workloads.device_defaults` for preset and dtype; ``REPEATS``
    and ``WARMUP``). ``on_job(result)`` is called after each configuration (``result["complete"]``
    is False until the end): the CLI saves a checkpoint with it. Bad arguments raise a
    ``ValueError`` naming the value, before a model is built.
    """
    from tqdm.auto import tqdm

    from ..model.presets import as_preset, model_for

    dev = parse_device(device) if device is not None else default_device()
    default_preset, default_dtype = device_defaults(dev)
    preset, dt = as_preset(preset or default_preset), parse_dtype(dtype) if dtype is not None else default_dtype
    repeats = REPEATS[dev.type] if repeats is None else repeats
    warmup = WARMUP[dev.type] if warmup is None else warmup
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    _check_choices(modes, cu_rules, max_seqlen_modes, attentions)
    check_choice("fused compile mode", fused_compile_mode, FUSED_COMPILE_MODES)
    workloads = expand_workloads(workloads)
    if "stream" in workloads and stream_n < 1:
        raise ValueError(f"the stream workload needs stream_n >= 1, got {stream_n}")
    budget_sets = [parse_budgets(b) for b in budget_sets] or [None]
    # LFM2VL_CHECKPOINT set: the checkpoint's weights and image processor instead of the preset's
    model = model_for(preset, dtype=dt, device=dev, seed=seed)
    ck = getattr(model, "lab_checkpoint", None)
    if ck is not None:
        preset = getattr(model, "lab_preset", None) or replace(preset, name=ck["name"])
    result = {"name": name, "provenance": provenance(command, device=dev, dtype=dtype_name(dt), preset=preset.name,
                                                     repeats=repeats, warmup=warmup, stream_n=stream_n, seed=seed,
                                                     profile=profile, **({"checkpoint": ck} if ck else {})),
              "rows": [], "skipped": [], "errors": [], "complete": False}
    runnable = [m for m in dict.fromkeys(modes) if dev.type == "cuda" or m not in CUDA_ONLY]
    result["skipped"] = [{"mode": m, "reason": f"{CUDA_ONLY[m]} (device is {dev.type})"}
                         for m in dict.fromkeys(modes) if m not in runnable]
    specs = expand_specs(runnable, budget_sets, cu_rules, max_seqlen_modes, attentions, fuse_qkvs,
                         fuse_elementwises, dense_graphs, fused_compile_mode)
    fixed, stream = _prepare_inputs(workloads, model if ck else preset, dev, dt, stream_n, seed, progress)
    session = _Session(model, preset, dev, dt, repeats, warmup, profile, progress, trace_dir, fixed, stream, {})
    bar = tqdm(total=len(specs) * len(workloads), desc="bench", disable=not progress, unit="run")
    for spec in specs:
        _run_spec(session, spec, workloads, result, bar)
        if on_job is not None:
            add_derived(result["rows"])
            on_job(result)
    bar.close()
    result["complete"] = True
    add_derived(result["rows"])
    return result

