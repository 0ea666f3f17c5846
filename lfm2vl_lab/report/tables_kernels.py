"""The goals the encoder's kernels are held to once its launches are graphed (``goals-kernels``), each
stricter than its first limit in ``measure.floor.TARGETS``, judged from the set's rows."""

from __future__ import annotations

from ..measure.floor import kernel_breakdown
from ..measure.ttft import mode_name
from .frames import Refs, facts, ms, table
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


def _grid_and_engine_decode(refs: Refs) -> tuple[float | None, float | None]:
    """450M decode ms per token: one 512 px request of the TTFT grid (both graphed), the fused engine's."""
    grid = ttft_case(refs("ttft")["rows"], "lfm2-vl-450m", "1x512", 1).get(mode_name("graphed", "graphed"))
    eng = next((r for r in refs("engine")["rows"] if (r["preset"], r["mode"], r.get("requests"))
                == ("lfm2-vl-450m", "engine-fused", 1) and "error" not in r), None)
    return (grid or {}).get("decode_ms_per_token"), (eng or {}).get("decode_ms_per_token")


def kernel_goals(refs: Refs) -> list[dict]:
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


def explain_kernels(refs: Refs) -> str:
    """The graphed calls' kernels by class, and how far the GPU-busy goal is from what the non-GEMMs take."""
    by, by16 = by_mode(refs("bench-450m")["rows"]), by_mode(refs("bench-1.6b")["rows"])
    calls = {"450M 1x512": by[("lab-graph", "1x512")], "450M 16x512": by[("lab-graph", "16x512")],
             "1.6B tiled": by16[("lab-graph", "tiled")]}
    rows = [[name, f"{r['kernels']:.0f}", f"{1000 * r['gpu_busy_ms']:.0f}", ", ".join(
        f"{c} {v['us']:.0f} µs in {v['count']}" for c, v in list(kernel_breakdown(r).items())[:3])]
        for name, r in calls.items()]
    one = calls["450M 1x512"]
    busy, limit = 1000 * one["gpu_busy_ms"], next(lim for n, *_, lim in KERNEL_GOALS if "1x512 GPU-busy" in n)
    rest = busy - kernel_breakdown(one).get("GEMM", {}).get("us", 0.0)
    grid, eng = _grid_and_engine_decode(refs)
    return "\n\n".join([table(["graphed call", "kernels", "GPU-busy µs", "largest classes"], rows), facts([
        ["GPU-busy the goal takes off one image's call", f"{busy - 1000 * limit:.0f} µs"],
        ["what the kernels other than the GEMMs take", f"{rest:.0f} µs"],
        ["not kernel time in one image's median", f"{1000 * one['median_ms'] - busy:.0f} of "
         f"{1000 * one['median_ms']:.0f} µs"],
        ["450M decode per token: TTFT grid (longest prompt's cache) / engine", f"{ms(grid)} / {ms(eng)} ms"]],
        "Not built: attention without cuDNN's memsets, norms, biases and GELU folded into the GEMMs, fewer kernel "
        "boundaries per layer, a decode attention that reads only the positions in use.")])
