"""The named graph configs (``GraphOptions.named``): "pr" is the budget set and item limit vLLM PR
#44930 measured with, every other setting the kit's; what it captures and how it plans batches, read
off the CPU stand-in, and that its replays equal transformers'."""

from __future__ import annotations

import random
from dataclasses import fields

import pytest

from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.config import GRAPH_CONFIGS, GraphOptions
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.manager import plan_config
from lfm2vl_lab.core.packing import tokens_for
from lfm2vl_lab.model.hf import hf_image_features
from lfm2vl_lab.model.parity import rel_error
from lfm2vl_lab.tools.workloads import random_processor_output

PR_BUDGETS = (64, 256, 512, 1024, 2048, 4096)
FULL = (32, 32)  # a 512 px image or tile: 1024 patch rows, 256 tokens


def _dense(ks, rest=False):
    return tuple(f"dense{k}" + ("+varlen" if rest else "") for k in ks)


# What GraphOptions.named's docstring says the "pr" set captures, per budget
PR_VARIANTS = {
    64: ("varlen", "dense1"),
    256: ("varlen", "dense1"),
    512: ("varlen", "dense2", "dense1+varlen"),
    1024: ("varlen", *_dense(range(3, 5)), *_dense(range(1, 4), True)),
    2048: ("varlen", *_dense(range(5, 9)), *_dense(range(1, 8), True)),
    4096: ("varlen", *_dense(range(9, 17)), *_dense(range(1, 16), True)),
}


@pytest.fixture(scope="module")
def pr_encoder(tiny_model):
    """The "pr" config captured on the tiny preset (same processor limits as the real ones)."""
    genc = GraphedEncoder(tiny_model, GraphOptions.named("pr"), record=eager_stand_in)
    genc.capture()
    return genc


def test_named_configs_set_only_their_fields():
    assert GraphOptions.named("kit") == GraphOptions()
    pr = GraphOptions.named("pr")
    assert pr.budgets == PR_BUDGETS and pr.max_items == 16
    for f in fields(GraphOptions):
        if f.name not in GRAPH_CONFIGS["pr"]:
            assert getattr(pr, f.name) == f.default, f.name
    assert GraphOptions.named("pr", cu_seqlens_rule="repeat_last").cu_seqlens_rule == "repeat_last"
    assert GraphOptions.named("pr", cu_seqlens_rule="repeat_last").budgets == PR_BUDGETS


def test_an_unknown_named_config_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown graph config 'vllm'; the named configs are: kit, pr") as exc:
        GraphOptions.named("vllm")
    assert "\n" not in str(exc.value)
    with pytest.raises(TypeError, match="unknown graph setting"):
        GraphOptions.named("pr", budget=(64,))


def test_what_the_pr_set_captures(pr_encoder, tiny_model):
    cfg = pr_encoder.config
    assert cfg.budgets == list(PR_BUDGETS) and cfg.max_items == 16 <= min(cfg.budgets)
    # 8 run items are 2048 tokens, which 4096 already holds: no extra run budget
    assert cfg.run_budget is None and cfg.graph_budgets == list(PR_BUDGETS)
    assert [cfg.slots(b) for b in PR_BUDGETS] == [1, 4, 8, 16, 16, 16]
    assert {b: pr_encoder.adapter.graph_variants(b) for b in PR_BUDGETS} == PR_VARIANTS
    assert {b: tuple(g.graphs) for b, g in pr_encoder.graphs.items()} == PR_VARIANTS
    assert sum(map(len, PR_VARIANTS.values())) == 49
    kit = GraphedEncoder(tiny_model, GraphOptions.named("kit"), record=eager_stand_in)
    assert kit.config.run_budget == 2048
    assert sum(len(kit.adapter.graph_variants(b)) for b in kit.config.graph_budgets) == 19


@pytest.mark.parametrize("shapes, batches, budgets, variants", [
    ([FULL] * 16, [16], [4096], ["dense16"]),
    ([FULL] * 9, [9], [4096], ["dense9"]),
    ([FULL] * 17, [16, 1], [4096, 256], ["dense16", "dense1"]),
    ([FULL] * 2 + [(16, 16)] * 10, [12], [2048], ["dense2+varlen"]),  # 512 + 640 tokens: above 1024
    ([FULL] + [(16, 16)] * 11, [12], [1024], ["dense1+varlen"]),  # 256 + 704 tokens, 12 items in 16 slots
])
def test_the_pr_set_plans_whole_runs(pr_encoder, shapes, batches, budgets, variants):
    tokens = [tokens_for(s) for s in shapes]
    planned, eager = plan_config(tokens, pr_encoder.config)
    cfg, adapter = pr_encoder.config, pr_encoder.adapter
    assert eager == [] and [len(b) for b in planned] == batches
    used = [cfg.budget_for(sum(tokens[i] for i in b), len(b)) for b in planned]
    assert used == budgets
    assert [adapter.variant_for(u, tuple(shapes[i] for i in b)) for u, b in zip(used, planned)] == variants


def test_every_pr_plan_fits_a_captured_graph(pr_encoder):
    cfg, adapter, rng = pr_encoder.config, pr_encoder.adapter, random.Random(0)
    sides = [8, 12, 16, 20, 24, 32]
    for _ in range(300):
        shapes = [(rng.choice(sides), rng.choice(sides)) for _ in range(rng.randint(1, 40))]
        shapes = [s if tokens_for(s) >= 16 else FULL for s in shapes]
        tokens = [tokens_for(s) for s in shapes]
        planned, eager = plan_config(tokens, cfg)
        assert eager == [] and sorted(i for b in planned for i in b) == list(range(len(shapes)))
        for b in planned:
            assert len(b) <= cfg.max_items
            budget = cfg.budget_for(sum(tokens[i] for i in b), len(b))
            assert budget is not None
            grids = tuple(shapes[i] for i in b)  # the batch's order: largest first, as a replay reads it
            assert adapter.fits(budget, grids)
            assert adapter.variant_for(budget, grids) in pr_encoder.graphs[budget].graphs


def test_pr_replays_equal_transformers_on_the_cpu(pr_encoder, tiny_model):
    # one call: 16 tiles (dense16 at 4096), then a ragged batch of 12 items
    shapes = [FULL] * 16 + [(32, 16), (24, 24), (16, 16), (16, 20), (8, 16), (20, 12)] * 2
    inputs = random_processor_output(shapes, "tiny", seed=44)
    pr_encoder.reset_stats()
    outs = pr_encoder.encode(inputs)
    refs = hf_image_features(tiny_model, inputs)
    assert max(rel_error(o, r) for o, r in zip(outs, refs)) <= 1e-4
    s = pr_encoder.stats
    assert (s.hits, s.misses, s.overflow) == (len(shapes), 0, 0)
    assert s.variant_replays.get("dense16") == 1 and sum(s.replays.values()) == 2
