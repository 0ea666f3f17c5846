"""The parts read off vLLM's own A/B with the kit's pipeline beside it (the ``vllm`` and ``pipeline`` files):
the first token, where it goes, the engines, and ``pr-verdict``, the one verdict on vLLM PR #44930's claim,
which places each cut against the claimed range by its whole 95% interval."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from ..measure.vllm_ab import ARMS, CASES, TOKENS, case_name
from .frames import ms, part, pct, preset_label, span
from .ttft_summary import range_verdict
from .vllm_report import ENGINES, SIZES, ab_frame, one_request, rank, with_pipeline
from .vllm_report import find as _row

ROLE, KIT_ROLE = "vllm", "pipeline"  # the kit's pipeline on the same cases, recorded apart


def vllm_part(body):
    """A part drawn from the vllm file (partial or whole) with the pipeline file's rows beside it, naming both."""
    return part((ROLE, KIT_ROLE), lambda refs: body(with_pipeline(
        refs(ROLE, partial=True), refs(KIT_ROLE) if refs.has(KIT_ROLE) else None)), partial=True, missing=(
        f"_Not in this reference set: `python -m lfm2vl_lab record --part vllm` on the H200 records role `{ROLE}`._"))


def presets(res: dict) -> list[str]:
    """The file's presets, smallest model first."""
    return sorted(res["presets"], key=lambda p: rank(SIZES, p))


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
    """A paired cut with its interval, as a saving: ``37.2% (33.0 to 40.1)``."""
    return c and f"{100 * c['cut']:.1f}% ({100 * c['ci'][0]:.1f} to {100 * c['ci'][1]:.1f})"


def first_token(res: dict) -> list:
    """Notebook 07's A/B table (:func:`~.vllm_report.ab_frame`) at its first token: per preset, case and engine,
    each arm's median and the graphed arms' paired cuts; then the rounds each engine ran and what vLLM left out."""
    s = res["settings"]
    counts = sorted({(sec.get("rounds", s["rounds"]), sec.get("kit_repeats", s["kit_repeats"]))
                     for sec in res["presets"].values()})
    skipped = sorted({f"{preset_label(p)} {case}: {why}" for p, sec in res["presets"].items()
                      for case, why in sec.get("skipped", {}).items()})
    return [ab_frame(res).xs(TOKENS[0], level="tokens").filter(like="TTFT").reset_index(),
            f"Requests of {TOKENS[0]} tokens. vLLM {res['provenance'].get('vllm')}, bf16; median of "
            + " or ".join(f"{r} rounds (the kit's pipeline: {k})" for r, k in counts) + "."
            + "".join(f" Left out in vLLM: {s_}." for s_ in skipped) + partial_note(res)]


def breakdown(res) -> list:
    """Where one request's first token goes (one 512 px image), vLLM's parts beside the kit's phases."""
    rows = []
    for preset in presets(res):
        for engine, arm, m in one_request(res, preset):
            ph = m.get("phases_ms", {})
            step = sum(v for k, v in ph.items() if k not in ("processor", "decode"))  # the kit's step
            rows.append([preset_label(preset), f"{ENGINES[engine]}, {arm}", ms(m["ttft_ms"], 1)] + (
                [ms(m["processor_ms"], 1), ms(m["queue_ms"], 2), ms(m["scheduled_to_first_ms"], 1),
                 ms(m["encoder_gpu_ms"], 2), ms(m["rest_ms_composed"], 1)] if engine == "vllm" else
                [ms(ph.get("processor"), 1), None, ms(step, 1), ms(ph.get("encoder"), 2), None]))
    return [pd.DataFrame(rows, dtype=object, columns=[
        "preset", "engine", "TTFT (ms)", "processor", "wait for a step", "step to the first token",
        "encoder (GPU stream)", "frontend and pipe (composed)"]),
        f"Medians, ms, of one 512 px image and {TOKENS[0]} tokens."]


def _capture_mib(cap: dict) -> str | None:
    """The encoder graphs' memory: their pool's segments, else a reserved-bytes growth that saw some."""
    if cap.get("pool_mib") is not None:
        return ms(cap["pool_mib"], 0)
    if cap.get("reserved_mib"):
        return ms(cap["reserved_mib"], 0)
    return "not seen" if cap.get("graphs") else None


