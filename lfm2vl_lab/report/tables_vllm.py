"""The parts that read the ``vllm`` file: vLLM's own A/B beside the kit's pipeline (the ``pipeline`` file,
where the set has it), and ``pr-verdict``, the one verdict on the PR's claim, which places a cut against
the range by its whole 95% interval."""

from __future__ import annotations

from collections import Counter
from functools import wraps

import pandas as pd

from ..measure.request import e2e_cuts as request_cuts
from ..measure.vllm_ab import ARMS, CASES, TOKENS, case_name
from .frames import Refs, frame, md, missing, ms, need, needs, pct, preset_label, span, table
from .tables_engine import REQUEST_ROLE
from .ttft_findings import cut_range, e2e_cuts, encoder_cuts
from .ttft_summary import PR_CLAIM, claim_verdict, range_verdict
from .vllm_report import ENGINES, SIZES, one_request, rank, with_pipeline
from .vllm_report import find as _row

ROLE = "vllm"
KIT_ROLE = "pipeline"  # the kit's pipeline on the same cases, recorded apart


def vllm_part(draw):
    """A part drawn from the vllm file, partial or whole, with the pipeline file's rows beside it."""
    @needs(ROLE, f"_Not in this reference set: `python -m lfm2vl_lab record --part vllm` on the H200 records "
           f"role `{ROLE}`._", partial=True)
    @wraps(draw)
    def block(refs: Refs, res: dict) -> str:
        return draw(refs, with_pipeline(res, refs(KIT_ROLE) if refs.has(KIT_ROLE) else None))
    return block


def sources(refs: Refs, *more: str) -> str:
    """The source line of a part: the vllm file, the pipeline file where the set has it, then ``more``."""
    return refs.source(ROLE, *[r for r in (KIT_ROLE, *more) if refs.has(r)])


def partial_note(res: dict) -> str:
    """A sentence for a partial file: what it holds and what is still to record; empty when whole."""
    left = [p for p in str(res["provenance"].get("preset", "")).split(",") if p and p not in res["presets"]]
    if not left:
        return ""
    kit = [preset_label(p) for p in res.get("kit_left_out", [])]
    return (f" **Partial:** this file holds {', '.join(preset_label(p) for p in presets(res))} so far; "
            f"{', '.join(preset_label(p) for p in left)} still to record (`record --part vllm` resumes it)."
            + (f" The kit's pipeline rows of {', '.join(kit)} are in its file, left out here until vLLM's are "
               "recorded." if kit else ""))


def cut(c: dict | None) -> str | None:
    """A paired cut with its interval, as a saving: ``37.2% (33.0–40.1)``."""
    if not c:
        return None
    return f"{100 * c['cut']:.1f}% ({100 * c['ci'][0]:.1f} to {100 * c['ci'][1]:.1f})"


def presets(res: dict) -> list[str]:
    """The file's presets, smallest model first."""
    return sorted(res["presets"], key=lambda p: rank(SIZES, p))


def _table(res: dict, key: str, ms_key: str, tokens_list) -> str:
    """Per preset, case (and tokens): each engine's encoder-eager ``ms_key`` and its graphed arms' ``key`` cuts."""
    df = need(frame(res), "engine", "tokens", ms_key, f"{key}.cut", f"{key}.ci")
    df["cell"] = [ms(v, 1) if arm == "off" else None if missing(c) else cut({"cut": c, "ci": ci})
                  for arm, v, c, ci in zip(df.arm, df[ms_key], df[f"{key}.cut"], df[f"{key}.ci"])]
    index = pd.MultiIndex.from_product([presets(res), [case_name(i, n) for i, n in CASES], list(tokens_list)])
    cells = df.drop_duplicates(["preset", "case", "tokens", "engine", "arm"]).pivot(
        index=["preset", "case", "tokens"], columns=["engine", "arm"], values="cell").reindex(
        index=index, columns=pd.MultiIndex.from_product([("vllm", "kit"), ARMS]))
    out = index.to_frame(index=False, name=["preset", "case", "tokens"]).assign(
        preset=lambda d: d.preset.map(preset_label))
    out[["vLLM, encoder eager (ms)", "vLLM, PR config: cut", "vLLM, kit config: cut",
         "kit's pipeline, encoder eager (ms)", "kit's pipeline, PR config: cut",
         "kit's pipeline, kit config: cut"]] = cells.values
    return md(out if len(tokens_list) > 1 else out.drop(columns="tokens"))


