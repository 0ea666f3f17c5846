"""The one verdict on vLLM PR #44930's claim, "~10-20% lower e2e latency for low batch size"
(:data:`~.ttft_summary.PR_CLAIM`), drawn into docs/goals.md: by measure (whole requests of each output
length, the first token) and preset, where the claim holds and where it does not, inside vLLM itself and
in the kit's pipeline on the same weights (the ``vllm`` file), with the kit's other runs beside them.
Every other page and notebook links to it instead of judging the claim again.

A cut is placed against the range by its whole 95% interval (:func:`~.tables_vllm.judged`); a group of
cases by :func:`group_verdict`. The kit's other runs have no interval, so their cells give medians only
and no verdict.
"""

from __future__ import annotations

from collections import Counter

from ..measure.request import e2e_cuts as request_cuts
from ..measure.vllm_ab import CASES, TOKENS, case_name
from .frames import Refs, needs, pct, preset_label, span, table
from .tables_vllm import ROLE, judged, presets
from .ttft_findings import encoder_cuts
from .ttft_summary import PR_CLAIM, drift_beyond
from .vllm_report import find

REQUEST_ROLE = "request-3b"
ENGINES = (("vllm", "inside vLLM"), ("kit", "the kit's pipeline"))
VERDICT_ORDER = ("holds", "does not hold", "mixed", "not settled")


def measures() -> list[tuple[str, str, int]]:
    """``(label, key, tokens)`` per measure of the ``vllm`` file: whole requests per output length, then
    the first token (timed in the shortest requests)."""
    return ([(f"whole requests of {t} tokens", "e2e_cut", t) for t in TOKENS]
            + [("first token", "ttft_cut", TOKENS[0])])


def group_verdict(cuts: list[dict]) -> str:
    """A group of cases against the PR's range: ``holds`` where some interval lies within or above it and
    none below, ``does not hold`` where some lies below and none within or above, ``mixed`` where both
    happen, ``not settled`` where every interval reaches across an edge of the range."""
    kinds = {judged(c) for c in cuts}
    up, down = bool(kinds & {"within", "above"}), "below" in kinds
    return "mixed" if up and down else "holds" if up else "does not hold" if down else "not settled"


def group_cell(cuts: list[dict]) -> str | None:
    """``**verdict**: lo–hi over n cases (k above, j open, …)`` for one group, None without cases."""
    if not cuts:
        return None
    counts = Counter(judged(c) for c in cuts)
    how = ", ".join(f"{counts[k]} {k}" for k in ("above", "within", "below", "open") if counts[k])
    n = len(cuts)
    return f"**{group_verdict(cuts)}**: {span([c['cut'] for c in cuts], pct)} over {n} case{'s' * (n > 1)} ({how})"


def vllm_groups(res: dict) -> dict[tuple, list[dict]]:
    """``{(measure label, preset, engine): [cut, ...]}``: the PR config's paired cuts with their intervals."""
    out = {}
    for label, key, tokens in measures():
        for preset in presets(res):
            for engine, _ in ENGINES:
                rows = [find(res, engine, preset, case_name(im, n), tokens, "pr") for im, n in CASES]
                out[(label, preset, engine)] = [r[key] for r in rows if r and r.get(key)]
    return out


def other_runs(refs: Refs) -> dict[tuple, str]:
    """``{(measure label, preset): cell}``: the kit's runs without intervals, as median ranges."""
    out = {}
    if refs.has(REQUEST_ROLE):
        res = refs(REQUEST_ROLE)
        tokens = next((r["e2e_tokens"] for r in res["rows"] if "e2e_tokens" in r), None)
        for preset in dict.fromkeys(s["preset"] for s in res.get("setup", [])):
            cuts = [v for im in ("1x512", "tiled") for v in request_cuts(res["rows"], preset, im).values()]
            if cuts:
                out[(f"whole requests of {tokens} tokens", preset)] = (
                    f"{span(cuts, pct)} over {len(cuts)} cases at 1–4 requests (`{REQUEST_ROLE}`)")
    if refs.has("ttft"):
        cuts = encoder_cuts(refs("ttft")["rows"], "graphed")
        for preset in dict.fromkeys(c["case"][0] for c in cuts):
            mine = [c for c in cuts if c["case"][0] == preset]
            kept = [c["cut"] for c in mine if not drift_beyond(c["drift"])]
            off = [c["cut"] for c in mine if drift_beyond(c["drift"])]
            reqs = sorted({c["case"][2] for c in mine})
            cell = f"{span(kept, pct)} over {len(kept)} cases at {reqs[0]}–{reqs[-1]} requests (`ttft`)" if kept else ""
            if off:  # what the decode control leaves out, shown as the kept cases are
                cell += f"; left out for decode drift: {span(off, pct)} over {len(off)} cases"
            out[("first token", preset)] = cell or None
    return out


def summary(groups: dict[tuple, list[dict]], names: dict[str, str]) -> list[str]:
    """One line per verdict: the measures it covers, and under each the engines and their presets."""
    by: dict[str, dict[str, dict[str, list[str]]]] = {v: {} for v in VERDICT_ORDER}
    for (label, preset, engine), cuts in groups.items():
        if cuts:
            by[group_verdict(cuts)].setdefault(label, {}).setdefault(names[engine], []).append(preset_label(preset))
    words = {"holds": "It holds", "does not hold": "It does not hold", "mixed": "Mixed",
             "not settled": "Not settled by this run"}
    order = list(names.values())
    return [f"- **{words[v]}** for " + "; ".join(
        f"{label} ({'; '.join(f'{e}: ' + ', '.join(where[e]) for e in sorted(where, key=order.index))})"
        for label, where in by[v].items()) + "." for v in VERDICT_ORDER if by[v]]


@needs(ROLE, f"_Not in this reference set: `python -m lfm2vl_lab record --part vllm` records role `{ROLE}`, which "
       "the verdict reads._", partial=True)
def verdict_block(refs: Refs, res: dict) -> str:
    """The verdict: a line per outcome, then the table by measure and preset it is read from."""
    version = res["provenance"].get("vllm")
    names = {"vllm": f"inside vLLM {version}", "kit": "the kit's pipeline"}
    groups, others = vllm_groups(res), other_runs(refs)
    rows = [[label, preset_label(preset)] + [group_cell(groups[(label, preset, e)]) for e, _ in ENGINES]
            + [others.get((label, preset))] for label, _, _ in measures() for preset in presets(res)]
    head = ["measure", "preset", f"inside vLLM {version}, PR config", "the kit's pipeline, PR config, same weights",
            "the kit's other runs (medians, no interval)"]
    lo, hi = PR_CLAIM
    rule = (f"The PR claimed {pct(lo, 0)}–{pct(hi, 0)} lower end-to-end latency at low batch size. A case counts as "
            "within, above or below that range only when its whole 95% interval of the paired cut is (open: the "
            "interval reaches across an edge). A group holds where some case lies within or above the range and none "
            "below it, does not hold where some lies below and none within or above, and is not settled where every "
            "interval is open. The first token is not what the PR claimed: it holds the encoder's whole saving in "
            "less time than a whole request, so its cut is the larger one. The kit's other runs are the same "
            "pipeline in separate processes, with more request counts; they record medians only, so they give no "
            "verdict.")
    sources = refs.source(ROLE, *[r for r in (REQUEST_ROLE, "ttft") if refs.has(r)])
    return "\n\n".join(["\n".join(summary(groups, names)), table(head, rows), rule, sources])


BLOCKS = {"pr-verdict": verdict_block}
