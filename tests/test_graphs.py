"""Graph config, padding logics, batch planning and the graph manager (CPU parts + GPU parts)."""

import random
import warnings

import pytest
import torch

from lfm2vl_lab import (
    EncoderGraphConfig,
    GraphedEncoder,
    auto_budgets,
    build_model,
    hf_image_features,
    plan_batches,
    process_images,
    random_processor_output,
    rel_error,
    synthetic_image,
    synthetic_workload,
)
from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.config import pad_cu_seqlens_repeat_last, safe_cu_seqlens
from lfm2vl_lab.core.dense import DenseGraphConfig, leading_full_items
from lfm2vl_lab.core.encoder import PackedVisionEncoder
from lfm2vl_lab.core.lfm2vl import VARLEN, Variant, check_finite_items
from lfm2vl_lab.core.manager import GraphStats, pad_default
from lfm2vl_lab.core.packing import lfm2vl_cu_seqlens, lfm2vl_gather_idx, tokens_for
from lfm2vl_lab.core.plan import plan_config
from lfm2vl_lab.core.staging import PixelItems, row_offsets
from lfm2vl_lab.measure.meter import graph_memory, measured_capture, pool_bytes
from lfm2vl_lab.model.parity import float32_reference, judge_replay

FP32_TOL = 1e-4
BF16_TOL = 1e-2
DEFAULT_BUDGETS = [64, 128, 256, 512, 1024]


def _assert_parity(outs, refs, tol):
    assert len(outs) == len(refs)
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape, f"item {i}: {tuple(o.shape)} vs {tuple(r.shape)}"
        assert not torch.isnan(o).any(), f"item {i}: NaN in the output"
        err = rel_error(o, r)
        assert err <= tol, f"item {i}: rel error {err:.3g} > {tol}"


def _tokens(shapes):
    return [tokens_for(s) for s in shapes]


# --------------------------------------------------------------------------------------------
# Budgets and the config
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lo,hi,expected",
    [(64, 1024, [64, 128, 256, 512, 1024]), (64, 800, [64, 128, 256, 512, 800]), (64, 64, [64]),
     (32, 100, [32, 64, 100])],
)
def test_auto_budgets(lo, hi, expected):
    assert auto_budgets(lo, hi) == expected


@pytest.mark.parametrize("lo,hi,bad", [(0, 1024, "min=0"), (64, -1, "max=-1"), (128, 64, "128")])
def test_auto_budgets_errors(lo, hi, bad):
    with pytest.raises(ValueError, match=bad):
        auto_budgets(lo, hi)


def test_config_auto_values():
    cfg = EncoderGraphConfig.build(out_hidden_size=64)
    assert cfg.budgets == DEFAULT_BUDGETS
    assert cfg.max_items == 16  # min(1024 // 64, min(budgets)=64)
    assert cfg.cu_seqlens_rule == "safe" and cfg.max_seqlen_mode == "tight"
    assert [cfg.rows(b) for b in cfg.budgets] == [256, 512, 1024, 2048, 4096]
    assert [cfg.max_seqlen(b) for b in cfg.budgets] == [256, 512, 1024, 1024, 1024]
    loose = EncoderGraphConfig.build(out_hidden_size=64, max_seqlen_mode="loose")
    assert [loose.max_seqlen(b) for b in loose.budgets] == [256, 512, 1024, 2048, 4096]
    assert cfg.budget_for(1) == 64 and cfg.budget_for(64) == 64 and cfg.budget_for(65) == 128
    assert cfg.budget_for(1024) == 1024 and cfg.budget_for(1025) is None
    # budgets are sorted; the item limit follows the smallest budget
    cfg2 = EncoderGraphConfig.build(out_hidden_size=8, budgets=[512, 64, 128])
    assert cfg2.budgets == [64, 128, 512] and cfg2.max_items == 8


def test_config_cu_size_leaves_room_for_dummies():
    cfg = EncoderGraphConfig.build(out_hidden_size=64)
    for b in cfg.budgets:
        dummies = -(-cfg.rows(b) // cfg.max_seqlen(b))
        assert cfg.cu_size(b) == cfg.slots(b) + 1 + dummies


def test_slots_per_budget_and_budget_choice_by_items():
    cfg = EncoderGraphConfig.build(out_hidden_size=64)  # [64..1024], max_items 16, 64 tokens per item at least
    assert [cfg.slots(b) for b in cfg.budgets] == [1, 2, 4, 8, 16]
    # few slots in small graphs: two small items (32 tokens) need the 128 graph, five need 512
    assert cfg.budget_for(32, 1) == 64 and cfg.budget_for(32, 2) == 128 and cfg.budget_for(32, 5) == 512
    assert cfg.budget_for(100, 17) is None
    # the largest budget always takes max_items, so every batch plan_batches forms fits it
    small = EncoderGraphConfig.build(out_hidden_size=64, budgets=[64, 128], max_items=8)
    assert small.slots(128) == 8 and small.budget_for(100, 8) == 128


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(budgets=[], max_items=1), "empty"),
        (dict(budgets=[64, 0], max_items=1), "0"),
        (dict(budgets=[64, -128], max_items=1), "-128"),
        (dict(budgets=[64, 64], max_items=1), "duplicates"),
        (dict(budgets=[64, 12.5], max_items=1), "12.5"),
        (dict(budgets=[64, 256], max_items=65), "max_items=65"),
        (dict(budgets=[64, 256], max_items=0), "0"),
        (dict(budgets=[64], max_items=1, cu_seqlens_rule="zeros"), "zeros"),
        (dict(budgets=[64], max_items=1, max_seqlen_mode="huge"), "huge"),
    ],
)
def test_config_errors_name_the_bad_value(kwargs, needle):
    with pytest.raises(ValueError) as e:
        EncoderGraphConfig(out_hidden_size=64, **kwargs)
    assert needle in str(e.value)


def test_config_max_items_invariant_mentions_min_budget():
    with pytest.raises(ValueError) as e:
        EncoderGraphConfig.build(out_hidden_size=64, budgets=[128, 256], max_items=200)
    assert "200" in str(e.value) and "128" in str(e.value)


# --------------------------------------------------------------------------------------------
# Padding logics
# --------------------------------------------------------------------------------------------


