"""Why the TTFT grid's decode per token (0.84 ms, 450M, both graphed) is slower than the engine
role's (0.62 ms): the same fused engine timed both ways in one process, on one GPU.

The grid (``ttft``) builds its engine for its own prompts (``max_len`` 1664, ``max_batch`` 8) and times
the ``decode`` phase of a whole pipeline request between two CUDA events: 16 steps after the first
token, divided by 16. The engine role times ``prefill + sample + decode(N)`` less ``prefill + sample``
as whole calls on an engine sized for one prompt (``max_len`` 448). This probe runs, for the one
512 px request of 280 positions:

1. ``grid``: the grid's own cell (:func:`lfm2vl_lab.measure.ttft.run_ttft`, 1x512, one request, text
   and encoder graphed), as ``record`` runs it;
2. ``phase``: the decode phase again, by hand: the engine's ``decode(16)`` between two CUDA events
   after a pipeline request's prefill and sample;
3. ``calls``: the engine role's method on the grid's engine, and on an engine of the role's size; where
   the engine decodes over cache spans (branch ``decode-spans``), also on the grid's engine decoding
   over its whole cache as before (``/full``);
4. ``trace``: one pipeline request under torch.profiler: the decode phase's GPU-busy time, its idle
   time, and the longest gaps with the host calls around them.

    python scripts/decode_gap_probe.py --json gap.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lfm2vl_lab import GraphedEncoder, GraphOptions, build_model  # noqa: E402
from lfm2vl_lab.measure.results import code_hash  # noqa: E402
from lfm2vl_lab.measure.ttft import (  # noqa: E402
    PARITY_CASES,
    build_pipelines,
    capture_engine,
    mode_name,
    prompt_for,
    prompt_len,
    run_ttft,
)
from lfm2vl_lab.model.inputs import process_images  # noqa: E402
from lfm2vl_lab.serving import engine as engine_module  # noqa: E402
from lfm2vl_lab.serving.cache import bucket_len  # noqa: E402
from lfm2vl_lab.serving.engine import TextEngine  # noqa: E402

PRESET, IMAGE, STEPS, REPEATS = "lfm2-vl-450m", "1x512", 16, 15


def events_ms(fn, repeats: int = REPEATS) -> list[float]:
    """``fn()`` between two CUDA events, ``repeats`` times after two warm calls: ms each."""
    out = []
    for i in range(repeats + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            out.append(a.elapsed_time(b))
    return out


def role_method(eng: TextEngine, embeds: torch.Tensor, length: int) -> dict:
    """The engine role's decode per token: (prefill + sample + decode(N)) less (prefill + sample), over N."""
    def run(new):
        def call():
            eng.prompt(1, length).copy_(embeds)
            eng.prefill([length])
            eng.sample()
            if new:
                eng.decode(new)
        return call
    with_decode, without = events_ms(run(STEPS)), events_ms(run(0))
    per_token = (statistics.median(with_decode) - statistics.median(without)) / STEPS
    return {"max_len": eng.max_len, "per_token_ms": per_token,
            "call_ms": statistics.median(with_decode), "first_ms": statistics.median(without)}


