"""Whole requests and the offline-throughput run (measure/request.py) on the tiny preset: the rows a
user reads (measured where the text model is graphed, composed where it is eager), prompts of
different lengths in one batch giving each request's own tokens, the throughput numbers, and the
PR-claim sentence computed from a file."""

import warnings

import pytest
import torch

from lfm2vl_lab.measure import request, ttft


@pytest.fixture(scope="module")
def setup():
    from lfm2vl_lab import build_model
    from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
    from lfm2vl_lab.serving.engine import TextEngine

    model = build_model("tiny", text_layers="full")
    genc, engine = GraphedEncoder(model), TextEngine(model, max_batch=8, max_len=2048)
    pipes = ttft.build_pipelines(model, genc, engine)
    return model, genc, engine, pipes


@pytest.fixture(scope="module")
def rows(setup):
    model, genc, engine, _ = setup
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no CUDA device: packed eager encoder"
        return request.run_requests(model, genc, engine, images=("1x512",), requests=(1, 2), repeats=2,
                                    decode_tokens=2, new_tokens=6, progress=False)


def test_whole_requests_measured_where_text_is_graphed_composed_where_eager(rows):
    assert len(rows) == 2 * 4
    for r in rows:
        assert r["e2e_tokens"] == 6
        assert r["e2e_composed_ms"] == pytest.approx(r["request_ms"] + 5 * r["decode_ms_per_token"])
        if r["text_mode"] == "graphed":
            assert r["e2e_source"] == "measured" and len(r["e2e_samples_ms"]) == 2
            # the whole call, phase by phase: the decode of the five tokens after the first is one of them
            assert list(r["e2e_phases_ms"])[-1] == "decode" and r["e2e_ms"] > 0
        else:
            assert r["e2e_source"] == "composed" and r["e2e_ms"] == r["e2e_composed_ms"]
    graphed_enc = [r for r in rows if r["encoder_mode"] == "graphed"]
    assert all("e2e_cut" in r and r["e2e_cut"] < 1 for r in graphed_enc)
    assert all("e2e_cut" not in r for r in rows if r["encoder_mode"] == "eager")
    both = [r for r in rows if r["mode"] == ttft.mode_name("graphed", "graphed")]
    assert all(r["same_e2e_tokens"] for r in both)


def test_run_requests_refuses_one_token():
    with pytest.raises(ValueError, match="new_tokens >= 2"):
        request.run_requests(None, None, None, new_tokens=1)


def test_ragged_batch_gives_each_request_its_own_tokens(setup):
    """Prompts of different lengths, right-padded in one batch, decode as each would alone."""
    from lfm2vl_lab.measure.workloads import synthetic_image
    from lfm2vl_lab.model.inputs import process_images

    model, _, _, pipes = setup
    pipe = pipes[ttft.mode_name("graphed", "graphed")]
    imgs = [synthetic_image(512, 512, seed=3), synthetic_image(256, 384, seed=4)]
    prompts = [request.request_prompt(model, im) for im in imgs]
    ids, lengths = request.batch_prompts(prompts)
    assert lengths[0] != lengths[1] and ids.shape == (2, max(lengths))
    assert (ids[1, lengths[1]:] == request.PAD_ID).all()
    together = pipe.run(ids, process_images(imgs, model), 4, lengths=lengths)
    for i, (im, p) in enumerate(zip(imgs, prompts)):
        alone = pipe.run(p[None], process_images([im], model), 4)
        assert torch.equal(together[i], alone[0]), i


def test_ragged_lengths_are_checked(setup):
    from lfm2vl_lab.measure.workloads import synthetic_image
    from lfm2vl_lab.model.inputs import process_images

    model, _, _, pipes = setup
    pipe = pipes[ttft.mode_name("graphed", "graphed")]
    img = synthetic_image(512, 512, seed=3)
    p = request.request_prompt(model, img)
    with pytest.raises(ValueError, match="do not fit 1 prompt rows"):
        pipe.run(p[None], process_images([img], model), 2, lengths=[p.numel() + 1])


