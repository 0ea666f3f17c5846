"""The kernel floor: where one call's GPU time goes, and the targets the graphed path
is held to, judged from recorded result files.

* :func:`kernel_breakdown` sorts the kernels of one profiled call (a bench row's ``timeline``) into
  classes (GEMMs, attention, LayerNorm, ...) with their count and µs; :func:`breakdown_figure`
  draws several rows side by side, e.g. the kernel options off and on.
* :func:`speedup_ceiling` splits what a graph can save at one workload into the host side it removes
  and the kernels it runs instead, from two profiled rows.
* :func:`idle_breakdown` splits one profiled call's wall time beyond its kernels into the idle gaps
  between them (those before a class of kernel apart) and the time outside the kernels' span;
  :func:`busy_over_wall` lists the rows whose GPU-busy time exceeds their median
  (:data:`BUSY_OVER_WALL_REASON` says how a row gets there).
* :data:`TARGETS` states each target once; :func:`judge_targets` reads them off a bench of every
  mode (``python -m lfm2vl_lab bench --mode hf-eager,lab-eager,lab-graph,compile --workload
  1x512,1x256,1..16x512,tiled,stream --profile``) and, for the 1.6B targets, a bench of that preset.
  A target that is missed stays a row with ``ok: False``: nothing here loosens one.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from .results import target_row as _row  # one judged target, as every judge writes it
from .trace_analysis import COPY_NAME_PREFIXES, idle_gaps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (class, substrings of kernel names), first match wins; the names are what the H200 profiles show
KERNEL_CLASSES = (
    ("attention", ("flash_fwd", "fmha", "_sdpa_", "attention")),
    ("add+LayerNorm (Triton)", ("add_ln",)),
    ("LayerNorm", ("layer_norm",)),
    ("GELU", ("gelu", "Gelu")),
    ("GEMV", ("gemv_kernel",)),  # the kit's Triton GEMV (kernels/gemv.py), which the fused engine decodes with
    ("GEMM", ("nvjet", "gemm", "Gemm", "cutlass", "xmma", "sm90_")),
    ("residual add", ("CUDAFunctor_add",)),
    ("memset", ("Memset",)),
    ("copies", ("Memcpy", "copy_kernel", "CatArrayBatchedCopy")),
    ("gather", ("gather", "index")),
)


def kernel_class(name: str) -> str:
    """The class of one kernel name (``"other"`` when none matches). GEMMs with the GELU in their
    epilogue (``..._gelubias_...``) count as GEMMs: that GELU costs no kernel of its own."""
    if "gelubias" in name or "gelu_bias" in name:
        return "GEMM"
    for cls, needles in KERNEL_CLASSES:
        if any(n in name for n in needles):
            return cls
    return "other"


def kernel_breakdown(row: dict) -> dict[str, dict]:
    """``{class: {"count", "us"}}`` of the one call a profiled bench row keeps in ``timeline``."""
    gpu = (row.get("timeline") or {}).get("gpu") or []
    if not gpu:
        raise ValueError(f"row {row.get('mode')}/{row.get('workload')} has no profiled timeline (run with --profile)")
    out: dict[str, dict] = {}
    for _start, dur, name in gpu:
        c = out.setdefault(kernel_class(name), {"count": 0, "us": 0.0})
        c["count"] += 1
        c["us"] += dur
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))


def breakdown_figure(rows: dict[str, dict], title: str | None = None) -> Figure:
    """Stacked bars of :func:`kernel_breakdown`, one bar per labelled row (µs of one call)."""
    # imported here: the commands that judge targets with this module never draw, and matplotlib's import
    # builds its font cache on a fresh machine (about 12 s, seen in a record step's profile)
    from matplotlib.figure import Figure

    parts = {label: kernel_breakdown(r) for label, r in rows.items()}
    classes = list(dict.fromkeys(c for p in parts.values() for c in p))
    fig = Figure(figsize=(max(5.5, 1.6 * len(parts) + 3), 4), layout="constrained")
    ax = fig.add_subplot()
    bottom = [0.0] * len(parts)
    for cls in classes:
        vals = [p.get(cls, {}).get("us", 0.0) for p in parts.values()]
        ax.bar(range(len(parts)), vals, 0.6, bottom=bottom, label=cls)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.0f} µs", (i, total), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.08 * max(bottom, default=1.0))  # room for the totals
    ax.set_xticks(range(len(parts)), list(parts), fontsize=8)
    ax.set_ylabel("kernel µs in one call")
    ax.legend(fontsize=7, ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def speedup_ceiling(eager: dict, graphed: dict) -> dict:
    """The most a graph can save at one workload, from two profiled bench rows of it: an eager path's
    (e.g. ``hf-eager``) and the graphed encoder's.

    A graph removes a call's host side (launches, the gaps between kernels, syncs), never its kernels,
    so the graphed call cannot run faster than its own GPU-busy time. The ceiling of the speedup,
    eager median / graphed GPU-busy, is the product of two factors:

    * ``host_factor`` = eager median / eager GPU-busy: how much longer the eager call takes than its
      kernels (1.0 for a call that keeps the GPU busy all the time);
    * ``kernel_factor`` = eager GPU-busy / graphed GPU-busy: what the graphed path's own kernels save.

    Returns those, ``ceiling``, the measured ``speedup`` (eager median / graphed median) and
    ``reached`` (speedup / ceiling: the share of the ceiling the graphed call gets). The GPU-busy
    times come from a separately profiled call, so ``reached`` can land a little above 1.
    """
    for row in (eager, graphed):
        if not row.get("gpu_busy_ms") or not row.get("median_ms"):
            raise ValueError(f"row {row.get('mode')}/{row.get('workload')} lacks median_ms or gpu_busy_ms "
                             "(a bench run with --profile records both)")
    host = eager["median_ms"] / eager["gpu_busy_ms"]
    kernel = eager["gpu_busy_ms"] / graphed["gpu_busy_ms"]
    speedup = eager["median_ms"] / graphed["median_ms"]
    return {"host_factor": host, "kernel_factor": kernel, "ceiling": host * kernel, "speedup": speedup,
            "reached": speedup / (host * kernel)}


BUSY_OVER_WALL_REASON = (
    "GPU-busy comes from one profiled call made after the timed ones, the median from the timed calls; "
    "a single call under the profiler can run slower than their median, so its busy time can exceed it")


def busy_over_wall(rows: list[dict]) -> list[dict]:
    """The rows whose GPU-busy time exceeds their median wall time. Their busy / median share is above
    100 %, which no call can be: :data:`BUSY_OVER_WALL_REASON` says how the two numbers part."""
    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return [r for r in rows if num(r.get("gpu_busy_ms")) and num(r.get("median_ms"))
            and r["gpu_busy_ms"] > r["median_ms"]]


def busy_over_wall_note(rows: list[dict], source: str) -> str:
    """What a table or figure of busy / median shares from ``source`` (a file name) must say about
    :func:`busy_over_wall`: that no row exceeds its median, or which rows do, and why."""
    over = busy_over_wall(rows)
    if not over:
        return f"{source}: no row's GPU-busy time exceeds its median, so every busy share is at most 100%"
    lines = [f"{source}: {len(over)} row(s) with GPU-busy above the median, a share over 100% that says nothing "
             f"about the call ({BUSY_OVER_WALL_REASON}):"]
    for r in over:
        opts = ", ".join(f"{o} {'on' if r[o] else 'off'}" for o in ("fuse_qkv", "fuse_elementwise", "dense_graphs")
                         if r.get(o) is not None)
        lines.append(f"  {r.get('mode')} {r.get('workload')}{' (' + opts + ')' if opts else ''}: "
                     f"busy {r['gpu_busy_ms']:.3f} ms > median {r['median_ms']:.3f} ms")
    return "\n".join(lines)


def idle_breakdown(row: dict, before: str = "attention") -> dict:
    """Where a profiled row's median goes beyond its kernels, from the one call its ``timeline`` keeps.

    Kernels only, as ``gpu_busy_ms`` and the ``gap_*`` fields count them (copies and memsets are idle
    time here). Returns, in µs: ``span_us`` (first kernel's start to last kernel's end), ``busy_us``,
    ``gaps_us`` and ``n_gaps`` (the idle gaps between kernels: span = busy + gaps), ``before_us`` and
    ``n_before`` (the gaps just before a kernel of class ``before``, see :func:`kernel_class`),
    ``other_median_us`` (the median of the other gaps), ``median_us`` (the row's median) and
    ``outside_us`` = median - span: the call's time outside its kernels' span (host work, input and
    output copies, the launch). The median comes from the timed calls and the timeline from a separate
    profiled one, so ``outside_us`` means something only where that call ran like the timed ones (a
    graph replay); a host-bound call under the profiler runs slower and makes it negative."""
    lane = (row.get("timeline") or {}).get("gpu") or []
    events = sorted(tuple(e) for e in lane if not e[2].startswith(COPY_NAME_PREFIXES))
    if not events or not row.get("median_ms"):
        raise ValueError(f"row {row.get('mode')}/{row.get('workload')} has no profiled timeline or median "
                         "(run bench with --profile on a GPU)")
    span = max(s + d for s, d, _ in events) - events[0][0]
    gaps = idle_gaps({"gpu": events})
    at = [g.dur_us for g in gaps if kernel_class(g.after) == before]
    rest = [g.dur_us for g in gaps if kernel_class(g.after) != before]
    gaps_us = sum(g.dur_us for g in gaps)
    median_us = 1000 * row["median_ms"]
    return {"span_us": span, "busy_us": span - gaps_us, "gaps_us": gaps_us, "n_gaps": len(gaps),
            "before_us": sum(at), "n_before": len(at), "other_median_us": statistics.median(rest) if rest else 0.0,
            "median_us": median_us, "outside_us": median_us - span}


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------

FLOOR_WORKLOADS = ("1x512", "1x256", "2x512", "4x512", "8x512", "16x512", "tiled", "stream")
# (workload, ms): lab-graph's median on the 450M preset must be at most this
LATENCY_TARGETS = (("1x512", 0.76), ("1x256", 0.70), ("4x512", 2.3), ("16x512", 8.0), ("tiled", 3.5))
TARGETS = {
    "latency": LATENCY_TARGETS,
    "vs_compile_1x512": 2.0,  # at least this many times faster than compile at 1x512
    "stream_p99_vs_compile": 0.5,  # lab-graph's stream p99 at most this share of compile's
    "busy_ratio_1x512": 1.10,  # 1x512 wall within this factor of its own GPU-busy time
    "capture_s": 3.0,
    "graph_mib": 1024.0,
    "1.6b": (("1x512", 3.0), ("tiled", 15.0)),
}


def _by(rows: list[dict]) -> dict:
    return {(r["mode"], r["workload"]): r for r in rows if r.get("median_ms") is not None}


def _fastest_and_busy(by: dict) -> list[dict]:
    out = []
    for w in FLOOR_WORKLOADS:
        mine, others = by.get(("lab-graph", w)), {m: r for (m, ww), r in by.items() if ww == w and m != "lab-graph"}
        if mine is None:
            out.append(_row(f"fastest mode at {w}", None, None, False, "no lab-graph row"))
            continue
        best = min(others.items(), key=lambda kv: kv[1]["median_ms"], default=(None, None))
        ok = best[1] is None or mine["median_ms"] < best[1]["median_ms"]
        out.append(_row(f"fastest mode at {w}", mine["median_ms"], best[1] and best[1]["median_ms"], ok,
                        f"next: {best[0]}"))
        if w == "stream":  # the bench profiles one call of a fixed workload; a stream has no one call
            continue
        hf = by.get(("hf-eager", w))
        busy, hf_busy = mine.get("gpu_busy_ms"), hf and hf.get("gpu_busy_ms")
        if busy is None or hf_busy is None:
            out.append(_row(f"GPU-busy <= transformers' at {w}", busy, hf_busy, False, "not profiled"))
        else:
            out.append(_row(f"GPU-busy <= transformers' at {w}", busy, hf_busy, busy <= hf_busy))
    return out


def judge_targets(rows: list[dict], rows_16b: list[dict] | None = None) -> list[dict]:
    """Every target of :data:`TARGETS` as ``{"target", "value", "limit", "ok", "detail"}``, from the
    rows of one bench of every mode on the 450M preset (and of one on the 1.6B preset, if given)."""
    by, out = _by(rows), []
    for w, limit in TARGETS["latency"]:
        r = by.get(("lab-graph", w))
        out.append(_row(f"450M {w} median ms", r and r["median_ms"], limit, bool(r) and r["median_ms"] <= limit))
    g, c = by.get(("lab-graph", "1x512")), by.get(("compile", "1x512"))
    if g and c:
        x = c["median_ms"] / g["median_ms"]
        out.append(_row("1x512 speedup over compile", x, TARGETS["vs_compile_1x512"], x >= TARGETS["vs_compile_1x512"]))
    gs, cs = by.get(("lab-graph", "stream")), by.get(("compile", "stream"))
    if gs and cs:
        share = gs["p99_ms"] / cs["p99_ms"]
        out.append(_row("stream p99 / compile's", share, TARGETS["stream_p99_vs_compile"],
                        share <= TARGETS["stream_p99_vs_compile"]))
    if g and g.get("gpu_busy_ms"):
        ratio = g["median_ms"] / g["gpu_busy_ms"]
        limit = TARGETS["busy_ratio_1x512"]
        out.append(_row("1x512 wall / GPU-busy", ratio, limit, ratio <= limit))
    out += _fastest_and_busy(by)
    out += _capture_targets("450M", g)
    if rows_16b:
        by16 = _by(rows_16b)
        for w, limit in TARGETS["1.6b"]:
            r, hf = by16.get(("lab-graph", w)), by16.get(("hf-eager", w))
            out.append(_row(f"1.6B {w} median ms", r and r["median_ms"], limit, bool(r) and r["median_ms"] <= limit,
                            f"transformers: {hf['median_ms']:.2f} ms" if hf else ""))
        out += _capture_targets("1.6B", by16.get(("lab-graph", "1x512")))
    return out


def _capture_targets(label: str, row: dict | None) -> list[dict]:
    if row is None or row.get("capture_s") is None:
        return [_row(f"{label} capture", None, None, False, "no lab-graph row with capture info")]
    mib, secs = row.get("graph_total_mb"), row["capture_s"]
    return [_row(f"{label} capture s", secs, TARGETS["capture_s"], secs <= TARGETS["capture_s"]),
            _row(f"{label} graph MiB", mib, TARGETS["graph_mib"], mib is not None and 0 <= mib <= TARGETS["graph_mib"])]
