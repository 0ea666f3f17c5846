"""End-to-end harness on the CPU (tiny preset, real text depth): the prompt has one placeholder per
image token, the plug-in path gives transformers' logits, and a timed row has every field."""

import statistics

import pytest

from lfm2vl_lab import GraphedEncoder, build_model, process_images, synthetic_image
from lfm2vl_lab.measure.e2e import (
    NO_GRAPHS_NOTE,
    build_prompt,
    generate_once,
    logits_parity,
    paired_reduction,
    run_e2e,
    timed_image_features,
)


@pytest.fixture(scope="module")
def tiny_full():
    return build_model("tiny", text_layers="full", seed=3)


def test_prompt_has_one_placeholder_per_image_token(tiny_full):
    inputs = process_images([synthetic_image(1024, 768, seed=1)], "tiny")
    batch = build_prompt(tiny_full, inputs, n_requests=2)
    tokens = sum((h // 2) * (w // 2) for h, w in inputs["spatial_shapes"].tolist())
    assert batch["input_ids"].shape[0] == 2
    assert (batch["input_ids"] == tiny_full.config.image_token_id).sum(dim=1).tolist() == [tokens, tokens]
    assert batch["pixel_values"].shape[0] == 2 * inputs["pixel_values"].shape[0]


def test_plugged_in_encoder_gives_transformers_logits(tiny_full):
    genc = GraphedEncoder(tiny_full)
    res = logits_parity(tiny_full, genc, n_requests=2)
    assert res["finite"] and res["same_first_token"]
    assert res["rel_err"] <= 1e-4  # fp32 on the CPU
    assert genc.stats.eager_calls == 1  # the plug-in path really ran (eagerly: no CUDA here)


def test_run_e2e_rows(tiny_full):
    seen = []
    genc = GraphedEncoder(tiny_full)
    rows = run_e2e(tiny_full, images=("1x512",), requests=(1,), new_tokens=(2, 4, 4), repeats=3, genc=genc,
                   progress=False, on_row=seen.append)
    # no CUDA here: nothing was captured, so the second row says what really ran
    assert [r["mode"] for r in rows] == ["hf-eager", "lab-eager"] and seen == rows
    assert rows[1]["note"] == NO_GRAPHS_NOTE and "note" not in rows[0]
    # every generate call went through the packed encoder once: TTFT, then totals for 2 and 4 new tokens
    # (the repeated 4 is measured once), each 1 warm-up + 3 timed calls
    assert genc.stats.eager_calls == 3 * (1 + 3)
    for r in rows:
        assert r["ttft_ms"] > 0 and r["total_2_ms"] > 0 and r["total_4_ms"] > 0 and r["encoder_ms"] > 0
        # the encoder is timed inside the same TTFT calls, so its share can never pass 100%
        assert len(r["encoder_samples_ms"]) == 3
        assert all(0 < e <= t for e, t in zip(r["encoder_samples_ms"], r["ttft_samples_ms"], strict=True))
        assert r["encoder_ms"] == pytest.approx(statistics.median(r["encoder_samples_ms"]))
        assert r["encoder_share_of_ttft"] == pytest.approx(r["encoder_ms"] / r["ttft_ms"])
        assert 0 < r["encoder_share_of_ttft"] <= 1
        assert r["items"] == 1 and r["prompt_len"] > 256
        assert len(r["ttft_samples_ms"]) == 3 and r["ttft_ms"] == pytest.approx(sorted(r["ttft_samples_ms"])[1])
        assert r["decode_ms_per_token"] == pytest.approx((r["total_4_ms"] - r["total_2_ms"]) / 2)
    base, lab = rows
    assert base["ttft_reduction"] == 0.0
    assert lab["ttft_reduction"] == pytest.approx(1 - lab["ttft_ms"] / base["ttft_ms"])
    assert lab["ttft_reduction_paired"] == pytest.approx(
        paired_reduction(base["ttft_samples_ms"], lab["ttft_samples_ms"]))
    assert lab["decode_drift"] == pytest.approx(lab["decode_ms_per_token"] / base["decode_ms_per_token"] - 1)


def test_timed_image_features_times_the_installed_path_and_restores_it(tiny_full):
    genc = GraphedEncoder(tiny_full)
    inputs = process_images([synthetic_image(256, 256, seed=2)], "tiny")
    batch = build_prompt(tiny_full, inputs, n_requests=1)
    inner = tiny_full.model
    samples = []
    with genc.installed(), timed_image_features(tiny_full, samples):
        generate_once(tiny_full, batch, 1)
        assert genc.stats.eager_calls == 1  # the timer wraps the graphed encoder, it does not replace it
    assert len(samples) == 1 and samples[0] > 0
    assert "get_image_features" not in inner.__dict__  # both overrides undone, in order
    with timed_image_features(tiny_full, samples):
        pass  # no encoder call: 0 ms
    assert samples[1] == 0 and "get_image_features" not in inner.__dict__


def test_paired_reduction_is_the_median_of_pair_ratios():
    # one disturbed round (the second) moves the ratio of medians, not the median of pair ratios
    base, new = [10.0, 30.0, 10.0], [9.0, 9.0, 9.0]
    assert paired_reduction(base, new) == pytest.approx(0.1)
    assert 1 - statistics.median(new) / statistics.median(base) == pytest.approx(0.1)  # same here: 9 vs 10
    assert paired_reduction([10.0, 30.0, 20.0], [9.0, 9.0, 30.0]) == pytest.approx(0.1)  # medians: 9 vs 20 -> 0.55


def test_time_paired_alternates_order_and_enters_contexts():
    from contextlib import contextmanager

    from lfm2vl_lab.measure.timing import time_paired

    calls, inside = [], []

    @contextmanager
    def ctx():
        inside.append(True)
        yield
        inside.append(False)

    out = time_paired({"a": lambda: calls.append("a"), "b": (lambda: calls.append(("b", inside[-1])), ctx)},
                      repeats=4, warmup=1, device="cpu")
    assert [len(v) for v in out.values()] == [4, 4] and all(t >= 0 for v in out.values() for t in v)
    names = [c if isinstance(c, str) else c[0] for c in calls]
    assert names == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then alternating rounds
    assert all(c[1] for c in calls if isinstance(c, tuple)), "b must run inside its context"
    assert inside[-1] is False


def test_profile_ttft_splits_encoder_and_text(tiny_full):
    from lfm2vl_lab.measure.e2e import profile_ttft

    genc = GraphedEncoder(tiny_full)
    prof = profile_ttft(tiny_full, genc, iters=1)
    assert (prof["image"], prof["requests"]) == ("1x512", 1)
    assert "lab-graph" not in prof  # nothing captured on the CPU: the packed eager encoder ran
    for mode in ("hf-eager", "lab-eager"):
        t, e, x = prof[mode]["ttft"], prof[mode]["encoder"], prof[mode]["text"]
        assert t["wall_ms"] > 0 and e["wall_ms"] > 0
        assert x["wall_ms"] == pytest.approx(t["wall_ms"] - e["wall_ms"])
        assert t["kernels"] == 0  # no GPU here: nothing on a GPU lane to count
    assert genc.stats.eager_calls >= 2  # the lab-graph TTFT really went through the swapped encoder
