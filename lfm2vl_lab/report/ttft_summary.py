"""A recorded TTFT result (``ttft``, ``e2e``) as the text notebook 07 prints beside its figures, and
the decode control (:func:`drift_fails`). A section the file lacks gives a ``not recorded`` line,
never an error, so the same cells read a small first run and the full grid."""

from __future__ import annotations

from ..measure.e2e import DECODE_DRIFT_WARN, paired_reduction
from ..measure.ttft import mode_name
from .plots_ttft import TTFT_MODES, TTFT_PHASES, ttft_case, ttft_rows

PR_CLAIM = (0.10, 0.20)  # vLLM PR #44930: "~10-20% lower e2e latency for low batch size" (text model graphed)
# The phases before the text model, the ones the encoder mode can change (h2d too: the graphed encoder
# moves only the real rows, in the model's dtype: VlmPipeline.to_device); Amdahl's law takes the rest as fixed.
BEFORE_TEXT = TTFT_PHASES[:TTFT_PHASES.index("prefill")]


def ttft_cases(rows: list[dict]) -> list[tuple]:
    """The ``(preset, image, requests)`` cases of a TTFT grid's rows, in the order they were recorded."""
    return list(dict.fromkeys((r["preset"], r["image"], r["requests"]) for r in ttft_rows(rows)))


def _not_recorded(what: str) -> str:
    return f"not recorded: this file has no {what}"


def _short(mode: str) -> str:
    """``text-graphed+encoder-eager`` -> ``T:graphed E:eager``."""
    text, enc = mode.removeprefix("text-").split("+encoder-")
    return f"T:{text} E:{enc}"


def decode_text(rows: list[dict]) -> str:
    """Decode ms per token per mode and case, and at each text mode the drift between the two encoder
    modes (decode never runs the encoder, so a large drift means that row's timing was disturbed)."""
    cases = ttft_cases(rows)
    if not any(r.get("decode_ms_per_token") is not None for r in ttft_rows(rows)):
        return _not_recorded("TTFT rows with decode_ms_per_token")
    head = f"{'preset':<14}{'image':>7}{'req':>4} | " + " ".join(f"{_short(m):>19}" for m in TTFT_MODES)
    lines = [head + " | drift, text eager / graphed"]
    for case in cases:
        by = ttft_case(rows, *case)
        cells = [f"{by[m]['decode_ms_per_token']:>19.2f}" if by.get(m, {}).get("decode_ms_per_token") is not None
                 else f"{'-':>19}" for m in TTFT_MODES]
        drifts = []
        for t in ("eager", "graphed"):
            d = by.get(mode_name(t, "graphed"), {}).get("decode_drift")
            drifts.append("-" if d is None else f"{d:+.1%}" + (" (!)" if drift_beyond(d) else ""))
        lines.append(f"{case[0]:<14}{case[1]:>7}{case[2]:>4} | " + " ".join(cells) + " | " + " / ".join(drifts))
    return "\n".join(lines)


def parity_text(result: dict) -> str:
    """Per preset and mode: relative error of the first-token logits against a float32 copy, whether
    the first token equals ``generate``'s, how many leading tokens do, and the verdict."""
    parity = result.get("parity") or []
    if not parity:
        return _not_recorded("parity section")
    lines = [f"{'preset':<14} {'mode':<29} | {'logits vs fp32':>14} | first token | equal leading | ok"]
    for p in parity:
        for mode, r in (p.get("modes") or {}).items():
            lines.append(f"{p.get('preset', '?'):<14} {mode:<29} | {r['rel_err_vs_fp32']:>14.2e} | "
                         f"{'same' if r['same_first_token'] else 'DIFFERS':>11} | "
                         f"{r['matching_tokens']:>6} of {p.get('new_tokens', '?'):<5} | {'yes' if r['ok'] else 'NO'}")
    return "\n".join(lines)


