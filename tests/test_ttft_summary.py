"""The ranges notebook 07 shows from the recorded TTFT grid and end-to-end file and the decode control
they rely on (report/ttft_summary.py): synthetic rows pin each rule, the reference set's files check that
the ranges say what the rows hold."""

from __future__ import annotations

import pandas as pd
import pytest

from lfm2vl_lab.measure.e2e import DECODE_DRIFT_WARN
from lfm2vl_lab.measure.ttft import mode_name
from lfm2vl_lab.report import reference
from lfm2vl_lab.report.plots_ttft import TTFT_MODES
from lfm2vl_lab.report.ttft_summary import (
    decode_frame,
    drift_beyond,
    encoder_cuts,
    parity_frame,
    range_verdict,
    ranges_frame,
    text_graph_cuts,
)


@pytest.fixture(scope="module")
def ttft_res() -> dict:
    return reference.load("ttft")


@pytest.fixture(scope="module")
def e2e_res() -> dict:
    return reference.load("e2e")


def grid(cases=(("p", "1x512", 1),), drift=0.0) -> list[dict]:
    """Four TTFT modes per case; the graphed-encoder rows carry a cut and a drift."""
    rows = []
    for preset, image, n in cases:
        for k, m in enumerate(TTFT_MODES):
            text, enc = m.removeprefix("text-").split("+encoder-")
            row = {"preset": preset, "image": image, "requests": n, "mode": m, "text_mode": text, "encoder_mode": enc,
                   "prompt_len": 280, "ttft_ms": 20.0 - 4 * k, "repeats": 3, "decode_tokens": 16,
                   "decode_ms_per_token": 12.0 if text == "eager" else 3.0, "same_first_tokens": True,
                   "phases_ms": {"h2d": 0.5, "encoder": 4.0 - 3 * (enc == "graphed"), "merge": 0.5}}
            if enc == "graphed":
                row.update(encoder_graph_cut=0.2 + 0.1 * (text == "graphed") + 0.01 * n, decode_drift=drift)
            rows.append(row)
    return rows


def e2e_pair(preset, image, n, cut, drift) -> list[dict]:
    base = {"preset": preset, "image": image, "requests": n, "repeats": 3, "ttft_ms": 10.0, "total_16_ms": 100.0,
            "total_64_ms": 400.0}
    return [dict(base, mode="hf-eager", ttft_reduction=0.0),
            dict(base, mode="lab-graph", ttft_reduction=cut + 0.01, ttft_reduction_paired=cut, decode_drift=drift)]


# ------------------------------------------------------------------------------------------------
# the decode control


def test_drift_fails_beyond_the_warn_threshold_only():
    assert not drift_beyond(DECODE_DRIFT_WARN) and drift_beyond(-1.01 * DECODE_DRIFT_WARN)
    assert not drift_beyond(None) and not drift_beyond(float("nan"))
    rows = grid(cases=(("p", "1x512", 1), ("p", "1x512", 2)))
    rows[1]["decode_drift"] = 0.5  # 1x512 x1, text eager, encoder graphed
    assert [c["disturbed"] for c in text_graph_cuts(rows, "p")] == [True, False]


# ------------------------------------------------------------------------------------------------
# ranges


def test_the_ranges_leave_out_the_cases_whose_decode_control_fails():
    cuts = pd.DataFrame({"cut": [0.30, 0.90, 0.10], "drift": [0.0, 0.5, None]},  # x4 disturbed; tiled: no control
                        index=pd.MultiIndex.from_tuples([("p", "1x512", 1), ("p", "1x512", 4), ("p", "tiled", 1)],
                                                        names=["preset", "image", "requests"]))
    df = ranges_frame({"s": cuts}, claim=(0.1, 0.2))
    every, one = df.loc[("s", "every case")], df.loc[("s", "one request")]
    assert (every["cut % from"], every["to"], every["cases"], every["against 10%-20%"]) == \
        (10.0, 30.0, "2 of 3", "overlapping")
    assert (every["left out (drift %)"], every["no decode control"]) == ("p 1x512 x4 (+50)", 1)
    assert (one["cases"], one["left out (drift %)"]) == ("2 of 2", "")
    none = ranges_frame({"s": cuts[1:2]}).loc[("s", "every case")]  # none passes: no range, no verdict
    assert (none["cases"], none["cut % from"], none["against 10%-20%"]) == ("0 of 1", None, None)
    assert ("s", "one request") not in ranges_frame({"s": cuts[1:2]}).index  # no such case: no row


