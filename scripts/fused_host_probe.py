"""Why is ``lab-graph-fused`` (an inductor-compiled body in our graphs) slower than ``lab-graph``?

The H200 bench in ``data/results/nvidia-h200/archive/bench-20261129-102755.json.gz`` had it at 1.52 ms for
1x512 against 1.38 ms, although its kernels were *fewer and shorter* (GPU-busy 1.10 vs 1.17 ms): the
loss is on the host. This probe separates the
candidates, 1x512 on the 450M preset in bf16, varlen graphs only on both sides (the fused body
cannot take the dense variants):

1. ``lab-graph`` encode() wall and its bare ``graph.replay()`` wall, before any torch.compile;
2. the same, *after* the fused runner was compiled and captured in this process;
3. the fused runner's encode() wall and bare replay wall.

If (2) is slower than (1) like (3) is, compiling slowed the whole process's host path, not the
fused graph. ``--after-compile-mode`` first runs the ``compile`` mode (``torch.compile`` with
``mode="reduce-overhead"`` around transformers' path, CUDA graph trees) on the same input, as the
that bench did just before its fused mode, and measures (1) again after it. Writes
``data/results/<gpu>/fused-host-*.json`` with provenance.

    python scripts/fused_host_probe.py [--after-compile-mode] [--out data/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from lfm2vl_lab.core.config import GraphOptions
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.lfm2vl import VARLEN
from lfm2vl_lab.measure.modes import make_compile, make_fused
from lfm2vl_lab.measure.results import RESULTS_ROOT, provenance, save_result
from lfm2vl_lab.measure.workloads import random_processor_output, to_device
from lfm2vl_lab.model.presets import build_model


def _wall_ms(fn, n: int = 200) -> dict:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - t))
    return {"median_ms": statistics.median(times), "min_ms": min(times)}


def _measure(genc, inputs) -> dict:
    budget = 256
    graph = genc.graphs[budget].graphs[VARLEN]
    return {"encode": _wall_ms(lambda: genc.encode(inputs)), "replay": _wall_ms(graph.replay)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS_ROOT))
    p.add_argument("--after-compile-mode", action="store_true", help="run the compile mode first, as the first run did")
    args = p.parse_args()
    model = build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda")
    inputs = to_device(random_processor_output([(32, 32)], "lfm2-vl-450m", seed=0), "cuda", torch.bfloat16)
    # the fused body has no dense variants and no kernel options of ours: compare like with like
    # one budget (256 tokens: one 512 px image) keeps the inductor compile short
    options = GraphOptions(budgets=[256], dense_graphs=False, fuse_qkv=False, fuse_elementwise=False)
    plain = GraphedEncoder(model, options)
    plain.capture()
    rows = [{"what": "lab-graph, before any compile", **_measure(plain, inputs)}]
    if args.after_compile_mode:
        compiled = make_compile(model)
        for _ in range(3):  # compiles on the first call, then records its CUDA graph trees
            compiled.call(inputs)
        rows.append({"what": "lab-graph, after the compile mode ran", **_measure(plain, inputs),
                     "compile_mode_ms": _wall_ms(lambda: compiled.call(inputs), n=50)})
    t0 = time.perf_counter()
    fused = make_fused(model, options)
    compile_s = time.perf_counter() - t0
    rows.append({"what": "lab-graph, after the fused body was compiled", **_measure(plain, inputs)})
    rows.append({"what": "lab-graph-fused", "compile_s": compile_s, **_measure(fused.graphed, inputs)})
    for r in rows:
        enc, rep = r['encode']['median_ms'], r['replay']['median_ms']
        print(f"{r['what']:>46}: encode {enc:.3f} ms, bare replay {rep:.3f} ms")
    result = {"name": "fused-host", "provenance": provenance("python " + " ".join(sys.argv), device="cuda",
                                                             dtype="bfloat16", preset="lfm2-vl-450m",
                                                             workload="1x512"), "rows": rows}
    print("results:", save_result(result, args.out, "fused-host"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
