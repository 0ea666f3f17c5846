"""The vllm file's A/B frame and breakdown figure, drawn from a synthetic file of the recorded shape (the recorded
run itself is checked through the reference set: tests/test_tables.py, tests/test_figures.py)."""

from __future__ import annotations

import random

import pytest

from lfm2vl_lab.measure import vllm_ab as ab
from lfm2vl_lab.report.plots import NoData
from lfm2vl_lab.report.vllm_report import vllm_breakdown_figure


def fake_result(presets=("lfm2-vl-450m", "lfm2-vl-3b"), rounds: int = 6) -> dict:
    """A ``vllm`` file's shape with made-up numbers: vLLM's TTFT 40 ms, cut by 35% (PR) and 30% (kit)."""
    rng = random.Random(0)
    rows, secs = [], {}
    for preset in presets:
        for engine, base in (("vllm", 40.0), ("kit", 8.0)):
            for image, n in ab.CASES:
                for tokens in ab.TOKENS:
                    samples = {arm: {"ttft_ms": [base * k * rng.uniform(0.97, 1.03) for _ in range(rounds)],
                                     "e2e_ms": [(base + 2.8 * tokens) * (1 - (1 - k) * base / (base + 2.8 * tokens))
                                                * rng.uniform(0.99, 1.01) for _ in range(rounds)]}
                               for arm, k in (("off", 1.0), ("pr", 0.65), ("kit", 0.7))}
                    for r in ab.case_rows(preset, image, n, tokens, samples):
                        r["engine"] = engine
                        if engine == "kit":
                            enc = 4.0 if r["arm"] == "off" else 1.0
                            r["phases_ms"] = {"processor": 3.5, "h2d": 0.2, "encoder": enc, "merge": 0.1,
                                              "prefill": 1.2, "sample": 0.1}
                        rows.append(r)
        part = {"ttft_ms": 40.0, "processor_ms": 6.0, "queue_ms": 0.5, "scheduled_to_first_ms": 25.0,
                "encoder_gpu_ms": 9.0, "encoder_host_ms": 9.5, "rest_ms_composed": 8.5}
        secs[preset] = {"engines": {a: {"start_s": 45.0} for a in ab.ARMS},
                        "breakdown": {f"{a}/{im}": part for a in ab.ARMS for im in ("1x512", "tiled")}}
    return {"name": "vllm", "provenance": {"vllm": "0.25.1", "dtype": "bfloat16"}, "presets": secs, "rows": rows}


def test_the_breakdown_figure_stacks_vllms_parts_and_the_kits_phases():
    fig = vllm_breakdown_figure(fake_result(presets=("lfm2-vl-450m",)), title="t")
    ax = fig.get_axes()[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks[0] == "vLLM, encoder eager" and ticks[-1] == "kit's pipeline, encoder graphs, kit config"
    widths = sorted({round(p.get_width(), 3) for p in ax.patches})
    assert 16.0 in widths  # the rest of vLLM's step: 25 ms from scheduled to the first token, less 9 ms encoder
    assert any("TTFT 40.0 ms" in t.get_text() for t in ax.texts)


def test_a_file_without_an_ab_has_no_figure():
    with pytest.raises(NoData, match="no vLLM A/B"):
        vllm_breakdown_figure({"presets": {}, "rows": []})


@pytest.mark.parametrize(("cap", "shown"), [
    ({"graphs": 6, "pool_mib": 412.0, "reserved_mib": 0.0}, "412"),
    ({"graphs": 6, "reserved_mib": 96.0}, "96"),
    ({"graphs": 6, "reserved_mib": 0.0, "device_mib": 0.0}, "not seen"),
    ({"graphs": 0, "reserved_mib": None}, None),
])
def test_the_engines_table_never_shows_an_unseen_capture_as_0_mib(cap, shown):
    # A capture into blocks the allocator already held reserves nothing new: 0 there is no size.
    from lfm2vl_lab.report.tables_vllm import _capture_mib

    assert _capture_mib(cap) == shown


def test_the_a_b_frame_holds_each_arm_s_medians_and_cuts_smallest_model_first():
    from lfm2vl_lab.report.vllm_report import ab_frame, find

    res = fake_result(presets=("lfm2-vl-3b", "lfm2-vl-450m"))  # recorded largest first
    first = find(res, "vllm", "lfm2-vl-450m", "1x512", ab.TOKENS[0], "pr")
    res["rows"].append(dict(first, ttft_ms=999.0))  # the same row again: the first one counts, as find's
    df = ab_frame(res)
    assert df.index.names == ["preset", "case", "tokens", "engine"]
    assert df.index[0] == ("lfm2-vl-450m", "1x512", ab.TOKENS[0], "vLLM")
    assert len(df) == 2 * len(ab.CASES) * len(ab.TOKENS) * 2  # presets × cases × output lengths × engines
    row = df.loc[("lfm2-vl-450m", "1x512", ab.TOKENS[0], "vLLM")]
    assert row["TTFT ms, pr"] == round(first["ttft_ms"], 1)
    assert row["TTFT cut %, pr"] == round(100 * first["ttft_cut"]["cut"], 1)
    lo, hi = first["e2e_cut"]["ci"]
    assert row["e2e cut 95%, pr"] == f"{100 * lo:.1f} to {100 * hi:.1f}"
    assert "TTFT cut %, off" not in df.columns  # encoder eager is what the cuts are taken against
