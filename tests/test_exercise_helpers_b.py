"""The library readings behind the exercises of notebooks 06 and 07: the ceiling of a
graph's speedup (measure/floor.py), Amdahl's law for the encoder graphs' TTFT cut and the text graphs'
cut against the prompt's size (report/ttft_summary.py). Synthetic rows pin the arithmetic; the
reference set's H200 files check that the readings agree with what the runs recorded themselves."""

from __future__ import annotations

import pytest

from lfm2vl_lab.measure.floor import speedup_ceiling
from lfm2vl_lab.measure.table import add_derived
from lfm2vl_lab.measure.ttft import mode_name
from lfm2vl_lab.report import reference
from lfm2vl_lab.report.ttft_summary import BEFORE_TEXT, amdahl_cut, text_graph_cuts

FLOOR = "bench-450m"  # the reference set: every mode, profiled, 450M (notebook 06)
TTFT = "ttft"  # the reference set: the full grid: 450M and 1.6B, 1x512 and tiled, 1-8 requests


# ------------------------------------------------------------------------------------------------
# floor.speedup_ceiling


def test_speedup_ceiling_is_the_host_factor_times_the_kernel_factor():
    eager = {"mode": "hf-eager", "workload": "1x512", "median_ms": 4.0, "gpu_busy_ms": 1.0}
    graphed = {"mode": "lab-graph", "workload": "1x512", "median_ms": 1.0, "gpu_busy_ms": 0.8}
    c = speedup_ceiling(eager, graphed)
    assert c["host_factor"] == pytest.approx(4.0) and c["kernel_factor"] == pytest.approx(1.25)
    assert c["ceiling"] == pytest.approx(5.0) and c["speedup"] == pytest.approx(4.0)
    assert c["reached"] == pytest.approx(0.8)


@pytest.mark.parametrize("missing", ["gpu_busy_ms", "median_ms"])
def test_speedup_ceiling_needs_profiled_rows(missing):
    eager = {"mode": "hf-eager", "workload": "stream", "median_ms": 4.0, "gpu_busy_ms": 1.0}
    graphed = {"mode": "lab-graph", "workload": "stream", "median_ms": 1.0, "gpu_busy_ms": 0.8}
    del graphed[missing]
    with pytest.raises(ValueError, match=r"lab-graph/stream .*--profile"):
        speedup_ceiling(eager, graphed)


def test_speedup_ceiling_on_the_recorded_profile_agrees_with_the_table():
    """The measured speedup is the table's ``speedup_vs_hf``, and no graphed call beat its own floor."""
    rows = add_derived(reference.load(FLOOR)["rows"])
    by = {(r["mode"], r["workload"]): r for r in rows}
    nxs = [w for m, w in by if m == "lab-graph" and w.endswith("x512")]
    assert nxs == ["1x512", "2x512", "4x512", "8x512", "16x512"]
    for w in nxs:
        c = speedup_ceiling(by["hf-eager", w], by["lab-graph", w])
        assert c["speedup"] == pytest.approx(by["lab-graph", w]["speedup_vs_hf"])
        assert c["speedup"] < c["ceiling"]


# ------------------------------------------------------------------------------------------------
# ttft_summary.amdahl_cut and text_graph_cuts


def _row(preset, image, n, mode, ttft, before=(1.0, 1.0, 1.0), samples=None, **extra) -> dict:
    text, enc = mode.removeprefix("text-").split("+encoder-")
    phases = dict(zip(BEFORE_TEXT, before), prefill=ttft - sum(before), sample=0.0, processor=2.0)
    row = {"preset": preset, "image": image, "requests": n, "mode": mode, "text_mode": text, "encoder_mode": enc,
           "prompt_len": 280 if image == "1x512" else 1560, "ttft_ms": ttft, "phases_ms": phases, **extra}
    if samples is not None:
        row["ttft_samples_ms"] = samples
    return row