def _settings(res: dict) -> str:
    s = res["settings"]
    counts = sorted({(sec.get("rounds", s["rounds"]), sec.get("kit_repeats", s["kit_repeats"]))
                     for sec in res["presets"].values()})
    skipped = sorted({f"{preset_label(p)} {case}: {why}" for p, sec in res["presets"].items()
                      for case, why in sec.get("skipped", {}).items()})
    return (f"vLLM {res['provenance'].get('vllm')}, bf16; median of "
            + " or ".join(f"{r} rounds (the kit's pipeline: {k})" for r, k in counts) + "."
            + "".join(f" Left out in vLLM: {s_}." for s_ in skipped) + partial_note(res))


@vllm_part
def ttft_block(refs: Refs, res: dict) -> str:
    """TTFT per preset and case: vLLM's and the kit's pipeline's, with the encoder graphs' cuts."""
    return "\n\n".join([_table(res, "ttft_cut", "ttft_ms", TOKENS[:1]),
                        f"Requests of {TOKENS[0]} tokens. " + _settings(res), sources(refs)])


@vllm_part
def requests_block(refs: Refs, res: dict) -> str:
    """Whole requests of 16 and 128 tokens: vLLM's and the kit's pipeline's, with the encoder graphs' cuts."""
    return "\n\n".join([_table(res, "e2e_cut", "e2e_ms", TOKENS), _settings(res), sources(refs)])


VERDICTS = {"within": "within it", "above": "above it", "below": "below it",
            "open": "not settled by this run (the interval reaches across an edge of the range)"}


def judged(c: dict) -> str:
    """Where a cut's whole 95% interval stands against the PR's range (``open``: across an edge of it)."""
    verdict = range_verdict(*c["ci"])
    return "open" if verdict == "overlapping" else verdict


def pr_cuts(res: dict, engine: str, key: str, tokens_list, preset: str | None = None) -> list[tuple]:
    """The PR config's ``key`` cuts of ``engine`` as ``(preset, case, tokens, cut)``, by preset (smallest
    first, or only ``preset``), case and output length, where the file holds one."""
    return [(p, c, t, r[key]) for p in ([preset] if preset else presets(res)) for c in (case_name(*x) for x in CASES)
            for t in tokens_list if (r := _row(res, engine, p, c, t, "pr")) and r.get(key)]


def _verdict(res: dict, engine: str, key: str, tokens_list) -> str:
    """``engine``'s PR-config ``key`` cuts, named, grouped by where each stands against the PR's range."""
    cases, groups = pr_cuts(res, engine, key, tokens_list), {k: [] for k in VERDICTS}
    for p, c, t, x in cases:
        groups[judged(x)].append(f"{preset_label(p)} {c}" + (f" {t} tokens" if key == "e2e_cut" else "") + f" {cut(x)}")
    return "; ".join(f"{VERDICTS[k]} in {len(v)} of {len(cases)}: {', '.join(v)}" for k, v in groups.items() if v)


@vllm_part
def claim_block(refs: Refs, res: dict) -> str:
    """The PR's claim judged from vLLM's own A/B with the PR's graph config, then from the kit's pipeline
    on the same weights and images: each whole-request and TTFT cut set against 10–20%."""
    return "\n".join(claim_lines(res)) + "\n\n" + (partial_note(res).strip() + "\n\n" if partial_note(res) else "") \
        + sources(refs)


def claim_lines(res: dict) -> list[str]:
    """The PR's claim judged from a ``vllm`` file, one line per engine and measure (see :func:`claim_block`)."""
    v = res["provenance"].get("vllm")
    return [f"- **Inside vLLM {v}, whole requests** (PR config, cut against encoder eager): "
             + _verdict(res, "vllm", "e2e_cut", TOKENS) + ".",
             f"- **Inside vLLM {v}, first token**: " + _verdict(res, "vllm", "ttft_cut", TOKENS[:1]) + ".",
             "- **The kit's pipeline, whole requests** (same weights and images): "
             + _verdict(res, "kit", "e2e_cut", TOKENS) + ".",
             "- **The kit's pipeline, first token**: " + _verdict(res, "kit", "ttft_cut", TOKENS[:1]) + "."]