def engines(res) -> pd.DataFrame:
    """Per preset and engine: start-up, the encoder graphs (count, capture, memory, hits) and parity."""
    rows = []
    for preset in presets(res):
        sec = res["presets"][preset]
        for arm in ARMS:
            e, par = sec["engines"][arm], sec.get("parity", {}).get(arm, {})
            cap = e.get("encoder_capture") or {}
            stats = next((r.get("graph_stats") for r in reversed(res["rows"]) if r.get("engine") == "vllm"
                          and r["preset"] == preset and r["arm"] == arm and r.get("graph_stats")), None)
            worst = max(par.values(), key=lambda c: c["rel_err_vs_fp32"]) if par else None
            rows.append([preset_label(preset), arm, ms(e["start_s"], 0),
                         ", ".join(map(str, e["worker"].get("budgets", []))) or None, cap.get("graphs") or None,
                         ms(cap.get("capture_s"), 2), _capture_mib(cap),
                         f"{stats['graph_hits']} / {stats['graph_misses']}" if stats else None,
                         (f"{'pass' if all(c['logits_ok'] for c in par.values()) else 'FAIL'}: "
                          f"{worst['rel_err_vs_fp32']:.1e} ({worst['hf_rel_err_vs_fp32']:.1e})") if worst else None,
                         ", ".join(f"{c['as_fp32']}/{len(c['tokens'])}" for c in par.values()) or None])
    return pd.DataFrame(rows, dtype=object, columns=[
        "preset", "engine", "start-up (s)", "encoder budgets", "encoder graphs", "capture (s)", "memory (MiB)",
        "graph hits / misses", "parity: logits vs float32 (transformers bf16)", "tokens on float32's path"])


# The PR's claim

def judged(c: dict) -> str:
    """Where a cut's whole 95% interval stands against the PR's range (``open``: across an edge of it)."""
    verdict = range_verdict(*c["ci"])
    return "open" if verdict == "overlapping" else verdict


VERDICTS = {"within": "within it", "above": "above it", "below": "below it",
            "open": "not settled by this run (the interval reaches across an edge of the range)"}


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


def claim_lines(res: dict) -> list[str]:
    """The PR's claim judged case by case from a ``vllm`` file, one line per engine and measure (notebook 07
    shows them beside the file's cuts)."""
    v = res["provenance"].get("vllm")
    return [f"- **Inside vLLM {v}, whole requests** (PR config, cut against encoder eager): "
            + _verdict(res, "vllm", "e2e_cut", TOKENS) + ".",
            f"- **Inside vLLM {v}, first token**: " + _verdict(res, "vllm", "ttft_cut", TOKENS[:1]) + ".",
            "- **The kit's pipeline, whole requests** (same weights and images): "
            + _verdict(res, "kit", "e2e_cut", TOKENS) + ".",
            "- **The kit's pipeline, first token**: " + _verdict(res, "kit", "ttft_cut", TOKENS[:1]) + "."]


# (label, key, tokens) per measure of the vllm file: whole requests per output length, then the first
# token (timed in the shortest requests)
MEASURES = [(f"whole requests of {t} tokens", "e2e_cut", t) for t in TOKENS] + [("first token", "ttft_cut", TOKENS[0])]


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


def verdict(res) -> list:
    """The verdict, by measure and preset, for vLLM with the PR's config and the kit's pipeline beside it."""
    rows = [[label, preset_label(preset)] + [group_cell([c for *_, c in pr_cuts(res, e, key, [tokens], preset)])
                                             for e in ENGINES]
            for label, key, tokens in MEASURES for preset in presets(res)]
    return [pd.DataFrame(rows, dtype=object, columns=[
        "measure", "preset", f"inside vLLM {res['provenance'].get('vllm')}, PR config",
        "the kit's pipeline, PR config, same weights"]), partial_note(res).strip()]


BLOCKS = {"vllm-ttft": vllm_part(first_token), "vllm-breakdown": vllm_part(breakdown),
          "vllm-engines": vllm_part(engines), "pr-verdict": vllm_part(verdict)}
