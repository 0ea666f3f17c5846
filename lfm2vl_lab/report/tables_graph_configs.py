"""The generated ``pr-config`` part: the graph config vLLM PR #44930 measured with beside the kit's."""

from __future__ import annotations

import pandas as pd

from ..measure.modes import ROW_NAMES, ROW_SETTINGS
from ..measure.table import short_error
from .frames import Refs, frame, md, ms, need, needs, pct, preset_label, times

ROLE = "pr-config"


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
    """One row per named config of a ``--graph-config`` bench file, then each "pr" median over the kit's."""
    df = need(frame(res), "mode", "graph_config", "median_ms", "padding_waste")
    df = df[(df["mode"] == "lab-graph") & df.graph_config.astype(bool) & df.graph_config.notna()]
    names, ws = list(dict.fromkeys(df.graph_config)), list(dict.fromkeys(df.workload))
    timed = df.dropna(subset=["median_ms"]).drop_duplicates(["graph_config", "workload"], keep="last")
    med = timed.pivot(index="graph_config", columns="workload", values="median_ms").reindex(index=names, columns=ws)
    first = [res["rows"][i] for i in df.drop_duplicates("graph_config").index]  # each config's first row
    out = pd.DataFrame({"graph config": [f"`{n}`" for n in names], "budgets": [_budgets(r) for r in first],
                        "max items": [r.get("max_items") for r in first],  # graphs: one per variant of every budget
                        "graphs": [sum(len(c.get("variants") or ()) for c in r.get("capture_info") or [])
                                   for r in first],
                        "capture s": [ms(r.get("capture_s")) for r in first],
                        "graphs MiB": [ms(r.get("graph_total_mb"), 0) for r in first]}, dtype=object)
    if "stream" in ws:
        out["stream padding waste"] = timed[timed.workload == "stream"].set_index("graph_config").padding_waste.reindex(
            names).map(pct).values
    out[[f"{w} ms" for w in ws]] = med.map(ms).values
    if "kit" in names and "pr" in names:
        out.loc[len(out)] = ["`pr` ÷ `kit`", *[None] * (len(out.columns) - len(ws) - 1),
                             *(med.loc["pr"] / med.loc["kit"]).map(lambda v: times(v, 2))]
    return md(out)


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
            f"{ms(sum(c['capture_s'] for c in cap))} s, {sum(c['total_mb'] for c in cap):.0f} MiB.")


@needs(ROLE, f"This reference set has no `{ROLE}` file: `python -m lfm2vl_lab record` on the GPU records it, and "
       "`python -m lfm2vl_lab report --tables-only` then draws the table here.")
def pr_config_block(refs: Refs, res: dict) -> str:
    """The PR's graph config beside the kit's, with the settings both ran with."""
    prov = res["provenance"]
    same, differ = shared_settings([r for r in res["rows"] if r.get("graph_config")] or [{}])
    note = (f"lab-graph on {preset_label(prov.get('preset', '?'))}, {prov.get('dtype')}: median ms of "
            f"{prov.get('repeats')} timed calls per row, a stream of {prov.get('stream_n')} requests; both ran with "
            + ", ".join(f"{k}={v}" for k, v in same.items())
            + (f" (they differ in {', '.join(differ)})" if differ else "") + ".")
    errors = "\n".join(f"- {e.get('graph_config', e.get('mode'))} {e.get('workload', '')} ({e.get('stage')}): "
                       f"{short_error(e.get('error'))}" for e in res.get("errors") or [])
    other = other_capture(refs, prov.get("preset"))
    return "\n\n".join(filter(None, [note, pr_config_table(res), other, errors and "Errors in the file:\n\n" + errors,
                                     refs.source(ROLE, *(["request-3b"] if other else []))]))


BLOCKS = {"pr-config": pr_config_block}