def decode_phase(pipe, eng: TextEngine, images, ids) -> dict:
    """The decode phase by hand: a pipeline request up to its first token, then decode(16) between events."""
    inputs = process_images(images, pipe.model)
    per = []
    for i in range(REPEATS + 2):
        pipe.run(ids, inputs, 1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        eng.decode(STEPS)
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            per.append(a.elapsed_time(b) / STEPS)
    return {"per_token_ms": statistics.median(per), "samples": per}


def trace(pipe, images, ids) -> dict:
    """One whole request of 1 + 16 tokens under torch.profiler: the decode phase's GPU time and gaps."""
    from torch.profiler import ProfilerActivity, profile

    inputs = process_images(images, pipe.model)
    pipe.run(ids, inputs, 1 + STEPS)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pipe.run(ids, inputs, 1 + STEPS)
        torch.cuda.synchronize()
    gpu = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    graph_kernels = [e for e in gpu if e.name.startswith("gemv_kernel")]
    # the decode phase: from the first decode step's first GEMV to the last kernel
    first_gemv = graph_kernels[1].time_range.start if len(graph_kernels) > 1 else gpu[0].time_range.start
    phase = [e for e in gpu if e.time_range.start >= first_gemv - 50]
    busy = sum(e.time_range.elapsed_us() for e in phase)
    span = phase[-1].time_range.end - phase[0].time_range.start
    gaps = sorted(((b.time_range.start - a.time_range.end, a.name[:60], b.name[:60])
                   for a, b in zip(phase, phase[1:])), reverse=True)[:12]
    cpu = sorted(((e.cpu_time_total, e.key[:60], e.count) for e in prof.key_averages()
                  if e.device_type == torch.autograd.DeviceType.CPU), reverse=True)[:15]
    return {"kernels": len(phase), "busy_us": busy, "span_us": span, "idle_us": span - busy,
            "gaps_us": [{"us": g, "after": a, "before": b} for g, a, b in gaps],
            "cpu_top": [{"us": t, "name": n, "count": c} for t, n, c in cpu]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    a = p.parse_args()
    res = {"code_hash": code_hash(), "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    model = build_model(PRESET, dtype=torch.bfloat16, device="cuda", text_layers="full")
    genc = GraphedEncoder(model, GraphOptions.named("kit"))
    longest = max(prompt_len(model, im) for im in {IMAGE, "tiled", *(im for im, _ in PARITY_CASES)})
    grid_engine = TextEngine(model, max_batch=8, fuse=True, max_len=bucket_len(longest) + STEPS + 1)
    genc.capture()
    info = capture_engine(grid_engine, model, [IMAGE, "tiled"], [1, 2, 4, 8], progress=False)
    res["grid_engine"] = {"max_len": grid_engine.max_len, "graphs": len(info["captured"]),
                          "compile_s": info["compile_s"]}
    print(f"grid engine: max_len {grid_engine.max_len}, {len(info['captured'])} graphs", flush=True)
    rows = run_ttft(model, genc, grid_engine, images=(IMAGE,), requests=(1,), repeats=7, decode_tokens=STEPS,
                    progress=False)
    both = mode_name("graphed", "graphed")
    res["grid"] = {r["mode"]: r["decode_ms_per_token"] for r in rows}
    print(f"grid cell: decode {res['grid'][both]:.3f} ms/token (both graphed)", flush=True)
    pipe = build_pipelines(model, genc, grid_engine)[both]
    images, ids = prompt_for(model, IMAGE, 1)
    res["phase"] = decode_phase(pipe, grid_engine, images, ids)
    print(f"decode phase by hand: {res['phase']['per_token_ms']:.3f} ms/token", flush=True)
    length = int(ids.shape[1])
    embeds = torch.randn(1, length, model.config.text_config.hidden_size, device="cuda", dtype=torch.bfloat16)
    res["calls_grid_engine"] = role_method(grid_engine, embeds, length)
    role_engine = TextEngine(model, max_batch=8, fuse=True, max_len=bucket_len(length) + 64 + 1)
    role_engine.capture([(1, length), (8, length)])
    res["calls_role_engine"] = role_method(role_engine, embeds, length)
    res["spans"] = spans = getattr(engine_module, "decode_spans", None)
    if spans is not None:  # the grid's engine as it decoded before spans: one graph over the whole cache
        engine_module.decode_spans = lambda _t, n: [n]
        full = TextEngine(model, max_batch=8, fuse=True, max_len=grid_engine.max_len)
        full.capture([(1, length), (8, length)])
        engine_module.decode_spans = spans
        res["calls_grid_engine_full"] = role_method(full, embeds, length)
        res["spans"] = spans(bucket_len(length), grid_engine.max_len)
    for k in ("calls_grid_engine", "calls_grid_engine_full", "calls_role_engine"):
        if k not in res:
            continue
        r = res[k]
        print(f"{k}: max_len {r['max_len']}, per token {r['per_token_ms']:.3f} ms (call {r['call_ms']:.2f}, "
              f"first {r['first_ms']:.2f})", flush=True)
    res["trace"] = t = trace(pipe, images, ids)
    print(f"trace of the decode phase: {t['kernels']} kernels, busy {t['busy_us']:.0f} us, span {t['span_us']:.0f} us, "
          f"idle {t['idle_us']:.0f} us", flush=True)
    for g in t["gaps_us"]:
        print(f"   gap {g['us']:8.1f} us after {g['after']} before {g['before']}")
    for c in t["cpu_top"]:
        print(f"   cpu {c['us']:10.0f} us {c['count']:5d}x {c['name']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
