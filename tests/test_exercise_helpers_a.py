"""Library helpers the exercises of notebooks 01, 03, 04 and 05 call: idle_gaps, the
gaps of a profiled timeline, checked against hand-written traces with known answers and against
analyze_trace's own gap statistics."""

import json
from pathlib import Path

import pytest

from lfm2vl_lab.measure.profiling import Gap, analyze_trace, idle_gaps

EAGER = Path(__file__).parent / "fixtures" / "trace_eager.json"


def test_idle_gaps_of_one_call_are_the_reports_gaps():
    # Call 1 of the fixture: layernorm [5, 15], then gelu [23, 29] (µs from the call's first event).
    last = analyze_trace(EAGER, timeline_call=-1)
    assert idle_gaps(last.timeline) == [Gap(15.0, 8.0, "layernorm", "gelu")]
    assert [g.dur_us for g in idle_gaps(last.timeline)] == [last.gaps[-1]]


def test_idle_gaps_of_a_whole_trace_name_their_neighbours():
    # gemm_a [5, 25] and gemm_b [15, 35] overlap: one busy stretch that gemm_b ends; then softmax
    # [60, 70], a copy [80, 85], layernorm [1000, 1010], gelu [1018, 1024].
    whole = analyze_trace(EAGER).timeline
    assert idle_gaps(whole) == [Gap(35.0, 25.0, "gemm_b", "softmax"), Gap(70.0, 930.0, "softmax", "layernorm"),
                                Gap(1010.0, 8.0, "layernorm", "gelu")]
    # without call annotations analyze_trace measures gaps over the whole trace: the same three
    events = [e for e in json.loads(EAGER.read_text())["traceEvents"] if e.get("cat") != "user_annotation"]
    assert sorted(g.dur_us for g in idle_gaps(whole)) == sorted(analyze_trace(events).gaps)


def test_idle_gaps_can_count_copies_as_busy():
    copy = "Memcpy HtoD (Pinned -> Device)"
    gaps = idle_gaps(analyze_trace(EAGER).timeline, kernels_only=False)
    assert [(g.before, g.after, g.dur_us) for g in gaps][1:3] == [("softmax", copy, 10.0), (copy, "layernorm", 915.0)]


def test_idle_gaps_reads_recorded_rows_and_empty_lanes():
    # A recorded row's timeline is JSON: lists, not tuples. A CPU-only profile has no GPU lane events.
    row = {"gpu": [[0, 2.5, "a"], [4, 1, "b"], [4.5, 1, "c"], [9, 1, "d"]]}
    assert idle_gaps(row) == [Gap(2.5, 1.5, "a", "b"), Gap(5.5, 3.5, "c", "d")]
    assert idle_gaps({"cpu": [(0.0, 5.0, "aten::mm")], "gpu": []}) == []
    assert idle_gaps({}) == []


@pytest.mark.parametrize("kernels_only", [True, False])
def test_idle_gaps_never_overlap_busy_time(kernels_only):
    row = {"gpu": [[0, 10, "a"], [2, 3, "b"], [12, 1, "Memset (Device)"], [20, 5, "c"]]}
    gaps = idle_gaps(row, kernels_only=kernels_only)
    # b ends inside a's stretch, so a (not b) is what the GPU finished before waiting
    assert gaps[0].before == "a" and gaps[0].start_us == 10
    assert sum(g.dur_us for g in gaps) == (25 - 0) - (10 + 5 + (0 if kernels_only else 1))
