"""A recorded TTFT result (``ttft``, ``e2e``) as the text notebook 07 prints beside its figures, and
the decode control (:func:`drift_fails`; per case, :func:`disturbed`). A section the file lacks gives
a ``not recorded`` line, never an error, so the same cells read a small first run and the full grid."""

from __future__ import annotations

import pandas as pd

from ..measure.e2e import DECODE_DRIFT_WARN, paired_reduction
from ..measure.ttft import mode_name
from .frames import missing
from .plots_ttft import TTFT_MODES, TTFT_PHASES, per_case, ttft_case, ttft_cases, ttft_frame

PR_CLAIM = (0.10, 0.20)  # vLLM PR #44930: "~10-20% lower e2e latency for low batch size" (text model graphed)
# The phases before the text model, the ones the encoder mode can change (h2d too: the graphed encoder
# moves only the real rows, in the model's dtype: VlmPipeline.to_device); Amdahl's law takes the rest as fixed.
BEFORE_TEXT = TTFT_PHASES[:TTFT_PHASES.index("prefill")]
TEXT_MODES = ("eager", "graphed")


def _not_recorded(what: str) -> str:
    return f"not recorded: this file has no {what}"


def _case_cols(case) -> str:
    """A case as the fixed-width columns that start the text tables' lines."""
    return f"{case[0]:<14}{case[1]:>7}{case[2]:>4}"


def _short(mode: str) -> str:
    """``text-graphed+encoder-eager`` -> ``T:graphed E:eager``."""
    text, enc = mode.removeprefix("text-").split("+encoder-")
    return f"T:{text} E:{enc}"


def decode_text(rows: list[dict]) -> str:
    """Decode ms per token per mode and case, and at each text mode the drift between the two encoder
    modes (decode never runs the encoder, so a large drift means that row's timing was disturbed)."""
    df = ttft_frame(rows)
    if df.decode_ms_per_token.isna().all():
        return _not_recorded("TTFT rows with decode_ms_per_token")
    dec = per_case(df, "decode_ms_per_token")
    drift = per_case(df, "decode_drift")[[mode_name(t, "graphed") for t in TEXT_MODES]]
    lines = [f"{'preset':<14}{'image':>7}{'req':>4} | " + " ".join(f"{_short(m):>19}" for m in TTFT_MODES)
             + " | drift, text eager / graphed"]
    for case in dec.index:
        cells = " ".join(f"{'-':>19}" if missing(v) else f"{v:>19.2f}" for v in dec.loc[case])
        drifts = " / ".join("-" if missing(d) else f"{d:+.1%}" + " (!)" * drift_beyond(d) for d in drift.loc[case])
        lines.append(f"{_case_cols(case)} | {cells} | {drifts}")
    return "\n".join(lines)


def parity_text(result: dict) -> str:
    """Per preset and mode: relative error of the first-token logits against a float32 copy, whether
    the first token equals ``generate``'s, how many leading tokens do, and the verdict."""
    parity = result.get("parity") or []
    if not parity:
        return _not_recorded("parity section")
    head = f"{'preset':<14} {'mode':<29} | {'logits vs fp32':>14} | first token | equal leading | ok"
    return "\n".join([head] + [
        f"{p.get('preset', '?'):<14} {mode:<29} | {r['rel_err_vs_fp32']:>14.2e} | "
        f"{'same' if r['same_first_token'] else 'DIFFERS':>11} | "
        f"{r['matching_tokens']:>6} of {p.get('new_tokens', '?'):<5} | {'yes' if r['ok'] else 'NO'}"
        for p in parity for mode, r in (p.get("modes") or {}).items()])


