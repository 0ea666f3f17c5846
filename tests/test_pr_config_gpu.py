"""On a GPU: the graph config vLLM PR #44930 measured with (``GraphOptions.named("pr")``: budgets 64
to 4096, 16 items per replay) captures and replays under both ``cu_seqlens`` rules with no NaN, and
its replays equal eager on fresh random inputs: fp32 literally (rel. error ≤ 1e-4), bf16 judged
against a float32 copy of the same weights (within 1e-2, or no worse than transformers' own bf16).
Every call mixes item sizes; three of them are batches of more than 8 items."""

import gc

import pytest
import torch

from lfm2vl_lab.core.config import GraphOptions
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.packing import tokens_for
from lfm2vl_lab.core.plan import plan_config
from lfm2vl_lab.measure.workloads import random_processor_output
from lfm2vl_lab.model.hf import hf_image_features
from lfm2vl_lab.model.parity import float32_reference, lowp_parity, max_rel_error
from lfm2vl_lab.model.presets import Preset, build_model

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-4
BF16_TOL = 1e-2
PR_BUDGETS = [64, 256, 512, 1024, 2048, 4096]
TILE = (32, 32)  # a 512 px image or tile: 1024 patch rows, 256 tokens
RAGGED = [(16, 16), (24, 32), (8, 8), TILE, (12, 20), (16, 24), (20, 20), (32, 16), (12, 12), (8, 16)]
# call -> (patch grids, the replays per budget and per variant the "pr" set makes of them on LFM2-VL's
# processor geometry; the same plan runs on the CPU stand-in in tests/test_pr_config.py)
CALLS = {
    "16 tiles": ([TILE] * 16, {4096: 1}, {"dense16": 1}),
    "12 mixed": ([TILE] * 3 + [(16, 16)] * 6 + [(24, 20), (12, 16), (20, 32)], {2048: 1}, {"dense3+varlen": 1}),
    "20 ragged": (RAGGED * 2, {2048: 1, 256: 1}, {"dense2+varlen": 1, "varlen": 1}),
    "at 1024": ([TILE] * 2 + [(16, 16)] * 2, {1024: 1}, {"dense2+varlen": 1}),
    "at 512": ([TILE, (16, 24)], {512: 1}, {"dense1+varlen": 1}),
    "one small": ([(12, 16)], {64: 1}, {"varlen": 1}),
}
_MODELS = {}


@pytest.fixture(autouse=True)
def _free_graphs():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _model(preset, dtype):
    if (preset, dtype) not in _MODELS:
        _MODELS[preset, dtype] = build_model(preset, dtype=dtype, device="cuda")
    return _MODELS[preset, dtype]


def _fp32_copy(preset):
    """The float32 judge of the bf16 model (same weights)."""
    if (preset, "fp32-judge") not in _MODELS:
        _MODELS[preset, "fp32-judge"] = float32_reference(_model(preset, torch.bfloat16))
    return _MODELS[preset, "fp32-judge"]


def _pr_encoder(preset, dtype, rule):
    # fp32: FlashAttention varlen takes only half precision, so the exact block-mask path (as test_graphs)
    attention = "auto" if dtype != torch.float32 else "sdpa_blockmask"
    genc = GraphedEncoder(_model(preset, dtype), GraphOptions.named("pr", cu_seqlens_rule=rule, attention=attention))
    info = genc.capture()
    assert genc.config.max_items == 16 and genc.config.budgets == PR_BUDGETS
    assert [i["budget"] for i in info] == sorted(PR_BUDGETS, reverse=True)  # no extra run budget
    return genc


def _replayed_and_judged(genc, preset, dtype, shapes, seed):
    """Encode fresh random inputs; assert every item was replayed, finite, and at parity; return the
    replays per budget and per variant."""
    inputs = random_processor_output(shapes, preset, seed=seed)
    genc.reset_stats()
    outs = genc.encode(inputs)
    torch.cuda.synchronize()
    s = genc.stats
    assert (s.hits, s.misses, s.overflow) == (len(shapes), 0, 0), s.as_dict()
    assert all(torch.isfinite(o).all() for o in outs), "NaN or Inf in a replay's output"
    model = genc.model
    if dtype == torch.float32:
        for what, ref in (("eager", genc.encoder.encode(inputs)), ("transformers", hf_image_features(model, inputs))):
            err = max_rel_error(outs, ref)
            assert err <= FP32_TOL, f"replay vs {what}: rel error {err:.3g} > {FP32_TOL}"
    else:
        verdict = lowp_parity(outs, hf_image_features(model, inputs), hf_image_features(_fp32_copy(preset), inputs),
                              BF16_TOL)
        assert verdict["pass"], verdict
    return dict(s.replays), dict(s.variant_replays)


@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_pr_config_replays_equal_eager_450m(dtype, rule):
    genc = _pr_encoder("lfm2-vl-450m", dtype, rule)
    for i, (call, (shapes, replays, variants)) in enumerate(CALLS.items()):
        got = _replayed_and_judged(genc, "lfm2-vl-450m", dtype, shapes, seed=700 + i)
        assert got == (replays, variants), call
    del genc


@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
def test_pr_config_replays_equal_eager_3b(rule):
    try:
        Preset.from_name("lfm2-vl-3b")
    except ValueError as exc:
        pytest.skip(f"the lfm2-vl-3b preset is not in this checkout: {exc}")
    genc = _pr_encoder("lfm2-vl-3b", torch.bfloat16, rule)
    for i, (call, (shapes, _, _)) in enumerate(CALLS.items()):
        replays, _ = _replayed_and_judged(genc, "lfm2-vl-3b", torch.bfloat16, shapes, seed=800 + i)
        batches, eager = plan_config([tokens_for(s) for s in shapes], genc.config)
        assert eager == [] and sum(replays.values()) == len(batches), call
    del genc
