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
4. ``triton`` (on unless ``--no-triton``): the kit's Triton GEMV (``lfm2vl_lab/kernels/gemv.py``) on
   the same shapes, timed the same way, in the table's configuration and a few others
   (:func:`candidates`), each checked against an fp32 ``F.linear`` (eagerly and in a replayed graph:
   a wrong but fast kernel shows as ``FAILED``); the linears that share an input (q/k/v, gate/up)
   one by one and as one launch over their concatenated weight; and the step's sums: ``F.linear``,
   the table, the best candidate per shape, and the table with each group as one launch. Triton's
   compiles are part of its time (``seconds``), about 30 kernels.
5. ``norm`` (on unless ``--no-norm``): the linear groups that read an RMSNorm's output (q/k/v and a
   conv layer's in_proj after ``operator_norm``, w1/w3 after ``ffn_norm``; :func:`norm_groups` counts
   them per step from the model), timed the same way two ways: transformers' RMSNorm compiled by
   torch.compile (one inductor kernel) then the Triton GEMV over the group's concatenated weight, and
   ``gemv_rmsnorm_shared`` (the norm inside the GEMV: one kernel); the saving per call and per decode
   step, and the fused kernel checked against an all-fp32 norm and linear (``FAILED`` if not within
   :data:`REL_LIMIT`). The engine's norm kernels also add the residual: the saving counts the norm's
   kernel as gone, which it is only once the residual add is done elsewhere.