def _check_safe(dst, src, total_rows, max_seqlen):
    cu = dst.tolist()
    n = len(src)
    assert cu[:n] == src.tolist()
    assert cu[-1] == total_rows, "safe rule: cu_seqlens[-1] must equal the rows passed to the kernel"
    diffs = [b - a for a, b in zip(cu, cu[1:])]
    assert all(d >= 0 for d in diffs), "cu_seqlens must not decrease"
    assert all(d <= max_seqlen for d in diffs[n - 1 :]), f"a dummy sequence is longer than max_seqlen: {diffs}"


@pytest.mark.parametrize(
    "budget,shapes",
    [
        (1024, [(2, 2)]),  # 4 real rows in a 4096-row buffer: three 1024-row dummies + one of 1020
        (512, [(4, 6), (32, 32)]),
        (256, [(32, 32)]),  # exactly full: no dummy
        (128, [(8, 8), (4, 6)]),  # two items: the 64 graph has one slot, so the 128 graph takes them
        (64, [(8, 8)]),
    ],
)
def test_safe_cu_seqlens_rule(budget, shapes):
    cfg = EncoderGraphConfig.build(out_hidden_size=64)
    rows, ms = cfg.rows(budget), cfg.max_seqlen(budget)
    dst = torch.full((cfg.cu_size(budget),), -7, dtype=torch.int32)
    src = lfm2vl_cu_seqlens(shapes)
    cfg.padding_logics["cu_seqlens"](dst, safe_cu_seqlens(src, rows, ms))
    _check_safe(dst, src, rows, ms)


def test_safe_cu_seqlens_exact_buffer():
    dst = torch.zeros(8, dtype=torch.int32)
    pad_cu_seqlens_repeat_last(dst, safe_cu_seqlens(torch.tensor([0, 4], dtype=torch.int32), 4096, 1024))
    assert dst.tolist() == [0, 4, 1028, 2052, 3076, 4096, 4096, 4096]


def test_safe_cu_seqlens_loose_max_seqlen():
    cfg = EncoderGraphConfig.build(out_hidden_size=64, max_seqlen_mode="loose")
    dst = torch.zeros(cfg.cu_size(1024), dtype=torch.int32)
    src = safe_cu_seqlens(torch.tensor([0, 24, 1048], dtype=torch.int32), cfg.rows(1024), cfg.max_seqlen(1024))
    pad_cu_seqlens_repeat_last(dst, src)
    assert dst.tolist()[:4] == [0, 24, 1048, 4096] and set(dst.tolist()[3:]) == {4096}


def test_safe_cu_seqlens_too_small_buffer():
    src = safe_cu_seqlens(torch.tensor([0, 4], dtype=torch.int32), 4096, 1024)
    with pytest.raises(ValueError, match="do not fit a buffer of 3"):
        pad_cu_seqlens_repeat_last(torch.zeros(3, dtype=torch.int32), src)


def test_repeat_last_cu_seqlens_rule():
    cfg = EncoderGraphConfig.build(out_hidden_size=64, cu_seqlens_rule="repeat_last")
    assert cfg.padding_logics == {"cu_seqlens": pad_cu_seqlens_repeat_last}  # vLLM's LFM2-VL config
    dst = torch.full((cfg.cu_size(512),), -7, dtype=torch.int32)
    src = lfm2vl_cu_seqlens([(4, 6), (32, 32)])
    pad_cu_seqlens_repeat_last(dst, src)
    assert dst.tolist() == [0, 24, 1048] + [1048] * (len(dst) - 3)
    with pytest.raises(ValueError, match="3 entries"):
        pad_cu_seqlens_repeat_last(torch.zeros(2, dtype=torch.int32), src)


def test_pad_default_tensor():
    dst = torch.ones(8, 3)
    src = torch.arange(9.0).reshape(3, 3)
    pad_default(dst, src)
    assert torch.equal(dst[:3], src) and torch.equal(dst[3:], torch.zeros(5, 3))


def test_pad_default_list_and_scalar():
    dst = torch.full((6, 2), 5, dtype=torch.int64)
    a, b = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[9, 9]])
    pad_default(dst, [a, b])
    assert dst.tolist() == [[1, 2], [3, 4], [9, 9], [0, 0], [0, 0], [0, 0]]
    s = torch.tensor(0)
    pad_default(s, torch.tensor(1234))
    assert s.item() == 1234


def test_pad_default_too_big():
    with pytest.raises(ValueError, match=r"9 rows.*8 rows"):
        pad_default(torch.zeros(8, 3), torch.zeros(9, 3))
    with pytest.raises(ValueError, match=r"10 rows"):
        pad_default(torch.zeros(8, 3), [torch.zeros(5, 3), torch.zeros(5, 3)])


def test_config_padding_logics():
    """The config names its buffers; a padding logic for a buffer it does not name is refused."""
    cfg = EncoderGraphConfig.build(out_hidden_size=64)
    assert cfg.buffer_keys == ("pixel_values", "pos_embeds", "cu_seqlens", "gather_idx")
    with pytest.raises(ValueError, match=r"padding_logics name buffers \['pixels'\]"):
        EncoderGraphConfig.build(out_hidden_size=64, padding_logics={"pixels": pad_default})


