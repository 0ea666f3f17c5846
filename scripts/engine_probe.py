"""The text engine unfused and fused on one GPU, in one process: what each graph costs and why.

For each preset: the engines' capture (and the fused one's compile) seconds, then CUDA-event
medians of prefill + sample of one request of ``--length`` positions, one decode step of one
request and of eight, timed in alternating turns, and one profiled call of each step per engine
(kernel count, GPU-busy time, the kernels that take the most of it). The greedy tokens of 16 steps
are compared between the engines. Prints as it goes; ``--json`` writes the numbers.

``--max-len`` builds each mode's engine with each cache length (``mode@max_len``); ``--full-span``
adds each one as it decoded before cache spans: every decode step's attention over the whole
``max_len`` cache (``mode@max_len/full``), so one call shows what reading only the positions in use
saves at the TTFT grid's cache length against the engine role's.

Modes (``--modes``): ``plain`` (unfused), ``fused`` and ``fused-static`` (inductor, dynamic shapes or
not) with torch's linears (``gemv=False``), and ``fused-gemv``: the fused engine with its linears of at
most four rows through the Triton GEMV (:mod:`lfm2vl_lab.kernels.gemv`), and the RMSNorms, the MLP's
activation and the residual adds folded into it (``linear.fold = True``: the engine's default is off);
a ``fused-gemv`` mode ending ``-nofold`` (before any PDL suffix) is the engine as the kit builds it, those
ops inductor's own kernels. Programmatic dependent launch (PDL, Hopper and later: a kernel may start
while the one before it ends, and waits inside for its writes) is an experiment: a mode ending ``-pdl``
compiles the decode step's inductor kernels with it (``TextEngine(pdl=True)``) and captures the GEMV with it
(:data:`lfm2vl_lab.kernels.gemv.PDL_ENV`), ``-ipdl`` the inductor kernels only, ``-gpdl`` the GEMV only.
A torch without inductor's setting skips an ``-pdl``/``-ipdl`` mode and says so.

Decode is timed two ways: ``decode`` is one call of one step (host and GPU); ``decode x16`` is a call
of a prefill, its sample and 16 steps, less the median of ``prefill+sample``, per step: 16 steps in a
call, as the ``engine`` role times them, where a saving on the GPU side shows.

    python scripts/engine_probe.py --preset lfm2-vl-450m --json probe.json
    python scripts/engine_probe.py --modes plain,fused,fused-gemv --json probe.json
    python scripts/engine_probe.py --modes fused-gemv --max-len 448,1664 --full-span --json probe.json
    python scripts/engine_probe.py --modes fused-gemv-nofold,fused-gemv,fused-gemv-pdl --max-len 448 --json p.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lfm2vl_lab import build_model  # noqa: E402
from lfm2vl_lab.kernels import gemv as gemv_module  # noqa: E402
from lfm2vl_lab.measure.results import code_hash  # noqa: E402
from lfm2vl_lab.measure.timing import summarize, time_paired  # noqa: E402
from lfm2vl_lab.serving import engine as engine_module  # noqa: E402
from lfm2vl_lab.serving.engine import FUSE_COMPILE, TextEngine  # noqa: E402


def profile_step(fn, top: int = 12) -> dict:
    """One call under torch.profiler after a warm-up: kernels, GPU-busy µs, top kernels by time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += 1
            per[e.name][1] += e.device_time
    n, busy = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernels": n, "busy_us": round(busy, 1),
            "top": [{"name": k[:90], "calls": c, "us": round(t, 1)} for k, (c, t) in rows],
            "all": [{"name": k[:90], "calls": c, "us": round(t, 1)} for k, (c, t) in per.items()]}


def gemv_launches(pdl: bool):
    """The kit's GEMV launches inside the block: with PDL when ``pdl``, else the ordinary way (its
    environment switch, restored after)."""
    return mock.patch.dict(os.environ, {gemv_module.PDL_ENV: "1" if pdl else "0"})