def profile_text(result: dict) -> str:
    """Per preset and mode, one profiled request: kernels, launch calls, graph launches, GPU-busy and
    wall ms, and the busy share (the rest of the wall time is launch gaps and host work)."""
    profile = result.get("profile") or []
    if not profile:
        return _not_recorded("profile section (ttft --profile records one)")
    lines = [f"{'preset':<14} {'mode':<29} | kernels | launches | graphs | GPU busy ms | wall ms | busy"]
    for p in profile:
        for mode in TTFT_MODES:
            r = p.get(mode)
            if r is None:
                continue
            share = r.get("busy_share")
            lines.append(f"{p.get('preset', '?'):<14} {mode:<29} | {r.get('kernels', 0):>7.0f} | "
                         f"{r.get('launch_calls', 0):>8.0f} | {r.get('graph_launches', 0):>6.0f} | "
                         f"{r.get('gpu_busy_ms', 0):>11.2f} | {r.get('wall_ms', 0):>7.2f} | "
                         + ("-" if share is None else f"{share:.0%}"))
    return "\n".join(lines)


def range_verdict(lo: float, hi: float, claim=PR_CLAIM) -> str:
    """Where a range of cuts stands against the PR's: ``above``, ``below``, ``within`` or ``overlapping``."""
    if lo > claim[1]:
        return "above"
    if hi < claim[0]:
        return "below"
    return "within" if claim[0] <= lo and hi <= claim[1] else "overlapping"


def claim_verdict(cut: float, claim=PR_CLAIM) -> str:
    """Where a TTFT cut stands against the PR's range: below, within or above."""
    return range_verdict(cut, cut, claim)


def claim_text(rows: list[dict], preset: str | None = None, image: str | None = None) -> str:
    """The encoder graphs' paired TTFT cut per case, text model graphed and eager, each placed against
    the PR's range; ``preset``/``image`` restrict the cases."""
    cases = [c for c in ttft_cases(rows) if (preset is None or c[0] == preset) and (image is None or c[1] == image)]
    if not cases:
        return _not_recorded(f"TTFT rows for {preset or 'any preset'}, {image or 'any image'}")
    lo, hi = PR_CLAIM
    flagged = False
    lines = [f"PR #44930 claims {lo:.0%}-{hi:.0%} lower end-to-end latency at low batch, its text model graphed.",
             f"{'preset':<14}{'image':>7}{'req':>4} | {'text graphed: cut, TTFT eager -> graphed':>44} | "
             f"{'text eager: cut, TTFT eager -> graphed':>42}"]
    for case in cases:
        by, cells = ttft_case(rows, *case), []
        for t in ("graphed", "eager"):
            e, g = by.get(mode_name(t, "eager")), by.get(mode_name(t, "graphed"))
            if e is None or g is None or g.get("encoder_graph_cut") is None:
                cells.append(f"{'not recorded':>43}")
                continue
            cut, drift = g["encoder_graph_cut"], g.get("decode_drift")
            flag = drift_beyond(drift)
            flagged = flagged or flag
            cells.append(f"{cut:>6.1%} ({claim_verdict(cut)}) {e['ttft_ms']:>7.2f} -> {g['ttft_ms']:>6.2f} ms"
                         + (" (!)" if flag else ""))
        lines.append(f"{case[0]:<14}{case[1]:>7}{case[2]:>4} | {cells[0]:>44} | {cells[1]:>42}")
    if flagged:
        lines.append(f"(!) decode per token differs by more than {DECODE_DRIFT_WARN:.0%} between the two encoder "
                     "modes: that cut is not the encoder's alone")
    return "\n".join(lines)


