"""The TTFT grid (measure/ttft.py) on the tiny preset: the rows a user reads (both modes named, phases
that add up, paired cuts, the decode control), parity against ``generate`` and float32, and the
targets judged from rows."""

import warnings

import pytest
import torch

from lfm2vl_lab.measure import ttft


@pytest.fixture(scope="module")
def grid():
    from lfm2vl_lab import build_model
    from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
    from lfm2vl_lab.serving.engine import TextEngine

    model = build_model("tiny", text_layers="full")
    genc, engine = GraphedEncoder(model), TextEngine(model, max_batch=2, max_len=2048)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no CUDA device: packed eager encoder"
        rows = ttft.run_ttft(model, genc, engine, images=("1x512",), requests=(1, 2), repeats=2, decode_tokens=2,
                             progress=False)
        parity = ttft.ttft_parity(model, ttft.build_pipelines(model, genc, engine), new_tokens=3)
    return model, rows, parity


def test_rows_name_both_modes_and_add_up(grid):
    _, rows, _ = grid
    assert len(rows) == 2 * 4
    assert {(r["text_mode"], r["encoder_mode"]) for r in rows} == {(t, e) for t in ("eager", "graphed")
                                                                  for e in ("eager", "graphed")}
    for r in rows:
        assert list(r["phases_ms"]) == ["processor", "h2d", "encoder", "merge", "prefill", "sample"]
        assert len(r["ttft_samples_ms"]) == 2 and r["decode_ms_per_token"] > 0
        # the phases are parts of the timed call: they cannot add up to more than the request
        assert sum(r["phases_ms"].values()) <= r["request_ms"] * 1.05 + 0.5
        assert r["ttft_ms"] < r["request_ms"]  # the processor is left out of TTFT
        assert r["same_first_tokens"] and r["same_decode_tokens"]
        if "graphed" in (r["text_mode"], r["encoder_mode"]):
            assert r["note"].startswith("no CUDA graphs captured")  # on the CPU the graphed modes say so
    graphed_encoder = [r for r in rows if r["encoder_mode"] == "graphed"]
    assert all("encoder_graph_cut" in r and "decode_drift" in r for r in graphed_encoder)
    assert all("encoder_graph_cut" not in r for r in rows if r["encoder_mode"] == "eager")


def test_parity_against_generate_and_fp32(grid):
    _, _, parity = grid
    assert [(p["image"], p["requests"]) for p in parity] == list(ttft.PARITY_CASES)
    for p in parity:
        for m, r in p["modes"].items():
            assert r["ok"] and r["matching_tokens"] == 3, (p["image"], m, r)
            assert r["rel_err_vs_fp32"] < 1e-5  # fp32 on the CPU: the same numbers as transformers


def _row(text, enc, ttft_ms, cut=None, same=True):
    r = {"preset": "lfm2-vl-450m", "image": "1x512", "requests": 1, "mode": ttft.mode_name(text, enc),
         "text_mode": text, "encoder_mode": enc, "ttft_ms": ttft_ms, "same_first_tokens": same,
         "decode_ms_per_token": 0.9}
    if cut is not None:
        r["encoder_graph_cut"] = cut
    return r


def test_judge_reads_each_target():
    rows = [_row("eager", "eager", 26.0), _row("eager", "graphed", 21.0, cut=0.19),
            _row("graphed", "eager", 9.0), _row("graphed", "graphed", 6.5, cut=0.28)]
    image_path = [{"workload": "1x512", "kind": "encode_sources", "ratio": 1.2},
                  {"workload": "tiled", "kind": "encode_sources", "ratio": 2}]  # tiled is not a target workload
    got = {t["target"]: t["ok"] for t in ttft.judge_ttft(rows, image_path)}
    assert got == {"encoder graphs' TTFT cut, text graphed": False, "TTFT ms, both graphed": False,
                   "encoder graphs' TTFT cut, text eager": True, "encode() CPU input / GPU input, 1x512": False,
                   "every mode's first tokens equal eager's": True,
                   "decode ms per token, both graphed, lfm2-vl-450m": False}
    rows[3].update(ttft_ms=2.0, encoder_graph_cut=0.5, same_first_tokens=False, decode_ms_per_token=0.3)
    rows.append(dict(rows[3], preset="lfm2-vl-1.6b", decode_ms_per_token=0.81, same_first_tokens=True))
    judged = {t["target"]: t for t in ttft.judge_ttft(rows)}
    assert judged["TTFT ms, both graphed"]["ok"] and judged["encoder graphs' TTFT cut, text graphed"]["ok"]
    assert judged["decode ms per token, both graphed, lfm2-vl-450m"]["ok"]
    assert not judged["decode ms per token, both graphed, lfm2-vl-1.6b"]["ok"]
    assert not judged["every mode's first tokens equal eager's"]["ok"]
    first = "every mode's first tokens equal eager's"
    assert judged[first]["detail"] == "lfm2-vl-450m 1x512 x1 text-graphed+encoder-graphed"
    parity = [{"preset": "lfm2-vl-450m", "image": "1x512", "requests": 1, "fp32_top2_margin": [0.004],
               "modes": {rows[3]["mode"]: {"ok": False, "first_token_as_fp32": True}}}]
    judged = {t["target"]: t for t in ttft.judge_ttft(rows, parity=parity)}
    assert "its first token is float32's: True; float32's top-2 margin 0.004" in judged[first]["detail"]
    assert not judged["every mode passes parity (tokens vs generate, logits vs fp32)"]["ok"]


def test_phase_clock_on_cpu():
    clock = ttft.PhaseClock("cpu")
    clock.start()
    torch.ones(100).sum()
    clock.mark("a")
    clock.mark("b")
    ph = clock.phases()
    assert list(ph) == ["a", "b"] and all(v >= 0 for v in ph.values())


def test_grid_refuses_bad_counts(grid):
    model = grid[0]
    with pytest.raises(ValueError, match="decode_tokens=0"):
        ttft.run_ttft(model, None, None, decode_tokens=0)
