"""Generated part about the named graph configs (:mod:`lfm2vl_lab.report.tables` draws it into the
pages): the graph config vLLM PR #44930 measured with (``GraphOptions.named("pr")``) beside the kit's,
from the reference set's ``pr-config`` file (``bench --mode lab-graph --graph-config kit,pr``)."""

from __future__ import annotations

from ..measure.modes import ROW_NAMES, ROW_SETTINGS
from ..measure.table import short_error
from .frames import Refs, ms, needs, pct, preset_label, table, times, workloads_of

ROLE = "pr-config"


def _graphs(row: dict) -> int:
    """Graphs captured: one per variant of every budget (the capture rows' ``variants``)."""
    return sum(len(c.get("variants") or ()) for c in row.get("capture_info") or [])


def _budgets(row: dict) -> str:
    """The config's budgets, then any budget it captured beyond them (the run budget of :mod:`~..core.dense`)."""
    own = list(row.get("budgets") or [])
    extra = [c["budget"] for c in row.get("capture_info") or [] if c.get("budget") not in own]
    return ", ".join(map(str, own)) + "".join(f" + {b} (runs)" for b in sorted(extra))


def shared_settings(rows: list[dict]) -> tuple[dict, list[str]]:
    """The row-named settings (``cu_rule``, ``attention``, ...; not the budget set) every config's
    rows share, and those that differ between configs."""
    keys = [ROW_NAMES.get(k, k) for k in ROW_SETTINGS if k != "budgets"]
    same = {k: rows[0].get(k) for k in keys if len({str(r.get(k)) for r in rows}) == 1}
    return same, [k for k in keys if k not in same]


def pr_config_table(res: dict) -> str:
    """One row per named config of a ``--graph-config`` bench file: its resolved budgets and item
    limit, the graphs it captured, capture s, graph MiB, the stream's padding waste and the median ms
    per workload; then, where both ran, each "pr" median over the kit's."""
    rows = [r for r in res["rows"] if r.get("mode") == "lab-graph" and r.get("graph_config")]
    names = list(dict.fromkeys(r["graph_config"] for r in rows))
    ws = workloads_of(rows)
    by = {(r["graph_config"], r["workload"]): r for r in rows if r.get("median_ms") is not None}
    head = ["graph config", "budgets", "max items", "graphs", "capture s", "graphs MiB"] \
        + (["stream padding waste"] if "stream" in ws else []) + [f"{w} ms" for w in ws]
    out = []
    for n in names:
        first = next(r for r in rows if r["graph_config"] == n)
        stream = by.get((n, "stream"))
        out.append([f"`{n}`", _budgets(first), first.get("max_items"),
                    _graphs(first), ms(first.get("capture_s")),
                    None if first.get("graph_total_mb") is None else f"{first['graph_total_mb']:.0f}"]
                   + ([pct(stream.get("padding_waste")) if stream else None] if "stream" in ws else [])
                   + [ms(by[n, w]["median_ms"]) if (n, w) in by else None for w in ws])
    if "kit" in names and "pr" in names:
        ratio = [times(by["pr", w]["median_ms"] / by["kit", w]["median_ms"], 2)
                 if ("pr", w) in by and ("kit", w) in by else None for w in ws]
        out.append(["`pr` ÷ `kit`", None, None, None, None, None] + ([None] if "stream" in ws else []) + ratio)
    return table(head, out)


def other_capture(refs: Refs, preset: str | None) -> str:
    """The same PR budget set's capture in the ``request-3b`` run (another process on the same preset),
    labelled with its run, so that the two runs' numbers never stand unexplained on two pages."""
    if "request-3b" not in refs.manifest["files"]:
        return ""
    setup = next((s for s in refs("request-3b").get("setup", []) if s.get("preset") == preset
                  and s.get("graph_config") == "pr" and s.get("encoder_capture")), None)
    if setup is None:
        return ""
    cap = setup["encoder_capture"]
    return (f"The same `pr` budget set captured again in the whole-request run (`request-3b`, another process): "
            f"{ms(sum(c['capture_s'] for c in cap))} s, {sum(c['total_mb'] for c in cap):.0f} MiB. Capture time and "
            "graph memory move between processes; the capture goal on docs/goals.md is judged from the "
            "`request-3b` run.")


@needs(ROLE, f"This reference set has no `{ROLE}` file: `python -m lfm2vl_lab record` on the GPU records it, and "
       "`python -m lfm2vl_lab report --tables-only` then draws the table here.")
def pr_config_block(refs: Refs, res: dict) -> str:
    """The PR's graph config beside the kit's; while the reference set has no ``pr-config`` file, a
    sentence saying so (the page still builds and stays equal to what the generator writes)."""
    prov = res["provenance"]
    same, differ = shared_settings([r for r in res["rows"] if r.get("graph_config")] or [{}])
    note = (f"lab-graph on {preset_label(prov.get('preset', '?'))}, {prov.get('dtype')}, random weights: median ms "
            f"of {prov.get('repeats')} timed calls per row; the stream ({prov.get('stream_n')} requests) times each "
            "request once. `kit` is `GraphOptions()`, `pr` is `GraphOptions.named(\"pr\")`; both ran with "
            + ", ".join(f"{k}={v}" for k, v in same.items())
            + (f" (they differ in {', '.join(differ)})" if differ else "")
            + ". Graph memory is the pool's growth during capture plus the persistent buffers; graphs counts every "
            "variant of every budget.")
    errors = [f"- {e.get('graph_config', e.get('mode'))} {e.get('workload', '')} ({e.get('stage')}): "
              f"{short_error(e.get('error'))}" for e in res.get("errors") or []]
    other = other_capture(refs, prov.get("preset"))
    parts = [note, pr_config_table(res)] + ([other] if other else []) \
        + (["Errors in the file:\n\n" + "\n".join(errors)] if errors else [])
    return "\n\n".join(parts + [refs.source(ROLE, *(["request-3b"] if other else []))])


BLOCKS = {"pr-config": pr_config_block}