def run_preset(name: str, length: int, repeats: int, fuse_modes: list[str], max_lens=(512,),
               full_span: bool = False) -> dict:
    model = build_model(name, dtype=torch.bfloat16, device="cuda", text_layers="full")
    lm = model.model.language_model
    params = sum(p.numel() * p.element_size() for p in lm.parameters()) + model.lm_head.weight.nbytes
    if model.lm_head.weight.data_ptr() == lm.embed_tokens.weight.data_ptr():
        params -= model.lm_head.weight.nbytes  # tied: read once
    H = model.config.text_config.hidden_size
    out = {"preset": name, "length": length, "text_bytes": params, "floor_ms": params / 4.8e12 * 1e3, "engines": {}}
    print(f"== {name}: text model {params / 1e9:.3f} GB, floor {out['floor_ms']:.3f} ms/step", flush=True)
    engines = {}
    spans = engine_module.decode_spans
    combos = [(m, n, f) for m in fuse_modes for n in max_lens for f in (False, True)[:1 + full_span]]
    for kind, max_len, full in combos:
        mode = kind if max_lens == (512,) and not full_span else f"{kind}@{max_len}" + ("/full" if full else "")
        base = kind.removesuffix("-pdl").removesuffix("-ipdl").removesuffix("-gpdl")
        engine_pdl, gemv_pdl = kind.endswith(("-pdl", "-ipdl")), kind.endswith(("-pdl", "-gpdl"))
        fold = not base.endswith("-nofold")
        base = base.removesuffix("-nofold")
        if engine_pdl and not engine_module.pdl_available("cuda"):
            why = f"torch {torch.__version__} has no torch._inductor.config.triton.enable_pdl (or no sm90 GPU)"
            print(f"{mode}: skipped: {why}", flush=True)
            out["engines"][mode] = {"skipped": why}
            continue
        # dynamo keeps one compiled body per code object for every engine: without a reset a mode would
        # replay the code an earlier mode compiled under other settings (PDL on or off)
        torch._dynamo.reset()
        FUSE_COMPILE["dynamic"] = {"fused": None, "fused-static": False}.get(base)
        # /full: the one decode graph per batch over the whole cache, as the engine ran before spans
        engine_module.decode_spans = (lambda _t, n: [n]) if full else spans
        t0 = time.perf_counter()
        fused = base != "plain"
        eng = TextEngine(model, max_batch=8, max_len=max_len, fuse=fused,
                         gemv=(base == "fused-gemv") if fused else None, pdl=engine_pdl and fused)
        if eng.linear is not None:
            eng.linear.fold = fold
        with gemv_launches(gemv_pdl):  # the engine compiles, and its graphs record their launches, here
            info = eng.capture([(1, length), (8, length)])
        wall = time.perf_counter() - t0
        print(f"{mode}: compile {info['compile_s']:.1f} s, capture {info['capture_s']:.2f} s, wall {wall:.1f} s; "
              f"graphs {', '.join(sorted(info['captured']))}", flush=True)
        engines[mode] = eng
        out["engines"][mode] = {"compile_s": info["compile_s"], "capture_s": info["capture_s"], "wall_s": wall,
                                "max_len": eng.max_len, "graphs": sorted(info["captured"]),
                                "inductor_pdl": fused and engine_pdl,
                                "gemv_pdl": gemv_pdl, "fold": fold and eng.linear is not None}
    engine_module.decode_spans = spans
    emb = torch.randn(8, length, H, device="cuda", dtype=torch.bfloat16)

    def prefill(eng, n):
        def call():
            eng.prompt(n, length).copy_(emb[:n])
            eng.prefill([length] * n)
            eng.sample()
        return call

    def decode(eng, n):
        prefill(eng, n)()
        return lambda: eng.decode(1)

    def decode16(eng):
        first = prefill(eng, 1)

        def call():
            first()
            eng.decode(16)
        return call

    steps = {"prefill+sample": lambda e: prefill(e, 1), "decode": lambda e: decode(e, 1),
             "decode x8": lambda e: decode(e, 8), "decode x16": decode16}
    first_ms = {}  # each mode's prefill+sample median, which decode x16 takes off its calls
    for step, make in steps.items():
        calls = {mode: make(eng) for mode, eng in engines.items()}
        times = time_paired(calls, repeats, 5, "cuda")
        for mode, ts in times.items():
            if step == "prefill+sample":
                first_ms[mode] = summarize(ts)["median_ms"]
            s = summarize([(t - first_ms[mode]) / 16 for t in ts] if step == "decode x16" else ts)
            out["engines"][mode][step] = {"median_ms": s["median_ms"], "p90_ms": s["p90_ms"],
                                          "profile": profile_step(make(engines[mode]))}
            p = out["engines"][mode][step]["profile"]
            # the kernel's own launches (inductor's kernels that read its output carry "gemv" in their names too)
            p["gemv_kernels"] = sum(r["calls"] for r in p["all"] if r["name"].startswith("gemv_kernel"))
            print(f"{mode:13s} {step:15s} {s['median_ms']:.3f} ms (p90 {s['p90_ms']:.3f}); {p['kernels']} kernels "
                  f"({p['gemv_kernels']} gemv), busy {p['busy_us'] / 1e3:.3f} ms", flush=True)
    for mode in engines:
        for step in steps:
            print(f"-- {mode} {step}: top kernels")
            for r in out["engines"][mode][step]["profile"]["top"]:
                print(f"   {r['us']:8.1f} us {r['calls']:4d}x {r['name']}")
    toks = {}
    for mode, eng in engines.items():
        # a recapture (weights that moved under an engine's graphs) would capture again under whatever
        # settings hold now, not the mode's: the A/B holds only where there was none
        out["engines"][mode]["recaptures"] = eng.stats.recaptures
        print(f"{mode}: recaptures {eng.stats.recaptures}")
        eng.prompt(1, length).copy_(emb[:1])
        eng.prefill([length])
        toks[mode] = torch.cat([eng.sample(), eng.decode(16)[0]]).tolist()
    for mode, t in toks.items():
        out["engines"][mode]["tokens"] = t
        for other in dict.fromkeys(("plain", "fused", next(iter(toks)))):
            if other in toks and other != mode:
                same = next((i for i, (a, b) in enumerate(zip(t, toks[other])) if a != b), len(t))
                out["engines"][mode][f"matching_{other}"] = same
                print(f"{mode}: tokens matching the {other} engine's: {same} of {len(t)}")
    del engines, model
    torch.cuda.empty_cache()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", action="append", default=None)
    p.add_argument("--length", type=int, default=280)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--modes", default="plain,fused", help="comma list of plain, fused, fused-static, fused-gemv, "
                   "with a suffix -pdl (programmatic dependent launch: inductor's decode kernels and the GEMV), -ipdl "
                   "(inductor's only) or -gpdl (the GEMV's only), and before it -nofold (the norms, activation "
                   "and residual adds outside the GEMV)")
    p.add_argument("--max-len", default="512", help="comma list: each mode's engine with each cache length")
    p.add_argument("--full-span", action="store_true", help="also each engine decoding over its whole cache")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import triton

    res = {"code_hash": code_hash(), "torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name(),
           "fuse_compile": dict(FUSE_COMPILE), "presets": []}
    for name in a.preset or ["lfm2-vl-450m"]:
        res["presets"].append(run_preset(name, a.length, a.repeats, a.modes.split(","),
                                         tuple(int(n) for n in a.max_len.split(",")), a.full_span))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
