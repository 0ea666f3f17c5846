"""The parts read off vLLM's own A/B with the kit's pipeline beside it (the ``vllm`` and ``pipeline`` files):
the first token, the engines, and ``pr-verdict``, the one verdict on vLLM PR #44930's claim, which places
each cut against the claimed range by its whole 95% interval."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from ..measure.vllm_ab import ARMS, CASES, TOKENS, case_name
from .frames import ms, part, pct, preset_label
from .ttft_summary import range_verdict
from .vllm_report import ENGINES, SIZES, ab_frame, rank, with_pipeline
from .vllm_report import find as _row

ROLE, KIT_ROLE = "vllm", "pipeline"  # the kit's pipeline on the same cases, recorded apart


def vllm_part(body):
    """A part drawn from the vllm file with the pipeline file's rows beside it, naming both."""
    return part((ROLE, KIT_ROLE), lambda refs: body(with_pipeline(
        refs(ROLE), refs(KIT_ROLE) if refs.has(KIT_ROLE) else None)), missing=(
        f"_Not in this reference set: `python -m lfm2vl_lab record --part vllm` on the H200 records role `{ROLE}`._"))


def presets(res: dict) -> list[str]:
    """The file's presets, smallest model first."""
    return sorted(res["presets"], key=lambda p: rank(SIZES, p))


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
            + "".join(f" Left out in vLLM: {s_}." for s_ in skipped)]


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

def group_cell(cuts: list[dict]) -> str | None:
    """``**verdict**: lo–hi over n cases (k above, j open, …)`` for one group of cases, each placed by its
    whole 95% interval against the PR's range (open: across an edge of it). The group ``holds`` where some
    lie within or above the range and none below, ``does not hold`` the reverse, is ``mixed`` with both,
    and ``not settled`` where every interval is open; None without cases."""
    if not cuts:
        return None
    counts = Counter(v.replace("overlapping", "open") for v in (range_verdict(*c["ci"]) for c in cuts))
    up, down = counts["within"] + counts["above"] > 0, counts["below"] > 0
    word = "mixed" if up and down else "holds" if up else "does not hold" if down else "not settled"
    how = ", ".join(f"{counts[k]} {k}" for k in ("above", "within", "below", "open") if counts[k])
    lo, hi, n = pct(min(c["cut"] for c in cuts)), pct(max(c["cut"] for c in cuts)), len(cuts)
    return f"**{word}**: {lo}{f'–{hi}' * (lo != hi)} over {n} case{'s' * (n > 1)} ({how})"


# (label, key, tokens) per measure: whole requests per output length, then the first token (of the shortest)
MEASURES = [(f"whole requests of {t} tokens", "e2e_cut", t) for t in TOKENS] + [("first token", "ttft_cut", TOKENS[0])]


def verdict(res) -> list:
    """The verdict, by measure and preset, for vLLM with the PR's config and the kit's pipeline beside it:
    each cell groups the PR config's cuts of that engine over the file's cases."""
    def cuts(engine, key, tokens, preset):
        return [r[key] for c in CASES if (r := _row(res, engine, preset, case_name(*c), tokens, "pr")) and r.get(key)]
    rows = [[label, preset_label(p), *(group_cell(cuts(e, key, tokens, p)) for e in ENGINES)]
            for label, key, tokens in MEASURES for p in presets(res)]
    return [pd.DataFrame(rows, dtype=object, columns=[
        "measure", "preset", f"inside vLLM {res['provenance'].get('vllm')}, PR config",
        "the kit's pipeline, PR config, same weights"])]


BLOCKS = {"vllm-ttft": vllm_part(first_token), "vllm-engines": vllm_part(engines), "pr-verdict": vllm_part(verdict)}
