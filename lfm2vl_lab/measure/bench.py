"""Benchmark harness: the same inputs through every encoder path, timed the same way.

In the style of nanoGPT's ``bench.py`` and gpt-fast: build once, burn in, then measure, and report
derived numbers next to the raw ones. The parts live beside this module: the modes
(:mod:`.modes`), the workloads (:mod:`.workloads`), the timing (:mod:`.timing`), the table
(:mod:`.table`) and the command-line types (:mod:`.args`). A :class:`RunSpec` is one configuration
of one mode: the mode, a :class:`~lfm2vl_lab.core.config.GraphOptions` and the fused mode's
``compile_mode``; :func:`expand_specs` turns a base ``GraphOptions`` and a sweep ``{setting: [values]}``
into them, and :func:`~.modes.row_labels` names each in the rows.

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
import itertools
import traceback
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from ..core.config import GRAPH_CONFIGS, GraphOptions
from ..model.parity import max_rel_error
from .modes import (
    COMPILE_MODES,
    COMPILED_MODES,
    CUDA_ONLY,
    DEFAULT_MODES,
    GRAPH_MODES,
    MODES,
    Runner,
    concerns,
    counter_diff,
    dynamo_counters,
    make_runner,
    mode_options,
    row_labels,
)
from .results import provenance
from .table import add_derived
from .timing import summarize, time_call, time_calls
from .values import (
    check_choice,
    dtype_name,
    parse_budgets,
    parse_device,
    parse_dtype,
)
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
    """One benchmark configuration: a mode, the settings it is built with (the ones that do not
    concern the mode are kept at their defaults: :func:`~.modes.mode_options`), the
    ``torch.compile`` mode of the ``lab-graph-fused`` body, and in graph modes the named graph config
    (:data:`~lfm2vl_lab.core.config.GRAPH_CONFIGS`) the options came from, if any (other modes: None)."""

    mode: str
    options: GraphOptions = GraphOptions()
    compile_mode: str = "default"
    graph_config: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "options", mode_options(self.mode, self.options))
        if self.graph_config is not None:
            check_choice("graph config", self.graph_config, GRAPH_CONFIGS)
        if self.mode not in GRAPH_MODES:
            object.__setattr__(self, "graph_config", None)

    def runner(self, model, progress: bool = False) -> Runner:
        """Build (and for graph modes capture) this configuration on ``model``."""
        return make_runner(self.mode, model, self.options, compile_mode=self.compile_mode, progress=progress,
                           graph_config=self.graph_config)

    def labels(self) -> dict:
        """The configuration as result rows and error entries name it (:func:`~.modes.row_labels`)."""
        return row_labels(self.mode, self.options, self.compile_mode, self.graph_config)


def check_sweep(sweep: dict | None, base: GraphOptions | None = None) -> dict[str, list]:
    """``{setting: [values]}`` checked against ``base`` (default ``GraphOptions()``), in the
    settings' own order: every name a ``GraphOptions`` field, every value one it accepts (a budget
    set may be written ``"auto"`` or ``"64,256"``; an on/off setting takes only True or False).
    Raises ``ValueError`` naming the value (or the name)."""
    base = base if base is not None else GraphOptions()
    sweep, out, names = dict(sweep or {}), {}, [f.name for f in fields(GraphOptions)]
    if set(sweep) - set(names):
        raise ValueError(f"unknown setting(s) {sorted(set(sweep) - set(names))} in the sweep; the settings are "
                         f"GraphOptions' fields: {names}")
    for f in fields(GraphOptions):
        if f.name not in sweep:
            continue
        values = sweep[f.name]
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not list(values):
            raise ValueError(f"sweep of {f.name}: expected a non-empty list of values, got {values!r}")
        values = [parse_budgets(v) for v in values] if f.name == "budgets" else list(values)
        if isinstance(f.default, bool) and not all(isinstance(v, bool) for v in values):
            raise ValueError(f"{f.name} values must be True or False, got {values!r}")
        for v in values:
            base.with_(**{f.name: v})  # GraphOptions' own check: a ValueError naming the value
        out[f.name] = values
    return out


def check_graph_configs(graph_configs, base: GraphOptions, sweep: dict) -> list[str | None]:
    """The named graph configs to sweep (``[None]``: none named, ``base`` as it is). A named config
    sets its fields itself, so ``base`` must leave them at their defaults and ``sweep`` must not sweep
    them: ``ValueError`` naming the name or the field otherwise."""
    if graph_configs is None:
        return [None]
    names = [graph_configs] if isinstance(graph_configs, str) else list(graph_configs)
    if not names:
        raise ValueError("graph_configs: expected a non-empty list of names")
    for n in names:
        check_choice("graph config", n, GRAPH_CONFIGS)
    fixed = {k for n in names for k in GRAPH_CONFIGS[n]}
    clash = sorted(k for k in fixed if k in sweep or getattr(base, k) != getattr(GraphOptions(), k))
    if clash:
        raise ValueError(f"the graph configs {names} set {', '.join(sorted(fixed))} themselves: "
                         f"leave {', '.join(clash)} out")
    return list(dict.fromkeys(names))


def expand_specs(modes, base: GraphOptions | None = None, sweep: dict | None = None,
                 compile_mode: str = "default", graph_configs=None) -> list[RunSpec]:
    """Every configuration to run, in order: per mode, ``base`` with every combination of the swept
    values of the settings that concern it (:data:`~.modes.SETTING_MODES`: the graph settings the
    graph modes, attention and the kernel options the lab modes, ``dense_graphs`` ``lab-graph``);
    a setting that does not concern a mode keeps its default (one spec, not a copy per value).
    ``graph_configs`` (names of :data:`~lfm2vl_lab.core.config.GRAPH_CONFIGS`): in graph modes each
    combination runs once per name, ``base`` with that config's fields (:func:`check_graph_configs`)."""
    base = base if base is not None else GraphOptions()
    sweep = check_sweep(sweep, base)
    named = check_graph_configs(graph_configs, base, sweep)
    for m in modes:
        check_choice("mode", m, MODES)
    check_choice("compile mode", compile_mode, COMPILE_MODES)
    out = []
    for m in dict.fromkeys(modes):
        names = [k for k in sweep if concerns(k, m)]
        for g in named if m in GRAPH_MODES else [None]:
            start = base.with_(**GRAPH_CONFIGS[g]) if g is not None else base
            out += [RunSpec(m, start.with_(**dict(zip(names, combo, strict=True))), compile_mode, g)
                    for combo in itertools.product(*(sweep[k] for k in names))]
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

    before = dynamo_counters() if runner.mode in COMPILED_MODES else None
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
    before = dynamo_counters() if runner.mode in COMPILED_MODES else None
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
              options: GraphOptions | None = None, sweep: dict | None = None, compile_mode: str = "default",
              graph_configs=None, profile: bool = False, progress: bool = True, seed: int = 0, trace_dir=None,
              command: str | None = None, name: str = "bench", on_job=None) -> dict:
    """Run every configuration (:func:`expand_specs` of ``options``, default ``GraphOptions()``, and
    ``sweep``, e.g. ``{"fuse_qkv": [False, True]}``, and ``graph_configs``, e.g. ``["kit", "pr"]``) on
    every workload; return the result dict (see the module docstring). ``compile_mode``: the
    ``lab-graph-fused`` body's.

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
    workloads = expand_workloads(workloads)
    if "stream" in workloads and stream_n < 1:
        raise ValueError(f"the stream workload needs stream_n >= 1, got {stream_n}")
    runnable = [m for m in dict.fromkeys(modes) if dev.type == "cuda" or m not in CUDA_ONLY]
    specs = [s for s in expand_specs(modes, options, sweep, compile_mode, graph_configs) if s.mode in runnable]
    # LFM2VL_CHECKPOINT set: the checkpoint's weights and image processor instead of the preset's
    model = model_for(preset, dtype=dt, device=dev, seed=seed)
    ck = getattr(model, "lab_checkpoint", None)
    if ck is not None:
        preset = getattr(model, "lab_preset", None) or replace(preset, name=ck["name"])
    result = {"name": name, "provenance": provenance(command, device=dev, dtype=dtype_name(dt), preset=preset.name,
                                                     repeats=repeats, warmup=warmup, stream_n=stream_n, seed=seed,
                                                     profile=profile, **({"checkpoint": ck} if ck else {})),
              "rows": [], "skipped": [], "errors": [], "complete": False}
    result["skipped"] = [{"mode": m, "reason": f"{CUDA_ONLY[m]} (device is {dev.type})"}
                         for m in dict.fromkeys(modes) if m not in runnable]
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

