"""``python -m lfm2vl_lab roofline``: after the graphs, a decode step's kernels against the GPU's roofs
(:mod:`~lfm2vl_lab.measure.roofline`).

One ``roofline-<date>.json``, rewritten after each part: the memory bandwidth and the bf16 GEMM rate, the
cost of a kernel boundary inside a graph against an eager launch, then each kernel class of a decode
step at the preset's shapes, with the time its bytes predict. Needs a CUDA GPU (everything is timed
with CUDA events around graph replays).
"""

from __future__ import annotations

import sys

from ..measure.results import ResultFile, provenance
from ..measure.values import UsageError

NAME = "roofline"


def run_roofline_cli(args) -> int:
    """After the graphs: the GPU's roofs, a kernel boundary's cost, a decode step's kernels against them."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("roofline needs a CUDA GPU (it times graph replays with CUDA events); the recorded run "
                         "is data/results/nvidia-h200/roofline-*.json, which notebook 08 reads")
    from ..measure import roofline

    say = (lambda s: None) if args.no_progress else (lambda s: print(s, flush=True))
    shapes = roofline.decode_shapes(args.preset)
    result = {"name": NAME, "provenance": provenance("python -m lfm2vl_lab " + " ".join(sys.argv[1:]),
                                                     dtype="bfloat16", preset=args.preset),
              "shapes": shapes, "trials": args.trials, "complete": False}
    file = ResultFile(args.out, args.name)
    result["peaks"] = roofline.measure_peaks(args.trials)
    bandwidth = result["peaks"][0]["gb_s"]
    say(f"memory {bandwidth:.0f} GB/s, GEMM {result['peaks'][1]['tflop_s']:.0f} TFLOP/s")
    file.save(result)
    result["boundary"] = roofline.measure_boundary(args.trials)
    graph, eager = (result["boundary"][k]["us_per_kernel"] for k in ("graph", "eager"))
    say(f"a kernel in a graph {graph:.2f} µs, launched eagerly {eager:.2f} µs")
    file.save(result)
    result["rows"] = roofline.measure_kernels(shapes, bandwidth, trials=args.trials, say=say)
    result["composed"] = [roofline.composed_gemvs(result["rows"], impl) for impl in ("F.linear", "triton")
                          if any(r.get("impl") == impl for r in result["rows"])]
    result["complete"] = True
    file.save(result)
    for c in result["composed"]:
        say(f"decode step's {c['kernels']} GEMVs, {c['impl']}: {c['us']:.0f} µs composed, their bytes predict "
            f"{c['predicted_us']:.0f} µs")
    print("results:", file.path)
    return 0
