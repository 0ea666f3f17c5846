"""A recorded TTFT grid as the DataFrames notebook 07 shows beside its figures, the decode control
(:func:`drift_beyond`) and the encoder graphs' cuts as ranges against the PR's claim (:data:`PR_CLAIM`).
A section the file lacks gives a ``not recorded`` line, never an error, so the same cells read a small
first run and the full grid."""

from __future__ import annotations

import pandas as pd

from ..measure.e2e import DECODE_DRIFT_WARN, paired_reduction
from ..measure.ttft import mode_name
from .frames import missing, need
from .plots_ttft import CASE, TTFT_PHASES, case_name, per_case, ttft_case, ttft_frame

PR_CLAIM = (0.10, 0.20)  # vLLM PR #44930: "~10-20% lower e2e latency for low batch size" (text model graphed)
# The phases before the text model, the ones the encoder mode can change (h2d too: the graphed encoder
# moves only the real rows, in the model's dtype: VlmPipeline.to_device); Amdahl's law takes the rest as fixed.
BEFORE_TEXT = TTFT_PHASES[:TTFT_PHASES.index("prefill")]


def drift_beyond(drift: float | None) -> bool:
    """The decode control: decode never runs the encoder, so its ms per token must not move with the
    encoder mode; a ``decode_drift`` beyond ``DECODE_DRIFT_WARN`` says the case was disturbed while one
    mode was timed, and its cuts are not the graphs' alone. None or NaN (no drift recorded) is not beyond."""
    return not missing(drift) and bool(abs(drift) > DECODE_DRIFT_WARN)


def range_verdict(lo: float, hi: float | None = None, claim=PR_CLAIM) -> str:
    """Where a range of cuts (or one cut, ``lo``) stands against the PR's: ``above``, ``below``,
    ``within`` or ``overlapping``."""
    hi = lo if hi is None else hi
    if lo > claim[1]:
        return "above"
    if hi < claim[0]:
        return "below"
    return "within" if claim[0] <= lo and hi <= claim[1] else "overlapping"


def decode_frame(rows: list[dict]) -> pd.DataFrame | str:
    """Decode ms per token per case and mode (T: text model, E: encoder), and at each text mode the drift
    between the two encoder modes in %, with the decode control it decides."""
    df = ttft_frame(rows)
    if df.decode_ms_per_token.isna().all():
        return "not recorded: this file has no TTFT rows with decode_ms_per_token"
    out = per_case(df, "decode_ms_per_token").round(2).rename(
        columns=lambda m: "T:{} E:{}".format(*m.removeprefix("text-").split("+encoder-")))
    drift = per_case(df, "decode_drift")[[mode_name(t, "graphed") for t in ("eager", "graphed")]]
    for t, m in zip(("eager", "graphed"), drift.columns):
        out[f"drift %, text {t}"] = (100 * drift[m].astype(float)).round(1) + 0.0  # no "-0.0"
    out["decode control"] = drift.map(drift_beyond).any(axis=1).map({True: "fails", False: "holds"})
    return out.rename_axis(CASE)


def parity_frame(result: dict) -> pd.DataFrame | str:
    """Per parity case and mode: the first-token logits against float32, the first and leading tokens
    against ``generate``'s, whether the first token is float32's, float32's top-2 logit margin (a near tie
    bf16 can tip: where a first token differs, it says why) and the verdict."""
    parity = result.get("parity") or []
    if not parity:
        return "not recorded: this file has no parity section"
    return pd.DataFrame([{"preset": p.get("preset", "?"), "image": p.get("image"), "requests": p.get("requests"),
                          "mode": mode, "logits vs fp32": f"{r['rel_err_vs_fp32']:.2e}",
                          "first token": "same" if r["same_first_token"] else "DIFFERS",
                          "equal leading tokens": f"{r['matching_tokens']} of {p.get('new_tokens', '?')}",
                          "float32's first token": "yes" if r.get("first_token_as_fp32", True) else "no",
                          "fp32 top-2 margin": f"{min(p.get('fp32_top2_margin') or [float('nan')]):.3g}",
                          "ok": "yes" if r["ok"] else "NO"}
                         for p in parity for mode, r in (p.get("modes") or {}).items()])


def encoder_cuts(rows: list[dict], text_mode: str | None = None) -> pd.DataFrame:
    """The encoder graphs' paired TTFT ``cut`` per case, with the graphed row's decode ``drift``: of a TTFT
    grid at ``text_mode``, or, without one, of an e2e file (its ``lab-graph`` rows: inside ``generate``)."""
    if text_mode:
        df = ttft_frame(rows)
        df = df[df["mode"] == mode_name(text_mode, "graphed")].assign(cut=lambda d: d["encoder_graph_cut"])
    else:
        df = need(pd.DataFrame([r for r in rows if r.get("mode") == "lab-graph"]), *CASE, "ttft_reduction",
                  "ttft_reduction_paired", "decode_drift")
        df["cut"] = df["ttft_reduction_paired"].fillna(df["ttft_reduction"])
    return df.set_index(CASE).rename(columns={"decode_drift": "drift"})[["cut", "drift"]].dropna(subset=["cut"])


def ranges_frame(settings: dict[str, pd.DataFrame], claim: tuple = PR_CLAIM) -> pd.DataFrame:
    """Per setting (``{name: encoder_cuts(...)}``) and request count (one request, then every case): the
    cuts' range in % over the cases whose decode control holds, where it stands against ``claim``, the
    cases left out (their drift in %) and those kept without a decode control."""
    out = {}
    for name, cuts in settings.items():
        for what, df in (("one request", cuts[cuts.index.get_level_values("requests") == 1]), ("every case", cuts)):
            if df.empty:
                continue
            left_out = df["drift"].map(drift_beyond)
            kept = df["cut"][~left_out]
            lo, hi, verdict = (round(100 * kept.min(), 1), round(100 * kept.max(), 1),
                               range_verdict(kept.min(), kept.max(), claim)) if len(kept) else (None, None, None)
            out[(name, what)] = {"cut % from": lo, "to": hi, "cases": f"{len(kept)} of {len(df)}",
                                 f"against {claim[0]:.0%}-{claim[1]:.0%}": verdict,
                                 "left out (drift %)": ", ".join(f"{case_name(c)} ({100 * d:+.0f})"
                                                                 for c, d in df["drift"][left_out].items()),
                                 "no decode control": int(df["drift"][~left_out].map(missing).sum())}
    return pd.DataFrame.from_dict(out, orient="index").rename_axis(["setting", "cases of"])


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
    else from medians), sorted by the batch's prompt tokens, with whether the case is ``disturbed`` (a
    mode of it fails the decode control)."""
    out, failing = [], per_case(ttft_frame(rows), "decode_drift").map(drift_beyond).any(axis=1)
    for case in (c for c in failing.index if c[0] == preset):  # in recorded order
        by = ttft_case(rows, *case)
        eager, graphed = by.get(mode_name("eager", encoder_mode)), by.get(mode_name("graphed", encoder_mode))
        if eager is None or graphed is None:
            continue
        samples = eager.get("ttft_samples_ms"), graphed.get("ttft_samples_ms")
        cut = paired_reduction(*samples) if all(samples) else 1 - graphed["ttft_ms"] / eager["ttft_ms"]
        out.append({"image": case[1], "requests": case[2], "prompt_tokens": case[2] * eager["prompt_len"],
                    "eager_ms": eager["ttft_ms"], "graphed_ms": graphed["ttft_ms"], "cut": cut,
                    "disturbed": bool(failing[case])})
    return sorted(out, key=lambda c: c["prompt_tokens"])
