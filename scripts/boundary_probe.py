"""What is left once the launches are graphed: the cost of a kernel boundary inside a CUDA graph, and
how close a decode step's GEMMs come to the GPU's memory bandwidth.

A graphed decode step of the 450M text model is hundreds of small kernels that read the weights once.
Two numbers bound what better kernels can save there, and this probe measures both on the GPU it runs
on. Every time is taken with CUDA events around graph replays (the median of ``--repeats``):

1. ``boundary``: graphs of N dependent tiny kernels (an in-place add on one element, which does no
   work), for N in :data:`NS`. The slope of replay time against N is the cost of one kernel boundary
   inside a graph. The same kernels launched eagerly, timed the same way, give the host-bound cost that
   graphs replace.
2. ``bandwidth``: a copy and a sum over :data:`BANDWIDTH_BYTES` of bf16. That is the memory bandwidth
   that simple kernels reach here: the roof, as measured, not as specified.
3. ``gemv``: each distinct linear layer of a preset's text model at one token (``F.linear`` of one row
   by the layer's weight, bf16), cycling over enough weight copies that the L2 cache holds none of them.
   It reports the time, the weight bytes over the time, and that rate's share of the measured copy
   bandwidth. The layers' weight bytes over the copy bandwidth are the decode step's GEMM floor.

It writes ``<out>/<gpu>/boundary-*.json`` with provenance. A probe beside the reference set: its file
is kept under ``data/results/<gpu>/probes/<date>/`` (the set's own folder holds only the set), and no
page reads it until a role records it. It needs a CUDA GPU (``bash scripts/h200_run.sh boundary``).

    python scripts/boundary_probe.py [--preset lfm2-vl-450m] [--repeats 50] [--out data/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

NS = (1, 16, 64, 256, 1024)  # kernels per graph
BANDWIDTH_BYTES = 1 << 30
L2_SAFE_BYTES = 256 << 20  # well past the H200's 60 MiB L2: each GEMV reads a weight no other one left there


def linear_shapes(preset: str) -> Counter:
    """``{(in_features, out_features): count}`` of every linear layer of the preset's text model (the
    LM head too), read off transformers' own LFM2, built on the meta device: no weights, no GPU."""
    from transformers import AutoModelForCausalLM

    from lfm2vl_lab.model.presets import build_config

    cfg = build_config(preset, text_layers="full").text_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return Counter((m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear))


def slope(xs, ys) -> float:
    """The least-squares slope of ``ys`` against ``xs``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _median_us(fn, repeats: int) -> float:
    """Median µs of ``fn()`` between two CUDA events, after two untimed calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _graph(body):
    """``body`` captured once in a CUDA graph (after a warm-up on a side stream, as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def boundary(repeats: int) -> dict:
    x = torch.zeros(1, device="cuda")

    def kernels(n):
        def body():
            for _ in range(n):
                x.add_(1)
        return body

    graph_us = [_median_us(_graph(kernels(n)).replay, repeats) for n in NS]
    eager_us = [_median_us(kernels(n), repeats) for n in NS]
    return {"ns": list(NS), "graph_us": graph_us, "eager_us": eager_us,
            "per_kernel_graph_us": slope(NS, graph_us), "per_kernel_eager_us": slope(NS, eager_us)}


def bandwidth(repeats: int) -> dict:
    src = torch.empty(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst, total = torch.empty_like(src), torch.empty((), dtype=torch.float32, device="cuda")
    copy_us = _median_us(_graph(lambda: dst.copy_(src)).replay, repeats)
    sum_us = _median_us(_graph(lambda: torch.sum(src, dim=0, dtype=torch.float32, out=total)).replay, repeats)
    return {"bytes": BANDWIDTH_BYTES, "copy_us": copy_us, "sum_us": sum_us,
            "copy_gbs": 2 * BANDWIDTH_BYTES / copy_us / 1e3, "sum_gbs": BANDWIDTH_BYTES / sum_us / 1e3}


def _gemv_us(k: int, n: int, repeats: int) -> tuple[float, int]:
    """µs of one ``F.linear`` of a [1, k] row by an [n, k] bf16 weight, and the weight copies cycled
    through so that the L2 cache holds none of them."""
    copies = max(2, -(-L2_SAFE_BYTES // (k * n * 2)))
    weights = [torch.empty(n, k, dtype=torch.bfloat16, device="cuda").normal_() for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")

    def body():
        for w in weights:
            torch.nn.functional.linear(x, w)

    return _median_us(_graph(body).replay, repeats) / copies, copies


def gemv(shapes: Counter, repeats: int, copy_gbs: float) -> list[dict]:
    rows = []
    for (k, n), count in sorted(shapes.items()):
        us, copies = _gemv_us(k, n, repeats)
        torch.cuda.empty_cache()
        gbs = k * n * 2 / us / 1e3
        rows.append({"in": k, "out": n, "count": count, "weight_bytes": k * n * 2, "us": us, "gbs": gbs,
                     "of_copy": gbs / copy_gbs, "copies": copies})
    return rows


def lines(res: dict) -> list[str]:
    b, bw = res["boundary"], res["bandwidth"]
    out = [f"kernel boundary inside a graph: {b['per_kernel_graph_us']:.2f} us per kernel "
           f"(eager launches: {b['per_kernel_eager_us']:.2f} us), over {b['ns']} kernels",
           f"bandwidth: copy {bw['copy_gbs']:.0f} GB/s, sum {bw['sum_gbs']:.0f} GB/s ({bw['bytes'] >> 20} MiB bf16)"]
    for r in res["gemv"]:
        out.append(f"gemv {r['in']:>6} x {r['out']:<6} x{r['count']:<3} {r['us']:8.2f} us  {r['gbs']:7.0f} GB/s  "
                   f"{100 * r['of_copy']:5.1f}% of copy")
    f = res["decode_floor"]
    out.append(f"{res['preset']} decode GEMMs: {f['weight_bytes'] / 1e9:.3f} GB of weights per token, "
               f"{f['ms_at_copy']:.3f} ms at the copy bandwidth, {f['ms_measured']:.3f} ms as the GEMVs ran "
               f"(one after another, no boundary or other op counted)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lfm2-vl-450m")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--out", default=None, help="results root (default: data/results)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("boundary_probe: needs a CUDA GPU (run it with `bash scripts/h200_run.sh boundary`)", file=sys.stderr)
        return 2
    from lfm2vl_lab.measure.results import RESULTS_ROOT, provenance, save_result

    shapes = linear_shapes(args.preset)
    res = {"name": "boundary", "preset": args.preset, "boundary": boundary(args.repeats),
           "bandwidth": bandwidth(args.repeats)}
    res["gemv"] = gemv(shapes, args.repeats, res["bandwidth"]["copy_gbs"])
    weight = sum(r["weight_bytes"] * r["count"] for r in res["gemv"])
    res["decode_floor"] = {"weight_bytes": weight, "ms_at_copy": weight / res["bandwidth"]["copy_gbs"] / 1e6,
                           "ms_measured": sum(r["us"] * r["count"] for r in res["gemv"]) / 1e3}
    res["provenance"] = provenance(device="cuda", preset=args.preset, dtype="bfloat16")
    print("\n".join(lines(res)))
    print(f"results: {save_result(res, root=args.out or RESULTS_ROOT, name='boundary')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