def test_a_custom_padding_logic_is_what_the_replay_reads(tiny_model):
    """The manager fills each buffer through ``config.padding_logics.get(key, pad_default)``: a logic
    for ``pos_embeds`` that zeroes every row changes what the graph computes, and only that."""
    calls = []

    def zero_positions(dst, src):
        calls.append(sum(t.shape[0] for t in src))
        dst.zero_()

    inputs = random_processor_output([(16, 16)], seed=3)
    genc = GraphedEncoder(tiny_model, budgets=[64], dense_graphs=False, record=eager_stand_in)
    genc.capture()
    plain = genc.encode(inputs)
    genc.config.padding_logics["pos_embeds"] = zero_positions
    genc.adapter.resident.clear()  # the buffers hold this grid's positions already: fill them again
    custom = genc.encode(inputs)
    assert calls == [256] and not torch.allclose(plain[0], custom[0])
    enc = genc.encoder
    packed = enc.pack(inputs)
    want = enc(packed.pixel_values, torch.zeros_like(packed.pos_embeds), packed.cu_seqlens, packed.max_seqlen,
               packed.gather_idx)
    torch.testing.assert_close(custom[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
def test_replay_sources(tiny_model, rule):
    """What a replay hands the manager: pixel rows, position rows and the host layout (cu_seqlens
    with the rule's dummies, then gather_idx), each by its buffer's name."""
    genc = GraphedEncoder(tiny_model, cu_seqlens_rule=rule)
    cfg, rows = genc.config, genc.config.rows(512)
    shapes = ((20, 32), (4, 6))  # no full-length (1024-row) item first: the varlen graph
    layout = genc.adapter.layout(512, VARLEN, shapes)
    cu, gi = layout["cu_seqlens"], layout["gather_idx"]
    assert cu.dtype == gi.dtype == torch.int32 and cu[:3].tolist() == [0, 640, 664]
    dst = torch.zeros(cfg.cu_size(512), dtype=torch.int32)
    cfg.padding_logics["cu_seqlens"](dst, cu)
    if rule == "safe":
        _check_safe(dst, lfm2vl_cu_seqlens(list(shapes)), rows, cfg.max_seqlen(512))
    else:
        assert set(dst[3:].tolist()) == {664}
    assert torch.equal(gi, lfm2vl_gather_idx(list(shapes)).int())
    items = PixelItems(torch.zeros(664, 768), list(shapes), (0, 640, 664))
    replay = genc.adapter.replay_buffers(items, [0, 1], 512)
    assert replay.variant == VARLEN and sorted(replay.sources) == sorted(cfg.buffer_keys)
    hits = genc.adapter.layouts.hits
    genc.adapter.resident.clear()
    assert genc.adapter.replay_buffers(items, [0, 1], 512).sources["cu_seqlens"] is replay.sources["cu_seqlens"]
    assert genc.adapter.layouts.hits == hits + 1  # a layout is built once per (budget, variant, grids)
    again = genc.adapter.replay_buffers(items, [0, 1], 512)
    assert sorted(again.sources) == ["pixel_values"]  # the buffers hold these grids already
    # a full-length item, then a rest: cu_seqlens describes only the rest's rows (2048 - 1024 of them)
    shapes = ((32, 32), (4, 6))
    layout = genc.adapter.layout(512, Variant(1, varlen=True), shapes)
    dst = torch.zeros(cfg.cu_size(512), dtype=torch.int32)
    cfg.padding_logics["cu_seqlens"](dst, layout["cu_seqlens"])
    if rule == "safe":
        _check_safe(dst, lfm2vl_cu_seqlens(list(shapes[1:])), rows - 1024, cfg.max_seqlen(512))
    else:
        assert dst[:2].tolist() == [0, 24] and set(dst[2:].tolist()) == {24}
    assert torch.equal(layout["gather_idx"], lfm2vl_gather_idx(list(shapes)).int())
    # a pure run of two: only its rows' gather_idx, no cu_seqlens to read
    layout = genc.adapter.layout(512, Variant(2, varlen=False), ((32, 32),) * 2)
    assert sorted(layout) == ["gather_idx"]
    assert torch.equal(layout["gather_idx"], lfm2vl_gather_idx([(32, 32)] * 2).int())


# --------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------


def test_plan_largest_first_and_budget_limit():
    batches, eager = plan_batches([64, 256, 16, 128, 256], max_budget=512, max_items=3)
    assert batches == [[1, 4], [3, 0, 2]]
    assert eager == []


def test_plan_item_limit():
    batches, eager = plan_batches([1] * 7, max_budget=1024, max_items=3)
    assert batches == [[0, 1, 2], [3, 4, 5], [6]] and eager == []


def test_plan_budget_limit():
    assert plan_batches([300, 300, 300], max_budget=512, max_items=16) == ([[0], [1], [2]], [])


def test_plan_oversize_items_are_eager():
    batches, eager = plan_batches([1024, 64, 2000, 48], max_budget=512, max_items=4)
    assert batches == [[1, 3]]
    assert eager == [2, 0]  # largest first


def test_plan_empty():
    assert plan_batches([], max_budget=64, max_items=1) == ([], [])


def test_plan_invariants_random():
    rng = random.Random(0)
    for _ in range(400):
        tokens = [rng.choice([1, 6, 48, 64, 96, 130, 256, 256, 300]) for _ in range(rng.randint(1, 40))]
        max_budget, max_items = rng.choice([128, 256, 512, 1024]), rng.choice([1, 2, 4, 16])
        run_tokens, max_run = rng.choice([(None, 0), (256, 0), (256, 8), (256, 16)])
        batches, eager = plan_batches(tokens, max_budget, max_items, run_tokens, max_run)
        seen = sorted(i for b in batches for i in b)
        assert sorted(seen + eager) == list(range(len(tokens)))
        assert all(tokens[i] > max_budget for i in eager)
        for b in batches:
            pure_run = run_tokens is not None and all(tokens[i] == run_tokens for i in b)
            regular = 1 <= len(b) <= max_items and sum(tokens[i] for i in b) <= max_budget
            assert regular or (pure_run and len(b) <= max_run), (b, [tokens[i] for i in b])
            assert [tokens[i] for i in b] == sorted((tokens[i] for i in b), reverse=True)
        if max_run == 0:  # no runs: exactly the plan without them
            assert (batches, eager) == plan_batches(tokens, max_budget, max_items)


@pytest.mark.parametrize("tokens,expected", [
    ([256] * 6, [[0, 1, 2, 3, 4, 5]]),  # six tiles: one replay, not 4 + 2
    ([256] * 17, [list(range(16)), [16]]),  # at most max_run_items
    ([256] * 5 + [64] * 3, [[0, 1, 2, 3, 4], [5, 6, 7]]),  # the run closes at the first other item
    ([256] * 3 + [64], [[0, 1, 2, 3]]),  # within the regular limits: one mixed batch, as before
    ([64, 256, 256], [[1, 2, 0]]),
])
def test_plan_runs_of_full_length_items(tokens, expected):
    assert plan_batches(tokens, 1024, 16, run_tokens=256, max_run_items=16) == (expected, [])
    # without runs the regular limits hold
    assert all(sum(tokens[i] for i in b) <= 1024 for b in plan_batches(tokens, 1024, 16)[0])


@pytest.mark.parametrize("budgets,max_items", [([64, 2048], 2), ([64, 256, 512, 1024, 2048, 4096], 4)])
def test_every_planned_batch_has_a_graph_when_no_run_budget_exists(budgets, max_items):
    # Without a run budget, a run of tiles must still respect the item limit: no graph has more slots.
    config = DenseGraphConfig.build(out_hidden_size=1, budgets=budgets, max_items=max_items, max_run_items=8)
    tokens = [256] * 8 + [100, 72]
    batches, eager = plan_config(tokens, config)
    assert eager == [] and all(len(b) <= max_items for b in batches)
    assert all(config.budget_for(sum(tokens[i] for i in b), len(b)) is not None for b in batches)


# --------------------------------------------------------------------------------------------
# Stats
# --------------------------------------------------------------------------------------------


def test_stats_fields():
    s = GraphStats()
    assert (s.hits, s.misses, s.overflow, s.eager_calls, s.replays) == (0, 0, 0, 0, {})
    assert s.hit_rate == 0.0 and s.padding_waste == 0.0
    s = GraphStats(hits=3, misses=1, real_tokens=100, padded_tokens=28, replays={512: 1, 64: 2},
                   variant_replays={"varlen": 1, "dense1": 2})
    assert s.hit_rate == 0.75
    assert s.padding_waste == pytest.approx(0.28)
    d = s.as_dict()
    assert set(d) == {"hits", "misses", "overflow", "eager_calls", "recaptures", "replays", "variant_replays",
                      "real_tokens", "padded_tokens", "padding_waste", "hit_rate"}
    assert list(d["replays"]) == [64, 512] and d["variant_replays"] == {"dense1": 2, "varlen": 1}
    assert d["hit_rate"] == 0.75


def test_pool_bytes_counts_only_that_pools_segments():
    segs = [{"total_size": 2 << 20, "segment_pool_id": (0, 0)},  # the default pool: not the graphs'
            {"total_size": 20 << 20, "segment_pool_id": (1, 3)},
            {"total_size": 2 << 20, "segment_pool_id": [1, 3]},  # some torch versions give a list
            {"total_size": 8 << 20, "segment_pool_id": (1, 4)}]  # another graph pool
    assert pool_bytes(segs, (1, 3)) == 22 << 20
    assert pool_bytes(segs, (9, 9)) == 0


# --------------------------------------------------------------------------------------------
# GraphedEncoder on the CPU: the packed eager path
# --------------------------------------------------------------------------------------------


def test_graphed_encoder_cpu_defaults(tiny_model):
    genc = GraphedEncoder(tiny_model)
    assert genc.config.budgets == DEFAULT_BUDGETS and genc.config.max_items == 16
    assert genc.config.out_hidden_size == 64
    assert not genc.captured and genc.device.type == "cpu"
    assert genc.encoder.attention_backend == "sdpa_blockmask"


def test_graphed_encoder_cpu_matches_transformers_and_warns_once(tiny_model):
    genc = GraphedEncoder(tiny_model)
    shapes = [(16, 16), (32, 32), (4, 6), (26, 38), (16, 24)]  # not sorted: order must come back as given
    inputs = random_processor_output(shapes, "tiny", seed=21)
    refs = hf_image_features(tiny_model, inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = genc.encode(inputs)
        outs2 = genc.encode(inputs)
    mine = [w for w in caught if "no CUDA device" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert mine[0].filename == __file__, "the warning must point at the caller of encode()"
    _assert_parity(outs, refs, FP32_TOL)
    for a, b in zip(outs, outs2):
        assert torch.equal(a, b)
    assert genc.stats.eager_calls == 2
    assert genc.stats.hits == 0 and genc.stats.replays == {}


def test_graphed_encoder_cpu_encodes_processed_images(tiny_model):
    genc = GraphedEncoder(tiny_model)
    images = [synthetic_image(300, 200, seed=1), synthetic_image(1024, 768, seed=2)]
    inputs = process_images(images, "tiny")
    _assert_parity(genc.encode(inputs), hf_image_features(tiny_model, inputs), FP32_TOL)


def test_capture_on_cpu_raises(tiny_model):
    genc = GraphedEncoder(tiny_model)
    with pytest.raises(RuntimeError, match="CUDA"):
        genc.capture()
    assert not genc.captured


def test_check_finite_names_the_item(tiny_model):
    inputs = random_processor_output([(16, 16), (8, 8), (12, 16)], "tiny", seed=4)
    inputs["pixel_values"][1, 5, 3] = float("nan")
    inputs["pixel_values"][2, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"item\(s\) \[1, 2\].*\(8, 8\), \(12, 16\)"):
        GraphedEncoder(tiny_model, check_finite=True).encode(inputs)
    # off by default: no error, the NaN item comes out NaN (as in transformers), and attention per
    # item keeps it from poisoning its neighbours in the packed batch
    outs = GraphedEncoder(tiny_model).encode(inputs)
    assert not torch.isfinite(outs[1]).all() and torch.isfinite(outs[0]).all()


def test_check_finite_ignores_the_processors_padding_rows():
    pv = torch.zeros(2, 64, 12)
    pv[0, 16:] = float("nan")  # beyond item 0's 4x4 = 16 real rows: never read by the encoder
    check_finite_items(pv, [(4, 4), (8, 8)])
    pv[1, 63] = float("nan")
    with pytest.raises(ValueError, match=r"\[1\]"):
        check_finite_items(pv, [(4, 4), (8, 8)])


def test_graphed_encoder_rejects_bad_inputs(tiny_model):
    genc = GraphedEncoder(tiny_model)
    with pytest.raises(ValueError, match="3x4"):
        genc.encode(random_processor_output([(3, 4)], "tiny"))


def _lm_inputs(model, inputs, prefix=(1, 5, 7), suffix=(9, 11)):
    n = sum(_tokens([tuple(s) for s in inputs["spatial_shapes"].tolist()]))
    tok = model.config.image_token_id
    ids = torch.tensor([list(prefix) + [tok] * n + list(suffix)])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs)


def test_installed_forward_and_generate_cpu(tiny_model):
    genc = GraphedEncoder(tiny_model)
    inputs = random_processor_output([(16, 16), (8, 16)], "tiny", seed=3)
    batch = _lm_inputs(tiny_model, inputs)
    inner = tiny_model.model
    with torch.no_grad():
        ref = tiny_model(**batch).logits
        ref_gen = tiny_model.generate(**batch, max_new_tokens=3, do_sample=False)
        with genc.installed() as m:
            assert m is tiny_model
            assert "get_image_features" in inner.__dict__
            got = tiny_model(**batch).logits
            calls = genc.stats.eager_calls
            got_gen = tiny_model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert calls >= 1, "forward did not go through the graphed encoder"
    assert genc.stats.eager_calls > calls, "generate did not go through the graphed encoder"
    assert "get_image_features" not in inner.__dict__, "installed() must restore the class method"
    assert rel_error(got, ref) <= FP32_TOL
    assert torch.equal(got_gen, ref_gen)


# --------------------------------------------------------------------------------------------
# The replay path on the CPU, with the graph simulated: replay() runs the body on the persistent
# buffers, exactly what the captured graph does. Tests padding, slicing, order and stats.
# --------------------------------------------------------------------------------------------


def _simulated(model, budgets, rule):
    """A GraphedEncoder whose 'graphs' are eager stand-ins: the whole replay path on the CPU."""
    genc = GraphedEncoder(model, budgets=budgets, cu_seqlens_rule=rule, record=eager_stand_in)
    genc.capture()
    return genc


def _buffer_ptrs(genc):
    return {t.untyped_storage().data_ptr() for g in genc.graphs.values() for t in g.buffers.values()}


@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
def test_simulated_replay_matches_transformers(tiny_model, rule):
    genc = _simulated(tiny_model, [64, 128, 256], rule)
    assert genc.config.max_items == 4
    shapes = [(8, 8), (16, 32), (2, 2), (20, 20), (32, 32), (12, 8), (16, 16)]
    inputs = random_processor_output(shapes, "tiny", seed=31)
    refs = hf_image_features(tiny_model, inputs)
    outs = genc.encode(inputs)
    _assert_parity(outs, refs, FP32_TOL)
    tokens = _tokens(shapes)
    batches, eager = plan_batches(tokens, 256, 4)
    s = genc.stats
    assert eager == [] and s.misses == 0 and s.overflow == 0
    assert s.hits == len(shapes)
    assert sum(s.replays.values()) == len(batches)
    used = [genc.config.budget_for(sum(tokens[i] for i in b), len(b)) for b in batches]
    assert s.replays == {b: used.count(b) for b in set(used)}
    assert s.real_tokens == sum(tokens)
    assert s.padded_tokens == sum(used) - sum(tokens)
    ptrs = _buffer_ptrs(genc)
    assert all(o.untyped_storage().data_ptr() not in ptrs for o in outs)


def test_simulated_replay_no_aliasing(tiny_model):
    genc = _simulated(tiny_model, [64, 128], "safe")
    first = genc.encode(random_processor_output([(16, 16), (8, 8)], "tiny", seed=1))
    kept = [t.clone() for t in first]
    for seed in (2, 3):
        genc.encode(random_processor_output([(16, 16), (8, 8)], "tiny", seed=seed))
    for a, b in zip(first, kept):
        assert torch.equal(a, b), "an earlier result changed after a later replay"


def test_simulated_oversize_and_guard(tiny_model):
    genc = _simulated(tiny_model, [64, 128], "safe")
    assert genc.config.max_items == 2
    shapes = [(16, 16), (32, 32), (12, 16)]  # 64 + 256 (oversize) + 48 tokens
    inputs = random_processor_output(shapes, "tiny", seed=8)
    refs = hf_image_features(tiny_model, inputs)
    _assert_parity(genc.encode(inputs), refs, FP32_TOL)
    assert (genc.stats.hits, genc.stats.misses) == (2, 1)
    assert genc.stats.replays == {128: 1}
    # a budget without a graph: the guard refuses the batch and it runs eagerly, still correct
    genc2 = _simulated(tiny_model, [64, 128], "safe")
    del genc2.graphs[64]
    small = random_processor_output([(12, 16)], "tiny", seed=9)
    _assert_parity(genc2.encode(small), hf_image_features(tiny_model, small), FP32_TOL)
    assert (genc2.stats.overflow, genc2.stats.misses, genc2.stats.hits) == (1, 1, 0)


# --------------------------------------------------------------------------------------------
# GPU (run on the device): real capture and replay
# --------------------------------------------------------------------------------------------

# Shapes whose total output tokens need exactly this budget (above the previous one), unsorted.
BUDGET_CASES = {
    64: [(12, 16)],  # 48 tokens
    128: [(12, 16), (16, 16)],  # 112
    256: [(8, 16), (24, 32)],  # 224
    512: [(8, 8), (32, 32), (24, 32)],  # 464
    1024: [(16, 24), (32, 32), (32, 32), (32, 32)],  # 864
}
_CAPTURED = {}
_MODELS = {}


def _cuda_model(preset, dtype):
    if (preset, dtype) not in _MODELS:
        _MODELS[preset, dtype] = build_model(preset, dtype=dtype, device="cuda")
    return _MODELS[preset, dtype]


def _fp32_copy(preset):
    """The float32 judge of the bf16 model (same weights), built once per session."""
    if (preset, "fp32-judge") not in _MODELS:
        _MODELS[preset, "fp32-judge"] = float32_reference(_cuda_model(preset, torch.bfloat16))
    return _MODELS[preset, "fp32-judge"]


def _captured(preset, dtype, rule, budgets=None):
    """A captured GraphedEncoder per (preset, dtype, rule, budgets), built once per session."""
    key = (preset, dtype, rule, tuple(budgets or ()))
    if key not in _CAPTURED:
        model = _cuda_model(preset, dtype)
        # fp32: FlashAttention varlen takes only half precision, so use the exact block-mask path
        attention = "auto" if dtype != torch.float32 else "sdpa_blockmask"
        genc = GraphedEncoder(model, budgets=budgets, cu_seqlens_rule=rule, attention=attention)
        info = genc.capture()
        assert [i["budget"] for i in info] == sorted(genc.config.graph_budgets, reverse=True)
        _CAPTURED[key] = genc
    genc = _CAPTURED[key]
    genc.reset_stats()
    return genc


@pytest.mark.gpu
@pytest.mark.parametrize("budget", DEFAULT_BUDGETS)
@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("preset", ["tiny", "lfm2-vl-450m"])
def test_replay_equals_eager(preset, dtype, rule, budget):
    genc = _captured(preset, dtype, rule)
    assert genc.captured and sorted(genc.graphs) == DEFAULT_BUDGETS + [2048]
    shapes = BUDGET_CASES[budget]
    inputs = random_processor_output(shapes, preset, seed=1000 + budget)
    outs = genc.encode(inputs)
    assert genc.stats.replays == {budget: 1}, genc.stats.as_dict()
    assert (genc.stats.hits, genc.stats.misses) == (len(shapes), 0)
    eager = genc.encoder.encode(inputs)
    assert all(o.device.type == "cuda" and o.dtype == dtype for o in outs)
    if dtype == torch.float32:  # fp32: a literal comparison is meaningful
        _assert_parity(outs, eager, FP32_TOL)
        _assert_parity(outs, hf_image_features(genc.model, inputs), FP32_TOL)
        return
    # bf16 is judged as `check` judges it (one helper): against a float32 copy of the same weights,
    # never bf16 against bf16 (replay and eager each carry their own ~1e-2 of rounding).
    verdict = judge_replay(outs, eager, inputs, BF16_TOL, _fp32_copy(preset))
    assert verdict["pass"] and not verdict["nan"], verdict


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny", "lfm2-vl-450m"])
def test_replay_results_are_not_aliased(preset):
    genc = _captured(preset, torch.bfloat16, "safe")
    first = genc.encode(random_processor_output(BUDGET_CASES[256], preset, seed=1))
    kept = [t.clone() for t in first]
    for seed in (2, 3):  # same budget (same output buffer), then others
        genc.encode(random_processor_output(BUDGET_CASES[256], preset, seed=seed))
    for b in DEFAULT_BUDGETS:
        genc.encode(random_processor_output(BUDGET_CASES[b], preset, seed=10 + b))
    torch.cuda.synchronize()
    for a, b in zip(first, kept):
        assert torch.equal(a, b), "an earlier result changed after a later replay"
    ptrs = _buffer_ptrs(genc)
    assert len(ptrs) == 4 * len(genc.graphs)
    assert all(t.untyped_storage().data_ptr() not in ptrs for t in first)


@pytest.mark.gpu
def test_oversize_item_falls_back_to_eager():
    genc = _captured("tiny", torch.bfloat16, "safe", budgets=[64, 128])
    shapes = [(32, 32), (16, 16), (12, 16)]  # 256 tokens > 128: eager
    inputs = random_processor_output(shapes, "tiny", seed=5)
    outs = genc.encode(inputs)
    assert (genc.stats.hits, genc.stats.misses) == (2, 1)
    assert genc.stats.replays == {128: 1}
    _assert_parity(outs, hf_image_features(genc.model, inputs), BF16_TOL)


@pytest.mark.gpu
def test_stats_add_up_on_a_workload():
    genc = _captured("tiny", torch.bfloat16, "safe")
    images = [r.image() for r in synthetic_workload(12, seed=4)]
    inputs = process_images(images, "tiny")
    shapes = [tuple(s) for s in inputs["spatial_shapes"].tolist()]
    tokens = _tokens(shapes)
    outs = genc.encode(inputs)
    s = genc.stats
    batches, eager = plan_config(tokens, genc.config)
    assert s.hits + s.misses == len(shapes)
    assert s.misses == len(eager) == 0 and s.overflow == 0
    assert sum(s.replays.values()) == len(batches)
    used = [genc.config.budget_for(sum(tokens[i] for i in b), len(b)) for b in batches]
    assert s.replays == {b: used.count(b) for b in set(used)}
    computed = [genc.adapter.computed_tokens(u, genc.adapter.variant_for(u, [shapes[i] for i in b]))
                for u, b in zip(used, batches)]
    assert s.real_tokens == sum(tokens) and s.padded_tokens == sum(computed) - sum(tokens)
    _assert_parity(outs, hf_image_features(genc.model, inputs), BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny", "lfm2-vl-450m"])
def test_installed_forward_and_generate_cuda(preset):
    genc = _captured(preset, torch.bfloat16, "safe")
    model = genc.model
    inputs = random_processor_output([(32, 32), (16, 24)], preset, seed=6)
    batch = {k: v.to("cuda") for k, v in _lm_inputs(model, inputs).items()}
    batch["pixel_values"] = batch["pixel_values"].to(torch.bfloat16)
    gen_kw = dict(max_new_tokens=3, do_sample=False, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        ref = model(**batch).logits
        ref_gen = model.generate(**batch, **gen_kw)
        with genc.installed():
            got = model(**batch).logits
            hits = genc.stats.hits
            got_gen = model.generate(**batch, **gen_kw)
    assert hits == 2, "forward did not go through the graphed encoder"
    assert genc.stats.hits == 4, "generate did not go through the graphed encoder"
    assert "get_image_features" not in model.model.__dict__
    # Judged against a float32 copy: our logits are no further from it than transformers' bf16 ones
    ref32 = float32_reference(model)
    with torch.no_grad():
        logits32 = ref32(**{**batch, "pixel_values": batch["pixel_values"].float()}).logits
    assert torch.isfinite(got).all()
    assert rel_error(got, logits32) <= max(BF16_TOL, 1.05 * rel_error(ref, logits32))
    last32 = logits32[:, -1]  # generate's first-step logits are the prompt's last position
    assert rel_error(got_gen.logits[0], last32) <= max(BF16_TOL, 1.05 * rel_error(ref_gen.logits[0], last32))
    assert got_gen.sequences.shape == ref_gen.sequences.shape


@pytest.mark.gpu
def test_recover_from_failed_capture_restores_stream_and_rng():
    from lfm2vl_lab import recover_from_failed_capture

    v = torch.randn(4, device="cuda")
    before = torch.cuda.current_stream()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(Exception):  # noqa: B017 - torch raises RuntimeError or a CUDA error type
        with torch.cuda.graph(g):
            (v * 2).sum().item()  # a host sync: not allowed while capturing
    left_on_side_stream = torch.cuda.current_stream() != before
    info = recover_from_failed_capture(before)
    assert info["stream_restored"] == left_on_side_stream
    assert torch.cuda.current_stream() == before
    assert torch.isfinite(torch.randn(16, device="cuda")).all()  # the RNG left capture mode


@pytest.mark.gpu
def test_failed_capture_leaves_eager_path_and_process_usable():
    model = _cuda_model("tiny", torch.bfloat16)
    enc = PackedVisionEncoder(model)
    broken = [True]

    def body_with_host_sync(pixel_values, *args, **kwargs):
        out = enc(pixel_values, *args, **kwargs)
        if broken[0] and pixel_values.shape[0] == 4 * 64 and torch.cuda.is_current_stream_capturing():
            out.float().sum().item()  # fails the 64-token capture after the 128 one succeeded
        return out

    genc = GraphedEncoder(model, budgets=[64, 128], body=body_with_host_sync)
    stream_before = torch.cuda.current_stream()
    with pytest.raises(RuntimeError, match="64-token encoder graph failed"):
        genc.capture()
    assert not genc.captured and genc.graphs == {}, "a half-captured manager must not stay installed"
    assert torch.cuda.current_stream() == stream_before
    build_model("tiny", dtype=torch.bfloat16, device="cuda")  # random init on the device works again
    inputs = random_processor_output(BUDGET_CASES[128], "tiny", seed=7)
    outs = genc.encode(inputs)
    assert genc.stats.eager_calls == 1 and genc.stats.replays == {}
    _assert_parity(outs, hf_image_features(model, inputs), BF16_TOL)
    broken[0] = False  # the body fixed: the same encoder captures every budget in the same process
    genc.capture()
    assert sorted(genc.graphs) == [64, 128]


# --------------------------------------------------------------------------------------------
# Dense graph variants and runs (CPU parts)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,parsed", [("varlen", (0, True)), ("dense1", (1, False)), ("dense3+varlen", (3, True)),
                                         ("dense16", (16, False))])
def test_variant_names_round_trip(name, parsed):
    variant = Variant.parse(name)
    assert (variant.dense, variant.varlen) == parsed and variant == Variant(*parsed)
    assert variant.name == str(variant) == name


@pytest.mark.parametrize("bad", ["dense", "dense0", "densex", "dense2+flash", "single_item", ""])
def test_unknown_variant_names_are_refused(bad):
    with pytest.raises(ValueError, match="graph variant"):
        Variant.parse(bad)


@pytest.mark.parametrize("shapes,rows,expected", [
    ([(32, 32)], 1024, 1),
    ([(32, 32), (32, 32), (16, 16)], 1024, 2),
    ([(16, 16), (32, 32)], 1024, 0),  # only a leading run counts
    ([(16, 16)], 256, 1),
    ([(30, 32)], 1024, 0),
    ([], 1024, 0),
])
def test_leading_full_items(shapes, rows, expected):
    assert leading_full_items(shapes, rows) == expected


def test_config_run_budget_and_dense_geometry():
    cfg = DenseGraphConfig.build(out_hidden_size=64, max_run_items=16)
    assert cfg.run_tokens == 256 and cfg.run_budget == 4096 and cfg.graph_budgets == DEFAULT_BUDGETS + [4096]
    assert cfg.slots(4096) == 16 and cfg.budget_for(5 * 256, 5) == 4096 and cfg.budget_for(1024, 4) == 1024
    assert [cfg.dense_rows(b) for b in cfg.graph_budgets] == [256, 512, 1024, 1024, 1024, 1024]
    assert [cfg.dense_blocks(b) for b in cfg.graph_budgets] == [1, 1, 1, 2, 4, 16]
    assert DenseGraphConfig.build(out_hidden_size=64).run_budget == 2048  # GraphOptions.max_run_items, 8 × 256
    assert DenseGraphConfig.build(out_hidden_size=64, max_run_items=0).run_budget is None  # off
    assert EncoderGraphConfig.build(out_hidden_size=64).graph_budgets == DEFAULT_BUDGETS  # the seed has none
    # budgets too small for one full-length item (it runs eagerly): no run budget to capture for nothing
    assert DenseGraphConfig.build(out_hidden_size=64, budgets=[64, 128], max_run_items=8).run_budget is None
    # a run limit the largest budget already holds needs no extra budget
    assert DenseGraphConfig.build(out_hidden_size=64, max_run_items=4).graph_budgets == DEFAULT_BUDGETS
    loose = DenseGraphConfig.build(out_hidden_size=64, max_run_items=16, max_seqlen_mode="loose")
    assert loose.dense_rows(1024) == 1024  # dense items are 512 px ones whatever max_seqlen says
    with pytest.raises(ValueError, match="max_run_items"):
        DenseGraphConfig.build(out_hidden_size=64, max_run_items=-1)


def test_graph_variants_per_budget(tiny_model):
    genc = GraphedEncoder(tiny_model)  # dense graphs and runs of 16 by default
    variants = {b: tuple(v.name for v in genc.adapter.graph_variants(b)) for b in genc.config.graph_budgets}
    assert variants == {
        64: ("varlen", "dense1"), 128: ("varlen", "dense1"), 256: ("varlen", "dense1"),
        # budget_for sends one full item to 256, so 512 captures only the pure run of two
        512: ("varlen", "dense2", "dense1+varlen"),
        1024: ("varlen", "dense3", "dense4", "dense1+varlen", "dense2+varlen", "dense3+varlen"),
        2048: tuple(f"dense{k}" for k in range(5, 9)),  # the run budget (8 tiles): pure runs only
    }
    assert genc.adapter.variants[0] == VARLEN and Variant(8, varlen=False) in genc.adapter.variants
    assert genc.adapter.computed_tokens(2048, Variant.parse("dense6")) == 6 * 256  # a pure run: only its items
    assert genc.adapter.computed_tokens(1024, Variant.parse("dense1+varlen")) == 1024
    off = GraphedEncoder(tiny_model, dense_graphs=False)
    assert off.config.graph_budgets == DEFAULT_BUDGETS  # no run budget without dense graphs
    assert {off.adapter.graph_variants(b) for b in off.config.budgets} == {(VARLEN,)}
    compiled_like = GraphedEncoder(tiny_model, body=lambda *a, **k: None)
    assert {compiled_like.adapter.graph_variants(b) for b in compiled_like.config.graph_budgets} == {(VARLEN,)}


@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
def test_capture_layout_stays_inside_every_variants_rows(tiny_model, rule):
    """FlashAttention reads every row cu_seqlens names, unchecked: the dummy layout a budget is
    captured with must stay inside the rows each variant's varlen kernel is given (a mixed variant
    gets only the rest after its dense items). On the H200 a layout covering the whole buffer read
    past the rest and crashed the capture with an illegal memory access."""
    genc = GraphedEncoder(tiny_model, cu_seqlens_rule=rule)
    a, cfg = genc.adapter, genc.config
    for b in cfg.graph_budgets:
        bufs = a.capture_inputs(b)
        assert sorted(bufs) == sorted(cfg.buffer_keys)
        cu = bufs["cu_seqlens"]
        assert bool((cu[1:] >= cu[:-1]).all()) and int(cu[0]) == 0
        for v in a.graph_variants(b):
            rows = a.varlen_rows(b, v)
            assert rows == 0 or int(cu.max()) <= rows, (b, v, cu.tolist(), rows)
            # and the gather the variant reads indexes only rows it computes
            computed = rows + v.dense * cfg.dense_rows(b)
            gather = bufs["gather_idx"][:computed]
            assert int(gather.max()) < computed, (b, v)


def test_run_budget_guard_takes_only_pure_runs(tiny_model):
    genc = GraphedEncoder(tiny_model)
    shapes = [(32, 32)] * 5 + [(16, 16)]
    items = PixelItems(torch.zeros(5 * 1024 + 256, 768), shapes, row_offsets(shapes))
    assert genc.adapter.replay_buffers(items, [0, 1, 2, 3, 4], 2048) is not None
    assert genc.adapter.replay_buffers(items, [0, 1, 2, 3, 5], 2048) is None  # a smaller item: refused, runs eagerly


# Batches that reach each kind of variant (the first items full-length, 32x32 = 1024 rows)
VARIANT_CASES = {
    "varlen": [(20, 32), (16, 16)],
    "dense1@64": [(16, 16)],
    "dense1@128": [(16, 32)],
    "dense1@256": [(32, 32)],
    "dense2": [(32, 32)] * 2,
    "dense1+varlen@512": [(32, 32), (24, 32)],
    "dense3": [(32, 32)] * 3,
    "dense4": [(32, 32)] * 4,
    "dense1+varlen@1024": [(32, 32), (32, 24), (24, 24), (8, 8)],
    "dense2+varlen": [(32, 32)] * 2 + [(24, 32)],
    "dense3+varlen": [(32, 32)] * 3 + [(8, 16)],
    "dense6": [(32, 32)] * 6,
    "dense8": [(32, 32)] * 8,
}


def _expected_variant(case: str) -> str:
    return case.split("@")[0]


@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
def test_simulated_every_variant_matches_transformers(tiny_model, rule):
    """Each variant replayed (without a GPU: eager_stand_in) equals transformers in fp32, and the
    host picked the variant the patch grids call for."""
    genc = GraphedEncoder(tiny_model, cu_seqlens_rule=rule, record=eager_stand_in)
    genc.capture()
    for k, (case, shapes) in enumerate(VARIANT_CASES.items()):
        inputs = random_processor_output(shapes, "tiny", seed=70 + k)
        genc.reset_stats()
        _assert_parity(genc.encode(inputs), hf_image_features(tiny_model, inputs), FP32_TOL)
        assert genc.stats.variant_replays == {_expected_variant(case): 1}, (case, genc.stats.as_dict())
        pure = "+" not in case and case != "varlen"
        assert (genc.stats.padded_tokens == 0) if pure else True, genc.stats.as_dict()


def test_simulated_many_tiles_run_as_one_replay(tiny_model):
    genc = GraphedEncoder(tiny_model, record=eager_stand_in)
    genc.capture()
    inputs = random_processor_output([(32, 32)] * 17 + [(16, 16)], "tiny", seed=3)
    _assert_parity(genc.encode(inputs), hf_image_features(tiny_model, inputs), FP32_TOL)
    assert genc.stats.replays == {2048: 2, 512: 1}  # 8 + 8 tiles; then the 17th with the small item
    assert genc.stats.variant_replays == {"dense8": 2, "dense1+varlen": 1}
    assert genc.stats.padded_tokens == 512 - (256 + 64)  # the run pads nothing


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["safe", "repeat_last"])
@pytest.mark.parametrize("preset,dtype", [("tiny", torch.float32), ("tiny", torch.bfloat16),
                                          ("lfm2-vl-450m", torch.bfloat16), ("lfm2-vl-1.6b", torch.bfloat16)],
                         ids=["tiny-fp32", "tiny-bf16", "450m-bf16", "1.6b-bf16"])
def test_every_dense_variant_replay_equals_eager(preset, dtype, rule):
    """Every variant of every budget (the run budget too), each cu_seqlens rule: the host picks the
    variant the patch grids call for, and the replay passes the float32 judge (bf16) or matches eager
    to 1e-4 (fp32), with no NaN. Then a varlen batch after a dense one leaves no stale rows."""
    genc = _captured(preset, dtype, rule)
    ref32 = _fp32_copy(preset) if dtype == torch.bfloat16 else None
    for k, (case, shapes) in enumerate(VARIANT_CASES.items()):
        inputs = random_processor_output(shapes, preset, seed=300 + k)
        genc.reset_stats()
        outs = genc.encode(inputs)
        assert genc.stats.variant_replays == {_expected_variant(case): 1}, (case, genc.stats.as_dict())
        eager = genc.encoder.encode(inputs)
        if dtype == torch.float32:
            _assert_parity(outs, eager, FP32_TOL)
            continue
        verdict = judge_replay(outs, eager, inputs, BF16_TOL, ref32)
        assert verdict["pass"] and not verdict["nan"], (case, verdict)


@pytest.mark.gpu
def test_variants_sharing_buffers_leave_no_stale_rows():
    """The variants share one budget's buffers: a pure run (which reads only its own rows) after a
    larger mixed batch must not see that batch's rows, and the other way round."""
    genc = _captured("tiny", torch.bfloat16, "safe")
    ref32 = _fp32_copy("tiny")
    for k, case in enumerate(("dense3+varlen", "dense4", "varlen", "dense3", "dense1+varlen@1024", "dense3")):
        inputs = random_processor_output(VARIANT_CASES[case], "tiny", seed=500 + k)
        verdict = judge_replay(genc.encode(inputs), genc.encoder.encode(inputs), inputs, BF16_TOL, ref32)
        assert verdict["pass"] and not verdict["nan"], (case, verdict)


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "varlen-only"])
def test_graph_memory_is_non_negative_and_adds_up(dense):
    model = _cuda_model("lfm2-vl-450m", torch.bfloat16)
    genc = GraphedEncoder(model, dense_graphs=dense)
    info = measured_capture(genc, progress=False)
    mem = graph_memory(info)
    assert mem["per_budget"] == info and len(info) == len(genc.config.graph_budgets)
    for r in info:
        assert r["pool_mb"] >= 0 and r["buffers_mb"] > 0, r
        assert r["total_mb"] == pytest.approx(r["pool_mb"] + r["buffers_mb"])
    assert mem["pool_mb"] > 0, "the largest graph's activations must live in its pool"
    assert mem["total_mb"] == pytest.approx(sum(r["total_mb"] for r in info))
    assert mem["total_mb"] == pytest.approx(mem["pool_mb"] + mem["buffers_mb"])
    # the pool is what the allocator holds for it now, and it is part of what the process reserves
    now = pool_bytes(torch.cuda.memory_snapshot(), genc.pool) / 2**20
    assert now == pytest.approx(mem["pool_mb"])
    assert torch.cuda.memory_reserved() / 2**20 >= now
    # the buffers are exactly the tensors the graphs read (the named buffers) and write (the output)
    top = max(genc.graphs)
    g = genc.graphs[top]
    expected = sum(t.numel() * t.element_size() for t in [*g.buffers.values(), g.out]) / 2**20
    assert info[0]["budget"] == top and info[0]["buffers_mb"] == pytest.approx(expected)
    assert mem["total_mb"] <= 1024, "all graphs together must hold at most 1 GiB"