def test_encoder_and_e2e_cuts_read_the_graphed_rows():
    rows = grid(cases=(("p", "1x512", 1), ("p", "1x512", 2)))
    eager = encoder_cuts(rows, "eager")
    assert list(eager.index) == [("p", "1x512", 1), ("p", "1x512", 2)]
    assert eager["cut"].tolist() == pytest.approx([0.21, 0.22]) and eager["drift"].tolist() == [0.0, 0.0]
    assert encoder_cuts(rows, "graphed")["cut"].iloc[0] == pytest.approx(0.31)
    e2e = e2e_pair("p", "1x512", 1, 0.15, 0.0) + e2e_pair("p", "1x512", 4, 0.40, 0.3)
    inside = encoder_cuts(e2e)  # the paired cut where the row has one
    assert list(inside.itertuples()) == [(("p", "1x512", 1), 0.15, 0.0), (("p", "1x512", 4), 0.40, 0.3)]
    del e2e[1]["ttft_reduction_paired"]
    assert encoder_cuts(e2e)["cut"].iloc[0] == pytest.approx(0.16)  # else the unpaired one
    assert encoder_cuts(e2e[:1]).empty  # no graphed row


def test_the_ranges_of_the_reference_set_quote_the_rows(ttft_res, e2e_res):
    df = ranges_frame({"engine grid, text model graphed (as in vLLM)": encoder_cuts(ttft_res["rows"], "graphed"),
                       "engine grid, text model eager": encoder_cuts(ttft_res["rows"], "eager"),
                       "inside generate (text model eager)": encoder_cuts(e2e_res["rows"])})
    kept = [r for r in e2e_res["rows"] if r["mode"] == "lab-graph" and abs(r["decode_drift"]) <= DECODE_DRIFT_WARN]
    inside = df.loc[("inside generate (text model eager)", "every case")]
    assert (inside["cut % from"], inside["to"], inside["cases"]) == \
        (round(100 * min(r["ttft_reduction_paired"] for r in kept), 1),
         round(100 * max(r["ttft_reduction_paired"] for r in kept), 1), f"{len(kept)} of 8")
    for r in e2e_res["rows"]:  # every disturbed e2e row is named, none quoted
        if r["mode"] == "lab-graph" and abs(r["decode_drift"]) > DECODE_DRIFT_WARN:
            assert f"{r['preset']} {r['image']} x{r['requests']} ({100 * r['decode_drift']:+.0f})" in \
                inside["left out (drift %)"]
    graphed = [r["encoder_graph_cut"] for r in ttft_res["rows"] if r["mode"] == mode_name("graphed", "graphed")
               and r["requests"] == 1 and not drift_beyond(r.get("decode_drift"))]
    one = df.loc[("engine grid, text model graphed (as in vLLM)", "one request")]
    assert (one["cut % from"], one["to"]) == (round(100 * min(graphed), 1), round(100 * max(graphed), 1))
    assert len(df) == 6 and set(df["against 10%-20%"].dropna()) <= {"above", "below", "within", "overlapping"}


def test_range_verdict():
    assert [range_verdict(*r) for r in ((0.25, 0.6), (0.02, 0.08), (0.12, 0.18), (0.05, 0.3), (0.15, 0.3))] == \
        ["above", "below", "within", "overlapping", "overlapping"]
    assert [range_verdict(x) for x in (0.05, 0.1, 0.15, 0.2, 0.5)] == ["below", "within", "within", "within", "above"]


# ------------------------------------------------------------------------------------------------
# decode, TTFT, image path, first tokens


def test_decode_per_case_and_its_control():
    rows = grid(cases=(("p", "1x512", 1), ("p", "1x512", 2)))
    rows[4 + 3]["decode_drift"] = 0.2  # x2, both graphed: disturbed
    rows[4]["decode_ms_per_token"] = 30.0  # x2, all eager
    dec = decode_frame(rows)
    assert list(zip(dec["T:eager E:eager"], dec["decode control"])) == [(12.0, "holds"), (30.0, "fails")]


def test_parity_frame_says_which_first_tokens_differ_and_what_float32_chose():
    modes = {m: {"rel_err_vs_fp32": 0.01, "same_first_token": m.endswith("eager"), "matching_tokens": 4, "ok": True,
                 "first_token_as_fp32": m.endswith("graphed")} for m in TTFT_MODES}
    df = parity_frame({"parity": [{"preset": "p", "image": "tiled", "requests": 1, "new_tokens": 8,
                                   "fp32_top2_margin": [0.005, 0.01], "modes": modes}]})
    graphed = df[df["mode"].str.endswith("graphed")]
    assert set(graphed["first token"]) == {"DIFFERS"} and set(graphed["float32's first token"]) == {"yes"}
    assert set(df["fp32 top-2 margin"]) == {"0.005"}
    assert parity_frame({}).startswith("not recorded")