@vllm_part
def breakdown_block(refs: Refs, res: dict) -> str:
    """Where one request's first token goes (one 512 px image), vLLM's parts beside the kit's phases."""
    head = ["preset", "engine", "TTFT (ms)", "processor", "wait for a step", "step to the first token",
            "encoder (GPU stream)", "frontend and pipe (composed)"]
    rows = []
    for preset in presets(res):
        for engine, arm, m in one_request(res, preset):
            ph = m.get("phases_ms", {})
            step = sum(v for k, v in ph.items() if k not in ("processor", "decode"))  # the kit's step
            rows.append([preset_label(preset), f"{ENGINES[engine]}, {arm}", ms(m["ttft_ms"], 1)] + (
                [ms(m["processor_ms"], 1), ms(m["queue_ms"], 2), ms(m["scheduled_to_first_ms"], 1),
                 ms(m["encoder_gpu_ms"], 2), ms(m["rest_ms_composed"], 1)] if engine == "vllm" else
                [ms(ph.get("processor"), 1), None, ms(step, 1), ms(ph.get("encoder"), 2), None]))
    return "\n\n".join([table(head, rows), f"Medians, ms, of one 512 px image and {TOKENS[0]} tokens.",
                        sources(refs)])


def _capture_mib(cap: dict) -> str | None:
    """The encoder graphs' memory: their pool's segments, else a reserved-bytes growth that saw some."""
    if cap.get("pool_mib") is not None:
        return ms(cap["pool_mib"], 0)
    if cap.get("reserved_mib"):
        return ms(cap["reserved_mib"], 0)
    return "not seen" if cap.get("graphs") else None


@vllm_part
def engines_block(refs: Refs, res: dict) -> str:
    """Per preset and engine: start-up, the encoder graphs (count, capture, memory, hits) and parity."""
    head = ["preset", "engine", "start-up (s)", "encoder budgets", "encoder graphs", "capture (s)", "memory (MiB)",
            "graph hits / misses", "parity: logits vs float32 (transformers bf16)", "tokens on float32's path"]
    rows = []
    for preset in presets(res):
        sec = res["presets"][preset]
        for arm in ARMS:
            e = sec["engines"][arm]
            cap = e.get("encoder_capture") or {}
            stats = next((r.get("graph_stats") for r in reversed(res["rows"]) if r.get("engine") == "vllm"
                          and r["preset"] == preset and r["arm"] == arm and r.get("graph_stats")), None)
            par = sec.get("parity", {}).get(arm, {})
            worst = max(par.values(), key=lambda c: c["rel_err_vs_fp32"]) if par else None
            rows.append([preset_label(preset), arm, ms(e["start_s"], 0),
                         ", ".join(map(str, e["worker"].get("budgets", []))) or None, cap.get("graphs") or None,
                         ms(cap.get("capture_s"), 2), _capture_mib(cap),
                         f"{stats['graph_hits']} / {stats['graph_misses']}" if stats else None,
                         (f"{'pass' if all(c['logits_ok'] for c in par.values()) else 'FAIL'}: "
                          f"{worst['rel_err_vs_fp32']:.1e} ({worst['hf_rel_err_vs_fp32']:.1e})") if worst else None,
                         ", ".join(f"{c['as_fp32']}/{len(c['tokens'])}" for c in par.values()) or None])
    seconds = "; ".join(f"{preset_label(p)} {res['presets'][p]['seconds'].get('total', 0):.0f} s ("
                        + ", ".join(f"{k} {v:.0f} s" for k, v in res["presets"][p]["seconds"].items() if k != "total")
                        + ")" for p in presets(res))
    return "\n\n".join([table(head, rows), f"Seconds per preset: {seconds}.", sources(refs)])


# The PR's claim


def _claim_line(what: str, cuts: list[dict]) -> str:
    """``- what: range over n cases, k within the PR's range`` and the cases the decode control left
    out, shown the same way so a reader sees what it removed (:func:`~.ttft_findings.cut_range`)."""
    def part(xs: list[dict]) -> str:
        n, (lo, hi) = len(xs), PR_CLAIM
        return (f"{span([c['cut'] for c in xs], pct)} over {n} case{'s' if n != 1 else ''}" if xs else
                "no undisturbed case") + (f", {sum(claim_verdict(c['cut']) == 'within' for c in xs)} of them within "
                                         f"{pct(lo, 0)}–{pct(hi, 0)}")

    r = cut_range(cuts)
    off = r["left_out"]
    return (f"- {what}: {part(r['kept'])}" + (f"; left out for decode drift: {part(off)} (" + ", ".join(
        f"{preset_label(p)} {im} ×{n}" for p, im, n in (c["case"] for c in off)) + ")" if off else "") + ".")