def test_amdahl_cut_from_the_phases_before_the_text_model():
    assert BEFORE_TEXT == ("h2d", "encoder", "merge")
    rows = [_row("p", "1x512", 1, mode_name("graphed", "eager"), 10.0, before=(0.5, 4.0, 0.5)),
            _row("p", "1x512", 1, mode_name("graphed", "graphed"), 6.5, before=(0.4, 1.0, 0.1), encoder_graph_cut=0.36)]
    a = amdahl_cut(rows, "p", "1x512", 1, "graphed")
    assert a["before_text_ms"] == pytest.approx((5.0, 1.5))
    assert a["share"] == pytest.approx(0.5) and a["speedup"] == pytest.approx(5.0 / 1.5)
    # share * (1 - 1/speedup) is the time saved before the text model over the eager-encoder TTFT
    assert a["predicted"] == pytest.approx((5.0 - 1.5) / 10.0)
    assert a["measured"] == 0.36
    assert amdahl_cut(rows, "p", "1x512", 1, "eager") is None  # no text-eager rows
    assert amdahl_cut(rows, "p", "tiled", 1, "graphed") is None


def test_amdahl_cut_on_the_recorded_grid_reads_the_recorded_cut():
    rows = reference.load(TTFT)["rows"]
    by = {(r["preset"], r["image"], r["requests"], r["mode"]): r for r in rows}
    for t in ("eager", "graphed"):
        a = amdahl_cut(rows, "lfm2-vl-450m", "1x512", 1, t)
        graphed = by["lfm2-vl-450m", "1x512", 1, mode_name(t, "graphed")]
        assert a["measured"] == graphed["encoder_graph_cut"]
        assert 0 < a["predicted"] < a["share"] < 1


def test_text_graph_cuts_sorted_by_prompt_tokens_and_paired():
    eager, graphed = mode_name("eager", "graphed"), mode_name("graphed", "graphed")
    rows = [
        # tiled x1: 1560 tokens; paired cut = median(1 - 5/10, 1 - 9/10, 1 - 6/10) = 0.4
        _row("p", "tiled", 1, eager, 10.0, samples=[10.0, 10.0, 10.0]),
        _row("p", "tiled", 1, graphed, 6.0, samples=[5.0, 9.0, 6.0]),
        # 1x512 x2: 560 tokens, no samples: the medians
        _row("p", "1x512", 2, eager, 10.0), _row("p", "1x512", 2, graphed, 2.5),
        # 1x512 x4: only one text mode, so no cut
        _row("p", "1x512", 4, eager, 10.0),
        # another preset is left out
        _row("q", "1x512", 1, eager, 10.0), _row("q", "1x512", 1, graphed, 1.0),
    ]
    cuts = text_graph_cuts(rows, "p")
    assert [(c["image"], c["requests"], c["prompt_tokens"]) for c in cuts] == [("1x512", 2, 560), ("tiled", 1, 1560)]
    assert cuts[0]["cut"] == pytest.approx(0.75) and cuts[1]["cut"] == pytest.approx(0.4)
    assert (cuts[1]["eager_ms"], cuts[1]["graphed_ms"]) == (10.0, 6.0)
    assert text_graph_cuts(rows, "p", encoder_mode="eager") == []


def test_text_graph_cuts_on_the_recorded_grid_cover_every_case():
    rows = reference.load(TTFT)["rows"]
    for preset in ("lfm2-vl-450m", "lfm2-vl-1.6b"):
        cuts = text_graph_cuts(rows, preset)
        assert len(cuts) == 8  # 1x512 and tiled, 1/2/4/8 requests
        assert [c["prompt_tokens"] for c in cuts] == sorted(c["prompt_tokens"] for c in cuts)
        one = next(c for c in cuts if (c["image"], c["requests"]) == ("1x512", 1))
        assert one["prompt_tokens"] == 280 and one["cut"] > 0  # one short request: the text graphs pay