def test_throughput_run_counts_requests_and_tokens(setup):
    model, _, engine, pipes = setup
    tp = request.throughput_run(model, pipes, engine, requests=5, batch=4, new_tokens=3, passes=1)
    assert tp["requests"] == 5 and len(tp["image_sizes"]) == 5 and len(tp["padded_lens"]) == 2  # batches of 4 + 1
    assert set(tp["modes"]) == {ttft.mode_name("graphed", e) for e in ("eager", "graphed")}
    for r in tp["modes"].values():
        assert r["tokens_per_s"] == pytest.approx(3 * r["requests_per_s"])
        assert r["requests_per_s"] == pytest.approx(5 / r["pass_s"])
    assert len({tuple(s) for s in tp["image_sizes"]}) > 1  # mixed sizes from the workload bands
    with pytest.raises(ValueError, match="max_batch"):
        request.throughput_run(model, pipes, engine, requests=4, batch=16)


def _row(preset, image, n, text, enc, e2e, cut=None):
    r = {"preset": preset, "image": image, "requests": n, "mode": ttft.mode_name(text, enc), "text_mode": text,
         "encoder_mode": enc, "e2e_tokens": 128, "e2e_ms": e2e, "e2e_source": "measured" if text == "graphed"
         else "composed", "e2e_composed_ms": e2e * 1.01, "request_ms": 10.0, "decode_ms_per_token": 1.0}
    if cut is not None:
        r["e2e_cut"] = cut
    return r


def test_like_for_like_sentence_from_a_file():
    rows = [_row("lfm2-vl-3b", im, n, "graphed", "graphed", 100.0, cut) for im, n, cut in
            (("1x512", 1, 0.123), ("1x512", 2, 0.1), ("1x512", 4, 0.05), ("tiled", 1, 0.2))]
    res = {"rows": rows, "setup": [{"preset": "lfm2-vl-3b", "graph_config": "pr"}]}
    s = request.like_for_like(res)
    assert "LFM2-VL-3B with the PR's graph config" in s and "128 output tokens" in s
    assert "12.3% at 1 request, 10.0% at 2 requests, 5.0% at 4 requests with one 512 px image" in s
    assert "20.0% at 1 request" in s and "10–20%" in s and "runs in vLLM's place" in s
    assert "No whole-request rows" in request.like_for_like({"rows": [], "setup": []})


def test_the_composition_is_checked_against_a_measured_cell_only():
    eager = _row("lfm2-vl-3b", "1x512", 1, "graphed", "eager", 200.0)
    graphed = _row("lfm2-vl-3b", "1x512", 1, "graphed", "graphed", 180.0, cut=0.12)
    eager["e2e_composed_ms"], graphed["e2e_composed_ms"] = 210.0, 168.0
    c = request.composition_check(eager, graphed)
    assert c["composed_ms"] == (210.0, 168.0) and c["cut"] == pytest.approx(0.2)
    assert c["ms_error"] == pytest.approx((0.05, -1 / 15)) and c["cut_error"] == pytest.approx(0.08)
    composed = _row("lfm2-vl-3b", "1x512", 1, "eager", "graphed", 180.0, cut=0.1)
    assert request.composition_check(_row("lfm2-vl-3b", "1x512", 1, "eager", "eager", 200.0), composed) is None
    lines = request.e2e_text({"rows": [eager, graphed, _row("lfm2-vl-3b", "1x512", 1, "eager", "eager", 200.0),
                                       composed]})
    assert "cut  12.0% (measured; composed 20.0%, +8.0 points)" in lines and "cut  10.0% (composed)" in lines


def test_judge_requests_pr_capture(rows):
    res = {"rows": rows, "setup": [{"preset": "tiny", "graph_config": "pr",
                                    "encoder_capture": [{"capture_s": 2.0, "total_mb": 10.0},
                                                        {"capture_s": 4.0, "total_mb": 5.0}]}]}
    by = {t["target"]: t for t in request.judge_requests(res)}
    assert list(by) == ["the PR's budget set captures in s, tiny"]  # only goals a measurement can miss
    cap = by["the PR's budget set captures in s, tiny"]
    assert cap["value"] == 6.0 and not cap["ok"] and "15 MiB" in cap["detail"]


def test_goals_of_an_older_file_leave_out_what_only_said_it_was_recorded():
    old = [{"target": "whole requests at 1, 2 and 4 requests, encoder graphs on and off, x", "value": True,
            "limit": True, "ok": True}, {"target": "the PR's budget set's graph memory is reported, MiB, x",
                                         "value": 7.0, "limit": 0, "ok": True},
           {"target": "every mode passes parity (tokens vs generate, logits vs fp32)", "value": False, "limit": True,
            "ok": False}]
    assert [t["target"] for t in request.goals_of({"targets": old})] == [old[2]["target"]]
