"""After the graphs: what a decode step's kernels cost on this GPU, and what they could cost.

Once CUDA graphs have taken the host's launches away, a decode step is its kernels: how many there are,
and how far each one is from its limit. Three measurements say so, each from one graph replayed with
CUDA events (the host is out of the timing, as it is out of a graphed step):

* **peaks** (:func:`measure_peaks`): the bytes a streaming add moves per second, and the bf16 FLOPs a
  large GEMM does per second. They are the two roofs every kernel sits under.
* **boundary** (:func:`measure_boundary`): graphs of N one-element adds, each depending on the one
  before. The slope of replay time over N is what the smallest kernel costs inside a graph, the
  boundary between two kernels included; the same adds launched eagerly give the cost of a launch.
* **kernels** (:func:`measure_kernels`): each class of kernel a decode step runs, at the preset's own
  shapes (:func:`decode_shapes`): the linears as GEMVs (``F.linear`` and the kit's Triton GEMV), a
  one-row elementwise add, decode attention over a short and a long cache, and a prefill GEMM beside
  them. Each is one of many calls captured in one graph, each on inputs of its own (:func:`copies_for`:
  none finds its inputs in L2); its bytes and FLOPs are counted from its
  shapes (:func:`traffic`), so its place under the roofs follows, and the time its bytes predict at the
  measured bandwidth stands beside the time it took.

``python -m lfm2vl_lab roofline`` writes one ``roofline-<date>.json``; notebook 08 reads it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from ..core.capture import capture_graph

BF16 = 2  # bytes per element of every tensor measured here
# N of the boundary graphs; the slope is fitted over those whose replay the GPU bounds (at N >= 256 a
# replay outlasts its own launch by far), the smaller ones show the graph launch itself
BOUNDARY_N = (1, 16, 64, 256, 512, 1024, 2048)
FIT_FROM = 256
CACHES = (280, 2048)  # decode attention's cached positions: the TTFT grid's prompt, the engine's cache
PREFILL_ROWS = 280
# what the calls of one kernel's graph read together: five times the H200's 50 MiB of L2, so that each
# call reads from HBM, as a decode step's layers do (its 0.7 GB of weights pass through L2 once a step)
COLD_BYTES = 256 * 2**20
# the bandwidth roof's streaming add: two inputs and an output of 512 MiB each. Not a copy: torch's bf16
# copy_ falls well short of what an add or a large GEMV moves on the H200, so a copy is no roof
STREAM_NUMEL = 2**28


def decode_shapes(preset: str = "lfm2-vl-450m") -> dict:
    """The text model's sizes, and one decode step's linears as the fused engine runs them (q/k/v one
    GEMM, w1/w3 one): ``{"text": {...}, "linears": [{"name", "n", "k", "count"}]}``, ``n`` outputs from
    ``k`` inputs, ``count`` of them per step."""
    from ..model.presets import build_config, mlp_width

    t = build_config(preset, text_layers="full").text_config
    hd = t.hidden_size // t.num_attention_heads
    attn = t.layer_types.count("full_attention")
    conv = t.num_hidden_layers - attn
    h, mlp = t.hidden_size, mlp_width(t)
    text = {"hidden": h, "mlp": mlp, "heads": t.num_attention_heads, "kv_heads": t.num_key_value_heads,
            "head_dim": hd, "layers": t.num_hidden_layers, "attention_layers": attn, "vocab": t.vocab_size}
    linears = [("q/k/v (attention layers)", h + 2 * t.num_key_value_heads * hd, h, attn),
               ("in_proj (short-conv layers)", 3 * h, h, conv), ("out_proj", h, h, t.num_hidden_layers),
               ("w1/w3", 2 * mlp, h, t.num_hidden_layers), ("w2", h, mlp, t.num_hidden_layers),
               ("LM head", t.vocab_size, h, 1)]
    return {"text": text, "linears": [{"name": n, "n": o, "k": i, "count": c} for n, o, i, c in linears]}


def traffic(kind: str, **s) -> tuple[int, int]:
    """``(bytes, flops)`` one call of ``kind`` moves and does, counted from its shapes (bf16): what a
    kernel must read and write at the least, not what it happens to."""
    if kind == "gemm":  # x [m, k] @ w [n, k]^T -> [m, n]
        m, n, k = s["m"], s["n"], s["k"]
        return BF16 * (m * k + n * k + m * n), 2 * m * n * k
    if kind == "add":  # out = a + b
        return 3 * BF16 * s["numel"], s["numel"]
    if kind == "attention":  # one query per head against `cache` cached keys and values
        q = s["heads"] * s["head_dim"]
        kv = 2 * s["cache"] * s["kv_heads"] * s["head_dim"]
        return BF16 * (2 * q + kv), 4 * s["cache"] * q
    raise ValueError(f"traffic: unknown kind {kind!r} (known: gemm, add, attention)")


def slope(ns, us) -> dict:
    """The least-squares line through ``(n, µs)``: ``{"us_per_kernel", "intercept_us"}``."""
    fit = statistics.linear_regression([float(n) for n in ns], [float(u) for u in us])
    return {"us_per_kernel": fit.slope, "intercept_us": fit.intercept}


def _spread(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"us": statistics.median(samples), "p25_us": q[0], "p75_us": q[2], "trials": len(samples)}


def graph_us(calls: list[Callable[[], object]], replays: int, trials: int) -> list[float]:
    """µs per call of ``calls``: each captured once, in order, in one graph (the kit's capture recipe,
    :func:`~lfm2vl_lab.core.capture.capture_graph`), which is replayed ``replays`` times back to back per
    trial, timed with CUDA events; one value per trial."""
    graph = capture_graph(lambda: [fn() for fn in calls], warmup=2)
    for _ in range(3):
        graph.replay()
    out = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        out.append(1000 * start.elapsed_time(end) / (replays * len(calls)))
    del graph
    return out


def copies_for(nbytes: int) -> int:
    """How many calls, each on inputs of its own, one graph holds for a kernel that reads ``nbytes``:
    enough that together they read :data:`COLD_BYTES`, so that no call finds its inputs in L2, as no
    layer of a decode step finds its weights there (between 8 and 512)."""
    return max(8, min(512, -(-COLD_BYTES // max(nbytes, 1))))


def eager_us(fn: Callable[[], object], calls: int, trials: int) -> list[float]:
    """µs per call of ``fn`` launched eagerly ``calls`` times in a row: the host's launch rate where the
    kernel is small."""
    fn()
    out = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(1000 * start.elapsed_time(end) / calls)
    return out


def measure_peaks(trials: int = 5) -> list[dict]:
    """The memory bandwidth (a streaming add, ``a + b`` over :data:`STREAM_NUMEL` elements) and the bf16
    GEMM rate (8192³) of this GPU, as rows: the roofs."""
    a, b = (torch.randn(STREAM_NUMEL, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    nbytes, flops = traffic("add", numel=STREAM_NUMEL)
    us = _spread(graph_us([lambda: a + b] * 4, 5, trials))
    rows = [{"kind": "peak", "name": f"streaming add, 3 × {BF16 * STREAM_NUMEL // 2**20} MiB", "bytes": nbytes,
             "flops": flops, **us, "gb_s": nbytes / us["us"] / 1e3}]
    x, w = (torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    nbytes, flops = traffic("gemm", m=8192, n=8192, k=8192)
    us = _spread(graph_us([lambda: x @ w.T] * 4, 5, trials))
    rows.append({"kind": "peak", "name": "GEMM, bf16 8192³", "bytes": nbytes, "flops": flops, **us,
                 "tflop_s": flops / us["us"] / 1e6})
    return rows


def measure_boundary(trials: int = 7) -> dict:
    """What the smallest kernel costs in a graph (the slope over :data:`BOUNDARY_N`) and eagerly."""
    x = torch.zeros(1, device="cuda")
    rows = [{"kind": "boundary", "n": n, **_spread([u * n for u in graph_us([lambda: x.add_(1)] * n, 20, trials)])}
            for n in BOUNDARY_N]
    fit = [r for r in rows if r["n"] >= FIT_FROM]
    eager = _spread(eager_us(lambda: x.add_(1), 2048, trials))
    return {"rows": rows, "graph": {**slope([r["n"] for r in fit], [r["us"] for r in fit]), "fit_from": FIT_FROM},
            "eager": {"us_per_kernel": eager["us"], "p25_us": eager["p25_us"], "p75_us": eager["p75_us"]}}


def _kernel_calls(shapes: dict) -> list[tuple[str, str, dict, dict, Callable]]:
    """``(class, name, traffic kind and shapes, row extras, make)``: ``make()`` allocates inputs of its
    own and returns the call to time on them."""
    t, dev = shapes["text"], "cuda"

    def linear(m, n, k, fn):
        def make():
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) / k**0.5
            return lambda: fn(x, w)
        return make

    from ..kernels.gemv import gemv, triton_available

    calls = []
    for lin in shapes["linears"]:
        n, k, extra = lin["n"], lin["k"], {"per_step": lin["count"], "shape": f"1×{lin['k']} · {lin['k']}×{lin['n']}"}
        calls.append(("GEMV", f"{lin['name']}, F.linear", {"kind": "gemm", "m": 1, "n": n, "k": k},
                      {**extra, "impl": "F.linear"}, linear(1, n, k, torch.nn.functional.linear)))
        if triton_available():
            calls.append(("GEMV", f"{lin['name']}, the kit's Triton GEMV", {"kind": "gemm", "m": 1, "n": n, "k": k},
                          {**extra, "impl": "triton"}, linear(1, n, k, gemv)))
    big = max(shapes["linears"][:-1], key=lambda lin: lin["n"] * lin["k"])  # the largest layer linear
    calls.append(("GEMM", f"{big['name']}, prefill of {PREFILL_ROWS} rows", {"kind": "gemm", "m": PREFILL_ROWS,
                  "n": big["n"], "k": big["k"]}, {"impl": "F.linear"},
                  linear(PREFILL_ROWS, big["n"], big["k"], torch.nn.functional.linear)))

    def add(numel):
        def make():
            a, b = (torch.randn(numel, dtype=torch.bfloat16, device=dev) for _ in range(2))
            return lambda: a + b
        return make
    calls.append(("elementwise", f"residual add, 1×{t['hidden']}", {"kind": "add", "numel": t["hidden"]}, {},
                  add(t["hidden"])))

    def attention(cache):
        def make():
            q = torch.randn(1, t["heads"], 1, t["head_dim"], dtype=torch.bfloat16, device=dev)
            kv = [torch.randn(1, t["kv_heads"], cache, t["head_dim"], dtype=torch.bfloat16, device=dev)
                  for _ in range(2)]
            return lambda: torch.nn.functional.scaled_dot_product_attention(q, *kv, enable_gqa=True)
        return make
    for cache in CACHES:
        calls.append(("attention", f"decode attention, {cache} cached positions",
                      {"kind": "attention", "cache": cache, **{k: t[k] for k in ("heads", "kv_heads", "head_dim")}},
                      {"cache": cache}, attention(cache)))
    return calls


def measure_kernels(shapes: dict, bandwidth_gb_s: float, trials: int = 7, say=print) -> list[dict]:
    """Each kernel class of a decode step at ``shapes``: time per call in a graph (:func:`copies_for`
    calls, each on inputs of its own), bytes, FLOPs, and the time its bytes predict at ``bandwidth_gb_s``."""
    rows = []
    for cls, name, spec, extra, make in _kernel_calls(shapes):
        kind, dims = spec["kind"], {k: v for k, v in spec.items() if k != "kind"}
        b, f = traffic(kind, **dims)
        calls = [make() for _ in range(copies_for(b))]
        us = _spread(graph_us(calls, 10, trials))
        del calls
        rows.append({"kind": "kernel", "class": cls, "name": name, **extra, "copies": copies_for(b), "bytes": b,
                     "flops": f, **us,
                     "gb_s": b / us["us"] / 1e3, "tflop_s": f / us["us"] / 1e6,
                     "predicted_us": b / bandwidth_gb_s / 1e3})
        say(f"  {name}: {us['us']:.2f} µs ({rows[-1]['gb_s']:.0f} GB/s; its bytes predict "
            f"{rows[-1]['predicted_us']:.2f} µs)")
        torch.cuda.empty_cache()
    return rows


def composed_gemvs(rows: list[dict], impl: str) -> dict:
    """The decode step's GEMVs of ``impl`` (``F.linear`` or ``triton``), each at its time in a graph,
    times its count per step, summed: a composed number, not a timed step."""
    gemvs = [r for r in rows if r.get("class") == "GEMV" and r.get("impl") == impl]
    return {"impl": impl, "kernels": sum(r["per_step"] for r in gemvs),
            "us": sum(r["us"] * r["per_step"] for r in gemvs),
            "predicted_us": sum(r["predicted_us"] * r["per_step"] for r in gemvs),
            "bytes": sum(r["bytes"] * r["per_step"] for r in gemvs), "composed": True}