It writes ``<out>/<gpu>/boundary-*.json`` with provenance. A probe beside the reference set: its file
is kept under ``data/results/<gpu>/probes/<date>/`` (the set's own folder holds only the set), and no
page reads it until a role records it. It needs a CUDA GPU (``bash scripts/h200_run.sh boundary``).

    python scripts/boundary_probe.py [--preset lfm2-vl-450m] [--repeats 50] [--out data/results] [--no-triton]
                                     [--no-norm]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

NS = (1, 16, 64, 256, 1024)  # kernels per graph
BANDWIDTH_BYTES = 1 << 30
L2_SAFE_BYTES = 256 << 20  # well past the H200's 60 MiB L2: each GEMV reads a weight no other one left there
# linears that read one input, by their names under one module (LFM2's; gate_proj/up_proj in Llama's naming)
SHARED_INPUT = (("q/k/v", ("q_proj", "k_proj", "v_proj")), ("gate/up", ("w1", "w3")),
                ("gate/up", ("gate_proj", "up_proj")))
REL_LIMIT = 1e-2  # the Triton GEMV against an fp32 F.linear: largest error over the reference's largest magnitude
CHECK_ROWS = 4  # rows of x the correctness check also runs with (every accumulator of the kernel)


@functools.cache
def _text_model(preset: str) -> torch.nn.Module:
    """The preset's text model as transformers builds it, on the meta device: no weights, no GPU."""
    from transformers import AutoModelForCausalLM

    from lfm2vl_lab.model.presets import build_config

    cfg = build_config(preset, text_layers="full").text_config
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def linear_shapes(preset: str) -> Counter:
    """``{(in_features, out_features): count}`` of every linear layer of the preset's text model (the
    LM head too), read off transformers' own LFM2."""
    return Counter((m.in_features, m.out_features) for m in _text_model(preset).modules()
                   if isinstance(m, torch.nn.Linear))


def shared_groups(preset: str) -> Counter:
    """``{(label, in_features, (out_features, ...)): count}`` of the linears that read one input
    (:data:`SHARED_INPUT`: children of one module with those names), which one launch can serve."""
    out = Counter()
    for module in _text_model(preset).modules():
        kids = dict(module.named_children())
        for label, names in SHARED_INPUT:
            if all(isinstance(kids.get(name), torch.nn.Linear) for name in names):
                out[(label, kids[names[0]].in_features, tuple(kids[name].out_features for name in names))] += 1
    return out


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


def _cold_us(call, shapes, repeats: int) -> tuple[float, int]:
    """µs of one ``call(x, *weights)`` for a [1, k] bf16 row ``x`` and fresh bf16 weights of ``shapes``
    ([n, k] each), cycling through enough weight copies that the L2 cache holds none of them; and
    the number of copies."""
    k = shapes[0][1]
    copies = max(2, -(-L2_SAFE_BYTES // sum(n * k * 2 for n, _ in shapes)))
    weights = [[torch.empty(*s, dtype=torch.bfloat16, device="cuda").normal_() for s in shapes]
               for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")

    def body():
        for ws in weights:
            call(x, *ws)

    return _median_us(_graph(body).replay, repeats) / copies, copies


def _gemv_us(k: int, n: int, repeats: int) -> tuple[float, int]:
    """µs of one ``F.linear`` of a [1, k] row by an [n, k] bf16 weight, L2-cold (:func:`_cold_us`)."""
    return _cold_us(torch.nn.functional.linear, [(n, k)], repeats)


def gemv(shapes: Counter, repeats: int, copy_gbs: float) -> list[dict]:
    rows = []
    for (k, n), count in sorted(shapes.items()):
        us, copies = _gemv_us(k, n, repeats)
        torch.cuda.empty_cache()
        gbs = k * n * 2 / us / 1e3
        rows.append({"in": k, "out": n, "count": count, "weight_bytes": k * n * 2, "us": us, "gbs": gbs,
                     "of_copy": gbs / copy_gbs, "copies": copies})
    return rows


def candidates(k: int, n: int) -> list:
    """The Triton GEMV's launch configurations to time for one shape: the table's pick first, then
    the same with twice the warps, twice the rows per program, twice the K chunk (one chunk for a
    K of 1024: every load of a program issued at once), half the rows with twice the K splits, and
    no split (duplicates as launched left out). Not the pipeline stages: Triton 3.6 compiles this
    kernel alike for 1 and 3 (sm_90), its loads feed no dot."""
    from lfm2vl_lab.kernels.gemv import pick_config, resolve

    base = pick_config(1, n, k)
    wide = base.block_n * 2
    out = [base, base._replace(num_warps=2 * base.num_warps),
           base._replace(block_n=wide, num_warps=8 if wide * base.block_k >= 16384 else 4),
           base._replace(block_k=min(2 * base.block_k, max(16, 1 << (k - 1).bit_length()))),
           base._replace(block_n=max(8, base.block_n // 2), split_k=2 * base.split_k), base._replace(split_k=1)]
    return list(dict.fromkeys(resolve(c, k)[0] for c in out))  # as they launch: no two the same


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |y - ref| / max |ref|`` in fp32; NaN wherever ``y`` has one (so it never passes a limit)."""
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def _rel_err(k: int, n: int, m: int, cfg) -> float:
    """The Triton GEMV of an [m, k] row block by an [n, k] weight against an fp32 ``F.linear``: the
    larger :func:`rel_error` of an eager call and of a graph replayed three times (split-K counters
    must come back to zero between replays)."""
    from lfm2vl_lab.kernels.gemv import gemv

    x, w = (torch.randn(*s, dtype=torch.bfloat16, device="cuda") for s in ((m, k), (n, k)))
    ref = torch.nn.functional.linear(x.float(), w.float())
    return _eager_and_replayed(lambda: gemv(x, w, None, cfg), ref)


def _eager_and_replayed(call, ref: torch.Tensor) -> float:
    """The larger :func:`rel_error` against ``ref`` of ``call()`` eagerly and of a graph of it replayed
    three times (split-K counters must come back to zero between replays); NaN if either is NaN."""
    out = {}

    def body():
        out["y"] = call()

    body()
    eager = out["y"].clone()
    graph = _graph(body)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    errs = [rel_error(eager, ref), rel_error(out["y"], ref)]
    return float("nan") if any(e != e for e in errs) else max(errs)


def _run(label, fn) -> dict:
    """``fn()``'s result, or the one-line error of a configuration that does not compile or launch
    (out of registers or shared memory): recorded beside the others, not fatal to the probe."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 -- any Triton or CUDA error of one candidate
        return {"config": label, "error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"}


def triton_shape(k: int, n: int, count: int, repeats: int, copy_gbs: float) -> dict:
    """The Triton GEMV of one decode shape, timed like ``F.linear`` (:func:`_cold_us`) in each of
    :func:`candidates`; each candidate's error against fp32 too. ``table`` is the table's pick,
    ``best`` the fastest candidate within :data:`REL_LIMIT`."""
    from lfm2vl_lab.kernels.gemv import gemv

    def one(cfg):
        us, copies = _cold_us(lambda x, w: gemv(x, w, None, cfg), [(n, k)], repeats)
        gbs = k * n * 2 / us / 1e3
        return {"config": list(cfg), "us": us, "gbs": gbs, "of_copy": gbs / copy_gbs, "copies": copies,
                "rel_err": _rel_err(k, n, 1, cfg)}

    runs = []
    for cfg in candidates(k, n):
        runs.append(_run(list(cfg), lambda cfg=cfg: one(cfg)))
        torch.cuda.empty_cache()
    good = [r for r in runs if "us" in r and r["rel_err"] <= REL_LIMIT]
    rows = _run(f"{CHECK_ROWS} rows", lambda: {"rel_err": _rel_err(k, n, CHECK_ROWS, None)})
    return {"in": k, "out": n, "count": count, "weight_bytes": k * n * 2, "table": runs[0],
            "best": min(good, key=lambda r: r["us"]) if good else None, "candidates": runs,
            f"rel_err_{CHECK_ROWS}_rows": rows.get("rel_err", rows.get("error"))}


def triton_group(label: str, k: int, sizes: tuple, count: int, repeats: int) -> dict:
    """Linears that share an input: ``F.linear`` and the Triton GEMV one by one, against one launch
    of each over the concatenated weight (``gemv_shared``), all L2-cold."""
    from lfm2vl_lab.kernels.gemv import gemv, gemv_shared

    F = torch.nn.functional
    apart, whole = [(n, k) for n in sizes], [(sum(sizes), k)]
    row = {"label": label, "in": k, "sizes": list(sizes), "count": count, "weight_bytes": k * sum(sizes) * 2}
    for name, call, shapes in (("separate_flinear", lambda x, *ws: [F.linear(x, w) for w in ws], apart),
                               ("separate_triton", lambda x, *ws: [gemv(x, w) for w in ws], apart),
                               ("one_flinear", F.linear, whole),
                               ("one_triton", lambda x, w: gemv_shared(x, w, sizes), whole)):
        row[f"{name}_us"] = _run(name, lambda call=call, shapes=shapes: _cold_us(call, shapes, repeats)[0])
        torch.cuda.empty_cache()
    row["one_triton_rel_err"] = _run("one_triton", lambda: _rel_err(k, sum(sizes), 1, None))
    return row


def _us(run) -> float | None:
    """A time in µs from a row's run: a number, a run's dict with ``us``, or None (an error, no run)."""
    if isinstance(run, dict):
        return run.get("us")
    return run if isinstance(run, float) else None


def decode_sums(flinear: list[dict], shapes: list[dict], groups: list[dict], copy_gbs: float) -> dict:
    """One decode step's GEMVs, one after another (no boundary or other op counted): ``F.linear``,
    the Triton GEMV with the table's configurations, with each shape's best candidate, and with the
    table's and each shared-input group as one launch. Each as ms, weight bytes over that time, and
    its share of the copy bandwidth; None where a part did not run."""
    weight = sum(r["weight_bytes"] * r["count"] for r in flinear)
    table = {(r["in"], r["out"]): _us(r["table"]) for r in shapes}
    shared = [(_us(r["table"]), r["count"]) for r in shapes]
    for g in groups:  # the group's launch in, its members' separate launches out
        shared.append((_us(g["one_triton_us"]), g["count"]))
        shared += [(None if table.get((g["in"], n)) is None else -table[(g["in"], n)], g["count"]) for n in g["sizes"]]
    out = {}
    for name, parts in (("flinear", [(r["us"], r["count"]) for r in flinear]),
                        ("triton_table", [(_us(r["table"]), r["count"]) for r in shapes]),
                        ("triton_best", [(_us(r["best"]), r["count"]) for r in shapes]),
                        ("triton_table_shared", shared)):
        if any(u is None for u, _ in parts):
            out[name] = None
            continue
        ms = sum(u * c for u, c in parts) / 1e3
        out[name] = {"ms": ms, "gbs": weight / ms / 1e6, "of_copy": weight / ms / 1e6 / copy_gbs}
    return {"weight_bytes": weight, **out}


def triton_section(shapes: Counter, groups: Counter, flinear: list[dict], repeats: int, copy_gbs: float) -> dict:
    """The ``triton`` part: every decode shape (:func:`triton_shape`), every shared-input group
    (:func:`triton_group`), the step's sums (:func:`decode_sums`) and the largest error seen."""
    from lfm2vl_lab.kernels.gemv import triton_available

    if not triton_available():
        return {"available": False, "error": "Triton is not importable here"}
    start = time.perf_counter()
    rows = [triton_shape(k, n, c, repeats, copy_gbs) for (k, n), c in sorted(shapes.items())]
    grps = [triton_group(label, k, sizes, c, repeats) for (label, k, sizes), c in sorted(groups.items())]
    import triton

    return {"available": True, "triton": triton.__version__, "shapes": rows, "groups": grps,
            "decode": decode_sums(flinear, rows, grps, copy_gbs), **checks(rows, grps),
            "seconds": time.perf_counter() - start}


def checks(rows: list[dict], groups: list[dict]) -> dict:
    """The correctness verdict: every candidate that ran, the table's pick at :data:`CHECK_ROWS` rows
    and each group's launch within :data:`REL_LIMIT` of fp32; the table's pick, the rows check and
    the groups' launches must have run (a candidate that did not compile is only reported)."""
    errs = [r["rel_err"] for row in rows for r in row["candidates"] if "rel_err" in r]
    must = [row["table"].get("rel_err") for row in rows] + [row[f"rel_err_{CHECK_ROWS}_rows"] for row in rows]
    must += [g["one_triton_rel_err"] for g in groups]
    errs += must
    numbers = [e for e in errs if isinstance(e, float)]
    nan = any(e != e for e in numbers)
    return {"rel_limit": REL_LIMIT, "checks": len(numbers), "not_run": sum(not isinstance(e, float) for e in must),
            "max_rel_err": float("nan") if nan else max(numbers, default=None),
            "rel_ok": bool(numbers) and not nan and all(e <= REL_LIMIT for e in numbers)
            and all(isinstance(e, float) for e in must)}


# --- the norm part: the RMSNorm before a linear group, a kernel of its own or taken into the GEMV ---


def norm_groups(preset: str) -> Counter:
    """``{(label, in_features, (out_features, ...)): count}`` of the linear groups whose input is an
    RMSNorm's output in the preset's text model, read off transformers' LFM2: each decoder layer's
    ``operator_norm`` feeds its attention's q/k/v or its conv's in_proj, its ``ffn_norm`` the MLP's w1/w3."""
    out = Counter()
    for layer in _text_model(preset).model.layers:
        first = (("q/k/v", layer.self_attn, ("q_proj", "k_proj", "v_proj")) if layer.is_attention_layer
                 else ("in_proj", layer.conv, ("in_proj",)))
        for label, module, names in (first, ("w1/w3", layer.feed_forward, ("w1", "w3"))):
            linears = [getattr(module, name) for name in names]
            out[(label, linears[0].in_features, tuple(m.out_features for m in linears))] += 1
    return out


def norm_eps(preset: str) -> float:
    return float(_text_model(preset).config.norm_eps)


@functools.cache
def _compiled_rmsnorm():
    """transformers' Lfm2RMSNorm (``kernels.gemv.torch_rmsnorm``) through torch.compile: one inductor
    kernel, as the compiled engine runs it before each normed group (there with the residual add in it)."""
    from lfm2vl_lab.kernels.gemv import torch_rmsnorm

    return torch.compile(torch_rmsnorm, fullgraph=True, dynamic=False)


def _norm_rel_err(k: int, sizes: tuple, m: int, eps: float) -> float:
    """``gemv_rmsnorm_shared`` of an [m, k] block against an all-fp32 norm and linear: the larger
    :func:`rel_error` of an eager call and of a graph replayed three times."""
    from lfm2vl_lab.kernels.gemv import gemv_rmsnorm_shared

    x = 3 * torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    nw = (1 + 0.3 * torch.randn(k, device="cuda")).bfloat16()
    w = torch.randn(sum(sizes), k, dtype=torch.bfloat16, device="cuda")
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * nw.float()
    ref = torch.nn.functional.linear(h, w.float())
    return _eager_and_replayed(lambda: torch.cat(gemv_rmsnorm_shared(x, nw, eps, w, sizes), -1), ref)


def norm_group(label: str, k: int, sizes: tuple, count: int, eps: float, repeats: int) -> dict:
    """One normed group, L2-cold (:func:`_cold_us`): the compiled RMSNorm, then the Triton GEMV over the
    group's concatenated weight (two kernels), against ``gemv_rmsnorm_shared`` (one); and the fused
    kernel's error against fp32 at 1 and :data:`CHECK_ROWS` rows."""
    from lfm2vl_lab.kernels.gemv import gemv_rmsnorm_shared, gemv_shared

    nw = torch.ones(k, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    norm = _compiled_rmsnorm()
    norm(torch.ones(1, k, dtype=nw.dtype, device=nw.device), nw, eps)  # compiled here, not in a timing
    row = {"label": label, "in": k, "sizes": list(sizes), "count": count}
    for name, call in (("norm_then_gemv", lambda x, w: gemv_shared(norm(x, nw.to(x.device), eps), w, sizes)),
                       ("fused", lambda x, w: gemv_rmsnorm_shared(x, nw.to(x.device), eps, w, sizes))):
        row[f"{name}_us"] = _run(name, lambda call=call: _cold_us(call, [(sum(sizes), k)], repeats)[0])
        torch.cuda.empty_cache()
    a, b = _us(row["norm_then_gemv_us"]), _us(row["fused_us"])
    row["saving_us"] = None if a is None or b is None else a - b
    for m in (1, CHECK_ROWS):
        row[f"rel_err_{m}_rows"] = _run(f"{m} rows", lambda m=m: _norm_rel_err(k, sizes, m, eps))
    return row


def norm_section(groups: Counter, eps: float, repeats: int) -> dict:
    """The ``norm`` part: each normed group (:func:`norm_group`), the step's sums (each group times its
    count) and the check (every fused run within :data:`REL_LIMIT` of fp32, none left unrun)."""
    from lfm2vl_lab.kernels.gemv import triton_available

    if not triton_available():
        return {"available": False, "error": "Triton is not importable here"}
    start = time.perf_counter()
    rows = [norm_group(label, k, sizes, c, eps, repeats) for (label, k, sizes), c in sorted(groups.items())]
    step = {}
    for name in ("norm_then_gemv", "fused", "saving"):
        parts = [(_us(r[f"{name}_us"]), r["count"]) for r in rows]
        step[f"{name}_ms"] = None if any(u is None for u, _ in parts) else sum(u * c for u, c in parts) / 1e3
    errs = [r[f"rel_err_{m}_rows"] for r in rows for m in (1, CHECK_ROWS)]
    numbers = [e for e in errs if isinstance(e, float)]
    nan = any(e != e for e in numbers)
    return {"available": True, "eps": eps, "groups": rows, "step": step, "launches_fewer": sum(groups.values()),
            "rel_limit": REL_LIMIT, "checks": len(numbers), "not_run": len(errs) - len(numbers),
            "max_rel_err": float("nan") if nan else max(numbers, default=None),
            "rel_ok": len(numbers) == len(errs) > 0 and not nan and all(e <= REL_LIMIT for e in numbers),
            "seconds": time.perf_counter() - start}


def _error(run) -> str:
    return run.get("error", "?") if isinstance(run, dict) else str(run)


def norm_lines(t: dict) -> list[str]:
    """The ``norm`` part's lines: per group, the two ways and the saving per call and per step; the step's
    sums; the check (``FAILED`` where a fused run is off, NaN, or did not run)."""
    if not t.get("available"):
        return [f"rmsnorm + GEMV: not run ({t.get('error')})"]
    out = [f"rmsnorm + GEMV, L2-cold, graphed (eps {t['eps']:g}): compiled RMSNorm then the Triton GEMV "
           "(two kernels) | the norm inside the GEMV (gemv_rmsnorm, one kernel):"]
    for r in t["groups"]:
        a, b, s = _us(r["norm_then_gemv_us"]), _us(r["fused_us"]), r["saving_us"]
        out.append(f"  {r['label']} {r['in']} x {'+'.join(map(str, r['sizes']))} x{r['count']}: "
                   + (f"failed ({_error(r['norm_then_gemv_us'] if a is None else r['fused_us'])})" if s is None else
                      f"{a:.2f} us | {b:.2f} us, saves {s:.2f} us per call, {s * r['count']:.1f} us per step"))
    st = t["step"]
    out.append("  per decode step: " + ("incomplete" if st["saving_ms"] is None else
               f"{st['norm_then_gemv_ms']:.3f} ms -> {st['fused_ms']:.3f} ms, saves {st['saving_ms']:.3f} ms "
               f"({t['launches_fewer']} kernels fewer; the engine's norm kernels also add the residual, which "
               "would have to move elsewhere)"))
    worst = "none" if t["max_rel_err"] is None else f"{t['max_rel_err']:.2e}"
    out.append(f"  check of the fused kernel against fp32: max rel error {worst} over {t['checks']} runs, "
               f"{t['not_run']} not run (limit {t['rel_limit']:.0e}): {'ok' if t['rel_ok'] else 'FAILED'}; "
               f"section {t['seconds']:.1f} s")
    return out


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
    out += triton_lines(res["triton"], res["gemv"]) if "triton" in res else []
    return out + (norm_lines(res["norm"]) if "norm" in res else [])


def _cfg(run) -> str:
    c = run["config"]
    return f"{c[0]}x{c[1]} split {c[2]} w{c[3]} s{c[4]}"


def _time(run) -> str:
    """``µs GB/s share`` of one run, or its error."""
    if not isinstance(run, dict) or "us" not in run:
        return f"failed ({run.get('error', '?') if isinstance(run, dict) else run})"
    return f"{run['us']:7.2f} us {run['gbs']:6.0f} GB/s {100 * run['of_copy']:5.1f}%"


def triton_lines(t: dict, flinear: list[dict]) -> list[str]:
    """The ``triton`` part's lines: each shape's F.linear against the Triton GEMV (the table's pick and
    the best candidate), each shared-input group, the step's sums and the correctness check."""
    if not t.get("available"):
        return [f"triton: not run ({t.get('error')})"]
    fl = {(r["in"], r["out"]): r for r in flinear}
    out = [f"triton {t['triton']} GEMV, L2-cold like F.linear (us, GB/s, share of the copy bandwidth):"]
    for r in t["shapes"]:
        f = fl[(r["in"], r["out"])]
        best = r["best"]
        out.append(f"  {r['in']:>5} x {r['out']:<6} x{r['count']:<3} F.linear {_time(f)} | triton "
                   f"{_time(r['table'])} ({_cfg(r['table'])})" + (
                       f" | best {best['us']:7.2f} us ({_cfg(best)})" if best else " | no candidate within the limit"))
    for g in t["groups"]:
        parts = ", ".join(f"{name} {_us(g[f'{name}_us']):.2f} us" if _us(g[f"{name}_us"]) is not None else
                          f"{name} failed" for name in ("separate_flinear", "separate_triton", "one_flinear",
                                                        "one_triton"))
        out.append(f"  {g['label']} {g['in']} x {'+'.join(map(str, g['sizes']))} x{g['count']}: {parts}")
    d = t["decode"]
    for name, what in (("flinear", "F.linear"), ("triton_table", "triton, table"),
                       ("triton_best", "triton, best per shape"), ("triton_table_shared", "triton, table, "
                                                                   "shared-input groups as one launch")):
        v = d[name]
        out.append(f"  decode GEMVs ({what}): " + ("incomplete" if v is None else
                   f"{v['ms']:.3f} ms, {v['gbs']:.0f} GB/s, {100 * v['of_copy']:.1f}% of copy"))
    worst = "none" if t["max_rel_err"] is None else f"{t['max_rel_err']:.2e}"
    out.append(f"  check against fp32 F.linear: max rel error {worst} over {t['checks']} runs, {t['not_run']} "
               f"required not run (limit {t['rel_limit']:.0e}): {'ok' if t['rel_ok'] else 'FAILED'}; "
               f"section {t['seconds']:.1f} s")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lfm2-vl-450m")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--out", default=None, help="results root (default: data/results)")
    p.add_argument("--no-triton", action="store_true", help="leave out the Triton GEMV part (kernels/gemv.py)")
    p.add_argument("--no-norm", action="store_true", help="leave out the RMSNorm + GEMV part (gemv_rmsnorm)")
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
    if not args.no_triton:
        res["triton"] = triton_section(shapes, shared_groups(args.preset), res["gemv"], args.repeats,
                                       res["bandwidth"]["copy_gbs"])
    if not args.no_norm:
        res["norm"] = norm_section(norm_groups(args.preset), norm_eps(args.preset), args.repeats)
    res["provenance"] = provenance(device="cuda", preset=args.preset, dtype="bfloat16")
    print("\n".join(lines(res)))
    print(f"results: {save_result(res, root=args.out or RESULTS_ROOT, name='boundary')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