def profile_text(result: dict) -> str:
    """Per preset and mode, one profiled request: kernels, launch calls, graph launches, GPU-busy and
    wall ms, and the busy share (the rest of the wall time is launch gaps and host work)."""
    profile = result.get("profile") or []
    if not profile:
        return _not_recorded("profile section (ttft --profile records one)")
    head = f"{'preset':<14} {'mode':<29} | kernels | launches | graphs | GPU busy ms | wall ms | busy"
    return "\n".join([head] + [
        f"{p.get('preset', '?'):<14} {mode:<29} | {r.get('kernels', 0):>7.0f} | {r.get('launch_calls', 0):>8.0f} | "
        f"{r.get('graph_launches', 0):>6.0f} | {r.get('gpu_busy_ms', 0):>11.2f} | {r.get('wall_ms', 0):>7.2f} | "
        + ("-" if r.get("busy_share") is None else f"{r['busy_share']:.0%}")
        for p in profile for mode in TTFT_MODES if (r := p.get(mode)) is not None])


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
    df = ttft_frame(rows)
    df = df[(df.preset.eq(preset) | (preset is None)) & (df.image.eq(image) | (image is None))]
    if df.empty:
        return _not_recorded(f"TTFT rows for {preset or 'any preset'}, {image or 'any image'}")
    ttft, cut, drift = (per_case(df, v) for v in ("ttft_ms", "encoder_graph_cut", "decode_drift"))
    lo, hi = PR_CLAIM
    lines = [f"PR #44930 claims {lo:.0%}-{hi:.0%} lower end-to-end latency at low batch, its text model graphed.",
             f"{'preset':<14}{'image':>7}{'req':>4} | {'text graphed: cut, TTFT eager -> graphed':>44} | "
             f"{'text eager: cut, TTFT eager -> graphed':>42}"]
    flagged = False  # a cell whose decode control fails, explained below the table
    for case in ttft.index:
        cells = []
        for t in ("graphed", "eager"):
            e, g = ttft.at[case, mode_name(t, "eager")], ttft.at[case, mode_name(t, "graphed")]
            c, d = cut.at[case, mode_name(t, "graphed")], drift.at[case, mode_name(t, "graphed")]
            if missing(e) or missing(g) or missing(c):
                cells.append(f"{'not recorded':>43}")
                continue
            flagged = flagged or drift_beyond(d)
            cells.append(f"{c:>6.1%} ({claim_verdict(c)}) {e:>7.2f} -> {g:>6.2f} ms" + " (!)" * drift_beyond(d))
        lines.append(f"{_case_cols(case)} | {cells[0]:>44} | {cells[1]:>42}")
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
    before_eager, before_graphed = (sum(r["phases_ms"][p] for p in BEFORE_TEXT) for r in (eager, graphed))
    share, speedup = before_eager / eager["ttft_ms"], before_eager / before_graphed
    return {"ttft_ms": eager["ttft_ms"], "before_text_ms": (before_eager, before_graphed), "share": share,
            "speedup": speedup, "predicted": share * (1 - 1 / speedup), "measured": graphed.get("encoder_graph_cut")}


def text_graph_cuts(rows: list[dict], preset: str, encoder_mode: str = "graphed") -> list[dict]:
    """What graphing the text model cuts from TTFT per case of ``preset`` at one encoder mode (paired,
    else from medians), sorted by the batch's prompt tokens, with whether the case is ``disturbed``."""
    out, failing = [], disturbed(ttft_frame(rows))
    for case in (c for c in ttft_cases(rows) if c[0] == preset):
        by = ttft_case(rows, *case)
        eager, graphed = by.get(mode_name("eager", encoder_mode)), by.get(mode_name("graphed", encoder_mode))
        if eager is None or graphed is None:
            continue
        if eager.get("ttft_samples_ms") and graphed.get("ttft_samples_ms"):
            cut = paired_reduction(eager["ttft_samples_ms"], graphed["ttft_samples_ms"])
        else:
            cut = 1 - graphed["ttft_ms"] / eager["ttft_ms"]
        out.append({"image": case[1], "requests": case[2], "prompt_tokens": case[2] * eager["prompt_len"],
                    "eager_ms": eager["ttft_ms"], "graphed_ms": graphed["ttft_ms"], "cut": cut,
                    "disturbed": bool(failing[case])})
    return sorted(out, key=lambda c: c["prompt_tokens"])


# The decode control (ttft_findings quotes ranges over the cases that pass it)


def drift_fails(row: dict | None) -> bool:
    """Whether a row's ``decode_drift`` is beyond ``DECODE_DRIFT_WARN``: decode never runs the encoder,
    so such a row was disturbed while one mode was timed (no drift passes)."""
    return drift_beyond((row or {}).get("decode_drift"))


def drift_beyond(drift: float | None) -> bool:
    """Whether a decode drift is beyond ``DECODE_DRIFT_WARN`` (None or NaN, no drift recorded, is not)."""
    return not missing(drift) and bool(abs(drift) > DECODE_DRIFT_WARN)


def disturbed(df: pd.DataFrame) -> pd.Series:
    """Per case of a :func:`ttft_frame` (:func:`per_case`'s index), whether any of its modes fails the
    decode control, so a cut between its modes may not be the graphs' alone."""
    return per_case(df, "decode_drift").map(drift_beyond).any(axis=1)


def case_disturbed(rows: list[dict], preset: str, image: str, requests: int) -> bool:
    """:func:`disturbed` for one case (False where the rows lack it)."""
    return bool(disturbed(ttft_frame(rows)).get((preset, image, requests), False))
