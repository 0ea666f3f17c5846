"""End-to-end harness on the CPU (tiny preset, real text depth): the prompt has one placeholder per
image token, the plug-in path gives transformers' logits, and a timed row has every field."""

import pytest
import torch

from lfm2vl_lab import GraphedEncoder, build_model, process_images, synthetic_image
from lfm2vl_lab.e2e import build_prompt, logits_parity, run_e2e


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
    rows = run_e2e(tiny_full, images=("1x512",), requests=(1,), new_tokens=(2,), repeats=1, progress=False,
                   on_row=seen.append)
    assert [r["mode"] for r in rows] == ["hf-eager", "lab-graph"] and seen == rows
    for r in rows:
        assert r["ttft_ms"] > 0 and r["total_2_ms"] > 0 and r["encoder_ms"] > 0
        assert r["encoder_share_of_ttft"] == pytest.approx(r["encoder_ms"] / r["ttft_ms"])
        assert r["items"] == 1 and r["prompt_len"] > 256