def claim_sentence(rows: list[dict], preset: str = "lfm2-vl-450m", image: str = "1x512", requests: int = 1) -> str:
    """One case in words: the encoder graphs' TTFT cut with the text model graphed and eager, each
    against the PR's range (or that it is not recorded)."""
    by = ttft_case(rows, preset, image, requests)
    if not by:
        return f"{preset}, {image} x{requests}: {_not_recorded('TTFT rows for this case')}."
    parts = []
    for t, how in (("graphed", "text model graphed (as in an engine)"), ("eager", "text model eager (as in generate)")):
        cut = by.get(mode_name(t, "graphed"), {}).get("encoder_graph_cut")
        parts.append(f"with the {how}: not recorded" if cut is None or mode_name(t, "eager") not in by else
                     f"with the {how}: encoder graphs cut TTFT by {cut:.1%}, {claim_verdict(cut)} the PR's "
                     f"{PR_CLAIM[0]:.0%}-{PR_CLAIM[1]:.0%}")
    return f"{preset}, {image} x{requests}\n  " + "\n  ".join(parts)


def amdahl_cut(rows: list[dict], preset: str, image: str, requests: int, text_mode: str) -> dict | None:
    """Amdahl's law for the encoder graphs' TTFT cut at one case and text mode: ``share`` of TTFT in the
    phases before the text model (eager encoder), their ``speedup`` graphed, ``predicted`` = share ·
    (1 − 1/speedup), beside the ``measured`` paired cut; None where the case lacks a row."""
    by = ttft_case(rows, preset, image, requests)
    eager, graphed = by.get(mode_name(text_mode, "eager")), by.get(mode_name(text_mode, "graphed"))
    if eager is None or graphed is None:
        return None
    before_eager = sum(eager["phases_ms"][p] for p in BEFORE_TEXT)
    before_graphed = sum(graphed["phases_ms"][p] for p in BEFORE_TEXT)
    share, speedup = before_eager / eager["ttft_ms"], before_eager / before_graphed
    return {"ttft_ms": eager["ttft_ms"], "before_text_ms": (before_eager, before_graphed), "share": share,
            "speedup": speedup, "predicted": share * (1 - 1 / speedup), "measured": graphed.get("encoder_graph_cut")}


def text_graph_cuts(rows: list[dict], preset: str, encoder_mode: str = "graphed") -> list[dict]:
    """What graphing the text model cuts from TTFT per case of ``preset`` at one encoder mode (paired,
    else from medians), sorted by the batch's prompt tokens, with whether the case is ``disturbed``."""
    out = []
    for p, image, n in ttft_cases(rows):
        if p != preset:
            continue
        by = ttft_case(rows, p, image, n)
        eager, graphed = by.get(mode_name("eager", encoder_mode)), by.get(mode_name("graphed", encoder_mode))
        if eager is None or graphed is None:
            continue
        if eager.get("ttft_samples_ms") and graphed.get("ttft_samples_ms"):
            cut = paired_reduction(eager["ttft_samples_ms"], graphed["ttft_samples_ms"])
        else:
            cut = 1 - graphed["ttft_ms"] / eager["ttft_ms"]
        out.append({"image": image, "requests": n, "prompt_tokens": n * eager["prompt_len"],
                    "eager_ms": eager["ttft_ms"], "graphed_ms": graphed["ttft_ms"], "cut": cut,
                    "disturbed": case_disturbed(rows, p, image, n)})
    return sorted(out, key=lambda c: c["prompt_tokens"])


# The decode control (ttft_findings quotes ranges over the cases that pass it)


def drift_fails(row: dict | None) -> bool:
    """Whether a row's ``decode_drift`` is beyond ``DECODE_DRIFT_WARN``: decode never runs the encoder,
    so such a row was disturbed while one mode was timed (no drift passes)."""
    return drift_beyond((row or {}).get("decode_drift"))


def drift_beyond(drift: float | None) -> bool:
    """Whether a decode drift is beyond ``DECODE_DRIFT_WARN`` (None, no drift recorded, is not)."""
    return drift is not None and abs(drift) > DECODE_DRIFT_WARN


def case_disturbed(rows: list[dict], preset: str, image: str, requests: int) -> bool:
    """Whether any mode of one TTFT case fails the decode control, so a cut between its modes may not
    be the graphs' alone."""
    return any(drift_fails(r) for r in ttft_case(rows, preset, image, requests).values())

