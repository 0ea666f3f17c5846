"""The correctness run's own logic on the CPU: the input generators it relies on, and the replay
verdict (literal replay-vs-eager error, judged against float32 in low precision)."""

import pytest
import torch

from lfm2vl_lab import GraphedEncoder, build_model, hf_image_features, random_processor_output
from lfm2vl_lab.measure.check import budget_cases, shapes_for_tokens
from lfm2vl_lab.model.parity import float32_reference, judge_replay


@pytest.mark.parametrize("tokens,max_items", [(1024, 4), (48, 1), (577, 17), (256, 1), (96, 3)])
def test_shapes_for_tokens_hit_the_token_count(tokens, max_items):
    shapes = shapes_for_tokens(tokens, max_items, seed=tokens)
    assert sum((h // 2) * (w // 2) for h, w in shapes) == tokens
    assert len(shapes) <= max_items
    assert all(h % 2 == 0 and w % 2 == 0 and (h // 2) * (w // 2) <= 256 for h, w in shapes)


def test_budget_cases_need_exactly_their_budget(tiny_model):
    budgets = GraphedEncoder(tiny_model).config.budgets  # the kit's automatic budgets
    assert len(budgets) >= 2
    cases = budget_cases(budgets)
    assert len(cases) == 2 * len(budgets)
    for k, b in enumerate(budgets):
        full, padded = cases[2 * k], cases[2 * k + 1]
        assert full == b
        assert min(x for x in budgets if x >= padded) == b and padded < b  # replayed with padding


@pytest.fixture(scope="module")
def bf16_case():
    model = build_model("tiny", dtype=torch.bfloat16, seed=4)
    inp = random_processor_output([(16, 16), (8, 12)], "tiny", seed=4)
    ref_model = float32_reference(model)
    return inp, ref_model, hf_image_features(model, inp), hf_image_features(ref_model, inp)


def test_judge_replay_identical_outputs_pass(bf16_case):
    inp, ref_model, eager, _ = bf16_case
    j = judge_replay([e.clone() for e in eager], eager, inp, 1e-2, ref_model)
    assert j["rel_err"] == 0 and j["literal_pass"] and j["pass"]
    assert j["rel_err_fp32"] == pytest.approx(j["eager_rel_err_fp32"])


def test_judge_replay_as_close_to_fp32_as_eager_passes_though_literal_fails(bf16_case):
    inp, ref_model, eager, ref32 = bf16_case
    # the same rounding error as eager's, in the other direction: twice eager's error from eager
    mirrored = [(2 * r - e.float()).to(e.dtype) for e, r in zip(eager, ref32, strict=True)]
    eager_err = max(((e.float() - r).norm() / r.norm()).item() for e, r in zip(eager, ref32, strict=True))
    tol = eager_err  # a line that the literal replay-vs-eager error (~2x) must cross
    j = judge_replay(mirrored, eager, inp, tol, ref_model)
    assert j["rel_err"] > tol and not j["literal_pass"]
    assert j["pass"], j


def test_judge_replay_worse_than_eager_fails(bf16_case):
    inp, ref_model, eager, _ = bf16_case
    g = torch.Generator().manual_seed(0)
    noisy = [e + 0.05 * e.float().std() * torch.randn(e.shape, generator=g).to(e.dtype) for e in eager]
    j = judge_replay(noisy, eager, inp, 1e-2, ref_model)
    assert j["rel_err_fp32"] > 1.05 * j["eager_rel_err_fp32"] and not j["pass"]


def test_judge_replay_nan_never_passes(bf16_case):
    inp, ref_model, eager, ref32 = bf16_case
    bad = [e.clone() for e in eager]
    bad[0][0, 0] = float("nan")
    assert not judge_replay(bad, eager, inp, 1e-2, ref_model)["pass"]
    assert not judge_replay(bad, eager, inp, 1e-2)["pass"]  # fp32 path: literal verdict


def test_check_measures_the_stamp_with_each_pointer_check(built_pointer_check, monkeypatch, tmp_path):
    """The check run times the stamp with torch's pointer check and with the C++ one, and its file says
    which one the recorded cost is; where the C++ one cannot be built it says why, and torch's is timed."""
    from lfm2vl_lab.core import ptrcheck
    from lfm2vl_lab.core.capture import eager_stand_in
    from lfm2vl_lab.measure import check
    from lfm2vl_lab.serving.engine import TextEngine

    monkeypatch.setitem(ptrcheck._CHOSEN, "ext", None)  # the run's choice changes: put it back afterwards
    model = build_model("tiny")
    genc = GraphedEncoder(model, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    eng = TextEngine(model, max_batch=1, max_len=64)
    eng.capture([(1, 20)], decode=False, record=eager_stand_in)
    seen = []  # what each timed call answered: the stamps must be current under both checks
    monkeypatch.setattr(check, "per_call_us", lambda fn: seen.append((genc.stamp.pointer_check, fn())) or 1.5)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", built_pointer_check[1])
    costs = check.stamp_costs(genc, eng)
    assert costs["pointer_check"] == genc.stamp.pointer_check == eng.stamp.pointer_check == "extension"
    assert set(costs["pointer_checks"]) == {"torch", "extension"} and costs["pointer_check_error"] is None
    assert seen == [("torch", True), ("torch", None), ("extension", True), ("extension", None)]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing built there, and no compiler
    monkeypatch.setenv("CXX", "no-such-compiler")
    costs = check.stamp_costs(genc, eng)
    assert costs["pointer_check"] == genc.stamp.pointer_check == "torch" and set(costs["pointer_checks"]) == {"torch"}
    assert costs["pointer_check_error"].startswith("no C++ compiler") and costs["encode_stamp_us"] == 1.5