def pr_claim_block(refs: Refs) -> str:
    """The encoder graphs' TTFT cut beside the PR's claimed range: text graphed (as in vLLM), text eager,
    and inside ``generate``; cases with decode drift are left out of the ranges and named."""
    rows = refs("ttft")["rows"]
    graphed = encoder_cuts(rows, "graphed")
    first = [c for c in graphed if c["case"][1:] == ("1x512", 1)]
    return "\n".join([
        "- Text model graphed, one 512 px request: " + ", ".join(
            f"**{pct(c['cut'])}** on {preset_label(c['case'][0])} ({claim_verdict(c['cut'])} the PR's range)"
            for c in first) + ".",
        _claim_line("Text model graphed, the other cases", [c for c in graphed if c not in first]),
        _claim_line("Text model eager, every case", encoder_cuts(rows, "eager")),
        _claim_line("Inside `generate` (paired)", e2e_cuts(refs("e2e")["rows"]))]) + "\n\n" + refs.source("ttft", "e2e")


# (label, key, tokens) per measure of the vllm file: whole requests per output length, then the first
# token (timed in the shortest requests)
MEASURES = [(f"whole requests of {t} tokens", "e2e_cut", t) for t in TOKENS] + [("first token", "ttft_cut", TOKENS[0])]
VERDICT_WORDS = {"holds": "It holds", "does not hold": "It does not hold", "mixed": "Mixed",
                 "not settled": "Not settled by this run"}  # in the order the summary shows them


def group_verdict(cuts: list[dict]) -> str:
    """A group of cases against the PR's range: ``holds`` (some within or above, none below), ``does not
    hold`` (the reverse), ``mixed``, or ``not settled`` (every interval open)."""
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
    return {(label, preset, engine): [c for *_, c in pr_cuts(res, engine, key, [tokens], preset)]
            for label, key, tokens in MEASURES for preset in presets(res) for engine in ENGINES}


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
            split = cut_range(mine)  # the decode control's kept and left-out cases
            kept, off = [c["cut"] for c in split["kept"]], [c["cut"] for c in split["left_out"]]
            reqs = sorted({c["case"][2] for c in mine})
            cell = f"{span(kept, pct)} over {len(kept)} cases at {reqs[0]}–{reqs[-1]} requests (`ttft`)" if kept else ""
            if off:  # what the decode control leaves out, shown as the kept cases are
                cell += f"; left out for decode drift: {span(off, pct)} over {len(off)} cases"
            out[("first token", preset)] = cell or None
    return out


def summary(groups: dict[tuple, list[dict]], names: dict[str, str]) -> list[str]:
    """One line per verdict: the measures it covers, and under each the engines and their presets."""
    by: dict[str, dict[str, dict[str, list[str]]]] = {v: {} for v in VERDICT_WORDS}
    for (label, preset, engine), cuts in groups.items():
        if cuts:
            by[group_verdict(cuts)].setdefault(label, {}).setdefault(names[engine], []).append(preset_label(preset))
    order = list(names.values())
    return [f"- **{VERDICT_WORDS[v]}** for " + "; ".join(
        f"{label} ({'; '.join(f'{e}: ' + ', '.join(where[e]) for e in sorted(where, key=order.index))})"
        for label, where in by[v].items()) + "." for v in VERDICT_WORDS if by[v]]


@needs(ROLE, f"_Not in this reference set: `python -m lfm2vl_lab record --part vllm` records role `{ROLE}`, which "
       "the verdict reads._", partial=True)
def verdict_block(refs: Refs, vllm_res: dict) -> str:
    """The verdict: a line per outcome, then the table by measure and preset it is read from."""
    res = with_pipeline(vllm_res, refs(KIT_ROLE) if refs.has(KIT_ROLE) else None)
    version = res["provenance"].get("vllm")
    names = {"vllm": f"inside vLLM {version}", "kit": "the kit's pipeline"}
    groups, others = vllm_groups(res), other_runs(refs)
    rows = [[label, preset_label(preset)] + [group_cell(groups[(label, preset, e)]) for e in ENGINES]
            + [others.get((label, preset))] for label, _, _ in MEASURES for preset in presets(res)]
    head = ["measure", "preset", f"inside vLLM {version}, PR config", "the kit's pipeline, PR config, same weights",
            "the kit's other runs (medians, no interval)"]
    rule = f"The PR claimed {pct(PR_CLAIM[0], 0)}–{pct(PR_CLAIM[1], 0)} lower end-to-end latency at low batch size."
    return "\n\n".join(["\n".join(summary(groups, names)), table(head, rows), rule,
                        sources(refs, REQUEST_ROLE, "ttft")])


BLOCKS = {"vllm-ttft": ttft_block, "vllm-requests": requests_block, "vllm-claim": claim_block,
          "vllm-breakdown": breakdown_block, "vllm-engines": engines_block, "pr-claim": pr_claim_block,
          "pr-verdict": verdict_block}
