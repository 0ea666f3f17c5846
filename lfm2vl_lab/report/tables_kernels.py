"""After the graphs, the kernels: the goals the encoder's kernels are held to once its launches are
graphed (``goals-kernels`` on docs/goals.md), judged here from the set's rows, and what the profiled
calls say of their misses (:func:`explain_kernels`). The encoder's first limits stay in
``lfm2vl_lab.measure.floor.TARGETS``; these are the next ones, each stricter than its first."""

from __future__ import annotations

from ..measure.floor import kernel_breakdown
from ..measure.ttft import mode_name
from .frames import Refs, ms
from .plots_ttft import ttft_case
from .tables_encoder import by_mode

PREFIX = "kernels: "  # every goal of this section starts so; explain_kernels explains them all
# (goal, role, workload, field of its graphed row, limit)
KERNEL_GOALS = (
    (f"{PREFIX}450M 1x512 median ms", "bench-450m", "1x512", "median_ms", 0.60),
    (f"{PREFIX}450M 1x512 GPU-busy ms", "bench-450m", "1x512", "gpu_busy_ms", 0.50),
    (f"{PREFIX}450M 16x512 median ms", "bench-450m", "16x512", "median_ms", 6.0),
    (f"{PREFIX}1.6B tiled median ms", "bench-1.6b", "tiled", "median_ms", 13.0),
)
DECODE_MATCH = 1.05  # decode per token inside the TTFT grid within this factor of the engine's own
BOTH = mode_name("graphed", "graphed")


def _grid_and_engine_decode(refs: Refs) -> tuple[float | None, float | None]:
    """450M decode ms per token: one 512 px request of the TTFT grid (both graphed), the fused engine's."""
    grid = ttft_case(refs("ttft")["rows"], "lfm2-vl-450m", "1x512", 1).get(BOTH)
    eng = next((r for r in refs("engine")["rows"] if (r["preset"], r["mode"], r.get("requests"))
                == ("lfm2-vl-450m", "engine-fused", 1) and "error" not in r), None)
    return (grid or {}).get("decode_ms_per_token"), (eng or {}).get("decode_ms_per_token")


def kernel_goals(refs: Refs) -> list[dict]:
    """Each goal of :data:`KERNEL_GOALS`, and decode inside the TTFT grid against the engine's own."""
    out = []
    for name, role, workload, field, limit in KERNEL_GOALS:
        v = (by_mode(refs(role)["rows"]).get(("lab-graph", workload)) or {}).get(field)
        out.append({"target": name, "limit": limit, "value": v, "ok": v is not None and v <= limit, "detail": ""})
    grid, eng = _grid_and_engine_decode(refs)
    ratio = grid / eng if grid and eng else None
    out.append({"target": f"{PREFIX}450M decode per token in the TTFT grid / the engine's", "limit": DECODE_MATCH,
                "value": ratio, "ok": ratio is not None and ratio <= DECODE_MATCH,
                "detail": f"{ms(grid)} against {ms(eng)} ms" if ratio else "not in the set's files"})
    return out


def _classes(row: dict, n: int = 3) -> str:
    parts = kernel_breakdown(row)
    return ", ".join(f"{c} {v['us']:.0f} µs in {v['count']}" for c, v in list(parts.items())[:n])


def explain_kernels(refs: Refs) -> str:
    """What the graphed calls' kernels are (the profiled call of each bench row), and how far the
    GPU-busy goal is from what the kernels other than the GEMMs take."""
    by, by16 = by_mode(refs("bench-450m")["rows"]), by_mode(refs("bench-1.6b")["rows"])
    one, many, tiled = by[("lab-graph", "1x512")], by[("lab-graph", "16x512")], by16[("lab-graph", "tiled")]
    gemm = kernel_breakdown(one).get("GEMM", {}).get("us", 0.0)
    busy = 1000 * one["gpu_busy_ms"]
    busy_limit = next(limit for name, *_, limit in KERNEL_GOALS if name == f"{PREFIX}450M 1x512 GPU-busy ms")
    need, rest = busy - 1000 * busy_limit, busy - gemm
    share = (f"more than all the kernels other than the GEMMs take together ({rest:.0f} µs), so the GEMMs themselves "
             "must get faster" if need > rest else
             f"{need / rest:.0%} of what the kernels other than the GEMMs take together ({rest:.0f} µs)")
    grid, eng = _grid_and_engine_decode(refs)
    out = [f"The graphed 450M call on one 512 px image runs {one['kernels']:.0f} kernels for {busy:.0f} µs of "
           f"GPU-busy time (largest classes: {_classes(one)}); on 16 images {many['kernels']:.0f} kernels for "
           f"{1000 * many['gpu_busy_ms']:.0f} µs ({_classes(many)}); the 1.6B tiled image {tiled['kernels']:.0f} "
           f"kernels for {1000 * tiled['gpu_busy_ms']:.0f} µs ({_classes(tiled)}). The GPU-busy goal asks for "
           f"{need:.0f} µs less at one image: {share}. The wall-time goals add what is not kernel time: "
           f"{1000 * one['median_ms'] - busy:.0f} µs of the {1000 * one['median_ms']:.0f} µs median at one image."]
    if grid and eng:
        out.append(f"Decode per token inside the TTFT grid takes {ms(grid)} ms against the engine's own "
                   f"{ms(eng)} ms: the grid's engine holds the grid's longest prompt, and each decode step's "
                   "attention masks the whole cache.")
    out.append("Not built: an attention kernel without cuDNN's memsets, the norms, biases and GELU folded into "
               "the GEMMs, fewer kernel boundaries per layer, and a decode attention that reads only the positions "
               "in use.")
    return "\n\n".join(out)
