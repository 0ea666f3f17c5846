"""The sentences notebook 07 prints from the recorded TTFT grid and end-to-end file (report/ttft_findings.py)
and the decode control they rely on (report/ttft_summary.py): synthetic rows pin each rule, the reference
set's files check that the sentences say what the rows hold."""

from __future__ import annotations

import copy
import re

import pytest

from lfm2vl_lab.measure.e2e import DECODE_DRIFT_WARN
from lfm2vl_lab.measure.ttft import mode_name
from lfm2vl_lab.report import reference
from lfm2vl_lab.report.plots_ttft import TTFT_MODES
from lfm2vl_lab.report.ttft_findings import (
    claim_ranges_text,
    coverage,
    coverage_text,
    cut_range,
    decode_speedup_text,
    e2e_cuts,
    encoder_cuts,
    first_tokens_text,
    image_path_text,
    range_text,
    range_verdict,
    ttft_sentence,
)
from lfm2vl_lab.report.ttft_summary import decode_ratios, disturbed, drift_fails, text_graph_cuts, ttft_frame


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
    assert not drift_fails({"decode_drift": DECODE_DRIFT_WARN})
    assert drift_fails({"decode_drift": -1.01 * DECODE_DRIFT_WARN})
    assert not drift_fails({}) and not drift_fails(None) and not drift_fails({"decode_drift": None})
    rows = grid(cases=(("p", "1x512", 1), ("p", "1x512", 2)))
    rows[1]["decode_drift"] = 0.5  # 1x512 x1, text eager, encoder graphed
    assert disturbed(ttft_frame(rows)).tolist() == [True, False]
    assert [c["disturbed"] for c in text_graph_cuts(rows, "p")] == [True, False]


# ------------------------------------------------------------------------------------------------
# coverage


def test_coverage_of_synthetic_rows():
    c = coverage(grid(cases=(("b", "tiled", 4), ("a", "1x512", 1), ("a", "tiled", 1))))
    assert (c["presets"], c["images"], c["requests"], c["cases"]) == (["b", "a"], ["tiled", "1x512"], [1, 4], 3)
    assert c["modes"] == list(TTFT_MODES) and c["decode_tokens"] == [16] and c["new_tokens"] == []
    assert coverage_text([]) == "not recorded: this file has no rows"


def _arg(command: str, flag: str) -> list[str]:
    """Every value of ``flag`` in a command line, comma lists split."""
    return [v for m in re.findall(rf"{flag} (\S+)", command) for v in m.split(",")]


@pytest.mark.parametrize("role", ["e2e", "ttft"])
def test_coverage_is_what_the_reference_command_asked_for(role, e2e_res, ttft_res):
    res = {"e2e": e2e_res, "ttft": ttft_res}[role]
    command = reference.load_manifest()["files"][role]["command"]
    c = coverage(res["rows"])
    assert c["presets"] == _arg(command, "--preset") and c["images"] == _arg(command, "--image")
    assert c["requests"] == [int(n) for n in _arg(command, "--requests")]
    assert c["repeats"] == [int(n) for n in _arg(command, "--repeats")]
    assert c["cases"] == len(c["presets"]) * len(c["images"]) * len(c["requests"])
    text = coverage_text(res["rows"])
    assert text.startswith(f"covers {c['cases']} cases: presets {', '.join(c['presets'])};")


# ------------------------------------------------------------------------------------------------
# ranges


def test_cut_range_leaves_out_the_cases_whose_decode_control_fails():
    cuts = [{"case": ("p", "1x512", 1), "cut": 0.30, "drift": 0.0},
            {"case": ("p", "1x512", 4), "cut": 0.90, "drift": 0.5},  # disturbed: its cut is not quoted
            {"case": ("p", "tiled", 1), "cut": 0.10, "drift": None}]  # no control: kept, counted
    r = cut_range(cuts)
    assert (r["lo"], r["hi"], len(r["kept"]), r["unchecked"]) == (0.10, 0.30, 2, 1)
    assert [c["case"] for c in r["left_out"]] == [("p", "1x512", 4)]
    assert range_text(cuts) == ("every case: 10.0% to 30.0% over 2 of 3 cases; left out, decode control fails: "
                                "p 1x512 x4 (drift +50%); 1 without a decode control")
    assert range_text(cuts, requests=1) == "one request: 10.0% to 30.0% over 2 of 2 cases; 1 without a decode control"
    assert range_text(cuts[1:2]) == "every case: none of 1 cases passes the decode control; left out, decode " \
                                    "control fails: p 1x512 x4 (drift +50%)"
    assert range_text(cuts, requests=8).startswith("not recorded")
    assert range_text(cuts, claim=(0.1, 0.2)).startswith("every case: 10.0% to 30.0% over 2 of 3 cases, "
                                                         "overlapping the PR's 10%-20%; left out")


def test_encoder_and_e2e_cuts_read_the_graphed_rows():
    rows = grid(cases=(("p", "1x512", 1), ("p", "1x512", 2)))
    assert [(c["case"][2], c["cut"]) for c in encoder_cuts(rows, "eager")] == [(1, pytest.approx(0.21)),
                                                                               (2, pytest.approx(0.22))]
    assert encoder_cuts(rows)[0]["cut"] == pytest.approx(0.31)
    e2e = e2e_pair("p", "1x512", 1, 0.15, 0.0) + e2e_pair("p", "1x512", 4, 0.40, 0.3)
    assert [(c["case"], c["cut"], c["drift"]) for c in e2e_cuts(e2e)] == [(("p", "1x512", 1), 0.15, 0.0),
                                                                          (("p", "1x512", 4), 0.40, 0.3)]
    assert e2e_cuts(e2e, mode="lab-eager") == []


