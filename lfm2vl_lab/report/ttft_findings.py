"""The encoder graphs' TTFT cuts of the recorded TTFT grid and e2e files as ranges against the PR's
claim (about 10-20% lower end-to-end latency at low batch size, its text model graphed), over the cases
whose decode control holds (the others are left out and named)."""

from __future__ import annotations

import pandas as pd

from ..measure.ttft import mode_name
from .frames import missing
from .plots_ttft import case_name, per_case, ttft_frame
from .ttft_summary import PR_CLAIM, drift_beyond, range_verdict


def encoder_cuts(rows: list[dict], text_mode: str = "graphed") -> list[dict]:
    """The encoder graphs' paired TTFT cut per case of a TTFT grid at one text mode:
    ``{"case", "cut", "drift"}`` (drift: the graphed-encoder row's ``decode_drift``, or None)."""
    df, graphed = ttft_frame(rows), mode_name(text_mode, "graphed")
    cuts, drifts = per_case(df, "encoder_graph_cut")[graphed], per_case(df, "decode_drift")[graphed]
    return [{"case": case, "cut": cut, "drift": None if missing(drift) else drift}
            for case, cut, drift in zip(cuts.index, cuts, drifts) if not missing(cut)]


def e2e_cuts(rows: list[dict], mode: str = "lab-graph") -> list[dict]:
    """The graphed encoder's TTFT cut inside ``generate`` per case of an e2e file (paired where it was),
    with its ``decode_drift``."""
    return [{"case": (r["preset"], r["image"], r["requests"]), "cut": cut, "drift": r.get("decode_drift")}
            for r in rows if r.get("mode") == mode
            and (cut := r.get("ttft_reduction_paired", r.get("ttft_reduction"))) is not None]


def cut_range(cuts: list[dict], requests: int | None = None) -> dict:
    """The range of ``cuts`` (only ``requests``' cases, if given) over the cases whose decode control
    holds, with those ``kept``, ``left_out`` and ``unchecked`` (kept without a drift)."""
    cuts = [c for c in cuts if requests is None or c["case"][2] == requests]
    kept = [c for c in cuts if not drift_beyond(c["drift"])]
    return {"lo": min((c["cut"] for c in kept), default=None), "hi": max((c["cut"] for c in kept), default=None),
            "kept": kept, "left_out": [c for c in cuts if drift_beyond(c["drift"])],
            "unchecked": sum(c["drift"] is None for c in kept)}


def ranges_frame(settings: dict[str, list[dict]], claim: tuple = PR_CLAIM) -> pd.DataFrame:
    """Per setting (``{name: cuts}``) and request count (one request, then every case): the cuts' range
    in %, over how many cases, where it stands against ``claim``, and the cases left out by the decode
    control (their drift in %)."""
    out = {}
    for name, cuts in settings.items():
        for requests, what in ((1, "one request"), (None, "every case")):
            r = cut_range(cuts, requests)
            n = len(r["kept"]) + len(r["left_out"])
            if not n:
                continue
            kept = bool(r["kept"])
            out[(name, what)] = {
                "cut % from": round(100 * r["lo"], 1) if kept else None,
                "to": round(100 * r["hi"], 1) if kept else None, "cases": f"{len(r['kept'])} of {n}",
                f"against {claim[0]:.0%}-{claim[1]:.0%}": range_verdict(r["lo"], r["hi"], claim) if kept else None,
                "left out (drift %)": ", ".join(f"{case_name(c['case'])} ({100 * c['drift']:+.0f})"
                                                for c in r["left_out"]),
                "no decode control": r["unchecked"]}
    return pd.DataFrame.from_dict(out, orient="index").rename_axis(["setting", "cases of"])
