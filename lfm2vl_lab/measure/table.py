"""Derived columns and the terminal table of a benchmark result."""

from __future__ import annotations

from .modes import COMPILED_MODES, GRAPH_MODES

HEAD = ["median ms", "p90 ms", "p99 ms", "speedup", "busy ms", "% floor", "kernels", "hit %", "err vs hf"]


def add_derived(rows: list[dict]) -> list[dict]:
    """``speedup_vs_hf`` (hf-eager median of the same preset/workload/device/dtype ÷ this median)
    and ``pct_of_floor`` (100 · median ÷ GPU-busy, where profiled). Modifies and returns ``rows``."""
    def key(r):
        return r.get("preset"), r.get("workload"), r.get("device"), r.get("dtype")

    hf = {key(r): r["median_ms"] for r in rows if r.get("mode") == "hf-eager" and r.get("median_ms")}
    for r in rows:
        base, med, busy = hf.get(key(r)), r.get("median_ms"), r.get("gpu_busy_ms")
        r["speedup_vs_hf"] = base / med if base and med else None
        r["pct_of_floor"] = 100.0 * med / busy if med and busy else None
    return rows


def _fmt(v, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def graph_config_label(row: dict) -> str:
    """A graph mode row's configuration: ``[graph_config:]budget_set/cu_rule/max_seqlen_mode[/dense]``."""
    if row.get("mode") not in GRAPH_MODES:
        return ""
    named = f"{row['graph_config']}:" if row.get("graph_config") else ""
    label = f"{named}{row.get('budget_set', '')}/{row.get('cu_rule', '')}/{row.get('max_seqlen_mode', '')}"
    return label + ("/dense" if row.get("dense_graphs") else "/single-item" if row.get("single_item_graphs") else "")


def is_cpu_row(row: dict) -> bool:
    """Whether a result row was timed on a CPU (its ``device`` is ``cpu``)."""
    return str(row.get("device", "")).startswith("cpu")


def cpu_note(rows: list[dict]) -> str | None:
    """The lines a table with CPU rows opens with: what CPU timings are, and what they are not."""
    cpu = [r for r in rows if is_cpu_row(r)]
    if not cpu:
        return None
    presets = ", ".join(dict.fromkeys(str(r.get("preset", "?")) for r in cpu))
    return (f"CPU timings do not measure LFM2-VL: these rows (preset {presets}) show that the modes run and agree "
            "with transformers (err vs hf),\nnot what CUDA graphs save on a GPU (the H200's numbers: docs/results.md). "
            "No speedup for CPU rows.")


def _cells(r: dict, sweep: bool, speedup: bool) -> list[str]:
    hit = r.get("hit_rate")
    # A row whose output could not be compared with transformers' is an error, never "not measured".
    err = "ERROR" if r.get("error") else _fmt(r.get("max_rel_err_vs_hf"), ".1e")
    ratio = [_fmt(None if is_cpu_row(r) else r.get("speedup_vs_hf"), ".2f", "x")] if speedup else []
    return [r.get("mode", "?"), r.get("workload", "?"), _fmt(r.get("n_items"), "d")] + \
        ([graph_config_label(r)] if sweep else []) + [
        _fmt(r.get("median_ms"), ".3f"), _fmt(r.get("p90_ms"), ".3f"), _fmt(r.get("p99_ms"), ".3f")] + ratio + [
        _fmt(r.get("gpu_busy_ms"), ".3f"), _fmt(r.get("pct_of_floor"), ".0f", "%"), _fmt(r.get("kernels"), ".0f"),
        _fmt(None if hit is None else 100 * hit, ".0f"), err]


def _aligned(head: list[str], lines: list[list[str]], n_left: int) -> list[str]:
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(head)]

    def fmt(cells):
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < n_left else c.rjust(w) for i, (c, w) in pairs)

    return [fmt(head), fmt(["-" * w for w in widths])] + [fmt(line) for line in lines]


def short_error(error) -> str:
    """The first line of a recorded error message, at most 200 characters (the table's form)."""
    first = (str(error).strip().splitlines() or [""])[0]
    return first if len(first) <= 200 else first[:197] + "..."


def _notes(res: dict, rows: list[dict]) -> list[str]:
    out = [f"skipped {s['mode']} (not run, no row): {s['reason']}" for s in res.get("skipped", [])]
    out += [f"ERROR {e.get('mode')} {e.get('workload', '')} ({e.get('stage')}): {short_error(e.get('error'))}"
            for e in res.get("errors", [])]
    seen = set()
    for r in rows:
        if r.get("capture_s") is not None and (r["mode"], r.get("graph_config"), r.get("budget_set")) not in seen:
            seen.add((r["mode"], r.get("graph_config"), r.get("budget_set")))
            extra = f", compile+capture {r['compile_s']:.1f} s, fullgraph={r.get('fullgraph')}" \
                if r.get("compile_s") is not None else ""
            out.append(f"{r['mode']} [{r.get('budget_set')}]: {len(r.get('capture_info', []))} graphs captured in "
                       f"{r['capture_s']:.2f} s, {graph_memory_label(r)}{extra}")
        if r.get("mode") in COMPILED_MODES and r.get("compile_first_call_s") is not None:
            dyn = r.get("dynamo", {})
            out.append(f"{r['mode']} [{r['workload']}]: first call {r['compile_first_call_s']:.1f} s, "
                       f"{dyn.get('stats.unique_graphs', 0)} graphs compiled, "
                       f"{dyn.get('graph_break.total', 0)} graph breaks, "
                       f"{dyn.get('inductor.cudagraph_skips', 0)} cudagraph skips")
    return out


def format_table(result_or_rows) -> str:
    """Rows as an aligned text table: latency, speedup vs hf-eager, GPU-busy, % of floor and the
    error against transformers' output; then skipped modes, errors (short form) and one-off costs.

    CPU rows get no speedup (a table of CPU rows only, no speedup column) and the table opens with
    :func:`cpu_note`: a CPU timing of a small preset says nothing about what CUDA graphs save on a GPU."""
    res = result_or_rows if isinstance(result_or_rows, dict) else {"rows": result_or_rows}
    rows = res.get("rows", [])
    sweep = any(r.get("mode") in GRAPH_MODES for r in rows)
    speedup = not rows or not all(is_cpu_row(r) for r in rows)
    cols = [h for h in HEAD if speedup or h != "speedup"]
    head = ["mode", "workload", "items"] + (["graphs"] if sweep else []) + cols
    lines = _aligned(head, [_cells(r, sweep, speedup) for r in rows], 3 + sweep) if rows else \
        ["no rows: nothing was measured" + (" (every mode asked for was skipped)" if res.get("skipped") else "")]
    note = cpu_note(rows)
    return "\n".join(([note] if note else []) + lines + _notes(res, rows))


def graph_memory_label(row: dict) -> str:
    """What a graph mode's captures hold, from a result row: the pool plus the persistent buffers.
    Rows recorded before that split (one reserved-memory delta, which could go negative) say so."""
    if row.get("graph_total_mb") is not None:
        return (f"{row['graph_total_mb']:.1f} MiB held (graph pool {row['graph_pool_mb']:.1f} + "
                f"buffers {row['graph_buffers_mb']:.1f})")
    return "graph memory not recorded in this row's format"


def print_table(result_or_rows) -> None:
    print(format_table(result_or_rows))