def test_claim_ranges_on_the_reference_set_quote_the_rows(ttft_res, e2e_res):
    text = claim_ranges_text(ttft_res["rows"], e2e_res["rows"])
    assert text.startswith("vLLM PR #44930: about 10%-20% lower end-to-end latency")
    kept = [r for r in e2e_res["rows"] if r["mode"] == "lab-graph" and abs(r["decode_drift"]) <= DECODE_DRIFT_WARN]
    lo, hi = min(r["ttft_reduction_paired"] for r in kept), max(r["ttft_reduction_paired"] for r in kept)
    inside = text.split("inside generate")[1]
    assert f"every case: {lo:.1%} to {hi:.1%} over {len(kept)} of 8 cases" in inside
    for r in e2e_res["rows"]:  # every disturbed e2e row is named, none quoted
        if r["mode"] == "lab-graph" and abs(r["decode_drift"]) > DECODE_DRIFT_WARN:
            assert f"{r['preset']} {r['image']} x{r['requests']} (drift {r['decode_drift']:+.0%})" in inside
    graphed = [r["encoder_graph_cut"] for r in ttft_res["rows"] if r["mode"] == mode_name("graphed", "graphed")
               and r["requests"] == 1 and not drift_fails(r)]
    assert f"one request: {min(graphed):.1%} to {max(graphed):.1%}" in text.split("text model graphed (as in vLLM)")[1]
    assert "inside generate" not in claim_ranges_text(ttft_res["rows"])
    ranges = [line for line in text.splitlines() if line.startswith("  ")]
    # each range says where it stands against the PR's, or that no case of it passed the decode control
    assert len(ranges) == 6 and all(re.search(r"cases, (above|below|within|overlapping) the PR's 10%-20%", line)
                                    or re.search(r": none of \d+ cases passes the decode control; left out", line)
                                    for line in ranges)
    assert any("the PR's 10%-20%" in line for line in ranges)


def test_range_verdict():
    assert [range_verdict(*r) for r in ((0.25, 0.6), (0.02, 0.08), (0.12, 0.18), (0.05, 0.3), (0.15, 0.3))] == \
        ["above", "below", "within", "overlapping", "overlapping"]


# ------------------------------------------------------------------------------------------------
# decode, TTFT, image path, first tokens


def test_decode_speedups_per_case_and_their_range():
    rows = grid(cases=(("p", "1x512", 1), ("p", "1x512", 2)))
    rows[4 + 3]["decode_drift"] = 0.2  # x2, both graphed: disturbed
    rows[4]["decode_ms_per_token"] = 30.0  # x2, all eager: a ratio of 10 that must not be quoted
    ups = decode_ratios(rows, mode_name("eager", "eager"), mode_name("graphed", "eager"))
    assert list(zip(ups.ratio, ups.disturbed)) == [(4.0, False), (10.0, True)]
    assert decode_speedup_text(rows) == ("p: decode per token is 4.0x to 4.0x faster with the text model graphed, "
                                         "over 1 of 2 cases (left out, decode control fails: p 1x512 x2)")
    assert decode_speedup_text([]).startswith("not recorded")


def test_ttft_sentence():
    rows = grid(cases=(("lfm2-vl-450m", "1x512", 1),))
    assert ttft_sentence(rows) == ("lfm2-vl-450m 1x512 x1: TTFT 20.00 ms with everything eager, 8.00 ms with the "
                                   "text model and the encoder graphed (2.5x)")
    assert "not recorded" in ttft_sentence(rows[1:])


def test_image_path_text(ttft_res):
    assert image_path_text({}).startswith("not recorded")
    lines = image_path_text(ttft_res).splitlines()
    sources = [r for r in ttft_res["image_path"] if r["kind"] == "encode_sources"]
    assert len(lines) == len(sources)
    assert all(f"{r['ratio']:.2f}x as long" in line for r, line in zip(sources, lines, strict=True))


def test_first_tokens_text_names_the_differing_modes_and_what_float32_chose():
    rows = grid(cases=(("p", "tiled", 1), ("p", "tiled", 2), ("p", "1x512", 1)))
    for r in rows[:8]:
        r["same_first_tokens"] = r["encoder_mode"] == "eager"
    parity = [{"preset": "p", "image": "tiled", "requests": 1, "fp32_top2_margin": [0.005, 0.01],
               "modes": {m: {"first_token_as_fp32": m.endswith("graphed")} for m in TTFT_MODES}}]
    text = first_tokens_text({"rows": rows, "parity": parity}).splitlines()
    both = f"{mode_name('eager', 'graphed')}, {mode_name('graphed', 'graphed')}"
    assert text[0] == "every mode's first tokens equal the all-eager mode's in 1 of 3 cases"
    assert text[1] == f"  p tiled x1: {both} differ; float32's top-2 logit margin 0.005, float32's first token " \
                      f"chosen by {both}"
    assert text[2] == f"  p tiled x2: {both} differ"
    same = copy.deepcopy(rows)
    for r in same:
        r["same_first_tokens"] = True
    assert first_tokens_text({"rows": same}) == "every mode's first tokens equal the all-eager mode's in 3 of 3 cases"
    assert first_tokens_text({}).startswith("not recorded")


def test_first_tokens_text_on_the_reference_set(ttft_res):
    text = first_tokens_text(ttft_res)
    differing = {(r["preset"], r["image"], r["requests"]) for r in ttft_res["rows"] if not r["same_first_tokens"]}
    assert text.count("differ") == len(differing)
    assert f"in {16 - len(differing)} of 16 cases" in text.splitlines()[0]
