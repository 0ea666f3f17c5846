"""scripts/sanitize_replay.py: its batches reach every graph its encoder captures, one graph each,
under both ``cu_seqlens`` rules (host-only: the config and the planner, no capture), and its fused text
engine's phase replays every graph it captures with its eager twin's tokens. The run itself is on the
H200 (``bash scripts/h200_run.sh sanitize``); ``--cpu`` runs it here with eager stand-ins."""

import importlib.util
from pathlib import Path

import pytest
import torch

from lfm2vl_lab import GraphedEncoder, build_model
from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.packing import tokens_for
from lfm2vl_lab.core.plan import plan_config

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sanitize_replay", ROOT / "scripts" / "sanitize_replay.py")
san = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(san)


@pytest.mark.parametrize("rule", san.RULES)
def test_every_captured_graph_gets_exactly_one_case(tiny_model, rule):
    genc = GraphedEncoder(tiny_model, budgets=san.BUDGETS, max_run_items=san.MAX_RUN_ITEMS, cu_seqlens_rule=rule,
                          record=eager_stand_in)
    cfg, adapter = genc.config, genc.adapter
    captured = {(b, v.name) for b in cfg.graph_budgets for v in adapter.graph_variants(b)}
    wanted = [want for _, want in san.CASES]
    assert sorted(wanted) == sorted(captured) and len(set(wanted)) == len(wanted)
    assert {"varlen", "dense1", "dense1+varlen"} <= {v.name for v in adapter.variants}
    assert cfg.run_budget in cfg.graph_budgets
    for shapes, (budget, variant) in san.CASES:
        tokens = [tokens_for(s) for s in shapes]
        batches, eager = plan_config(tokens, cfg)
        assert eager == [] and len(batches) == 1, f"{shapes}: {batches} batches, {eager} eager"
        batch = batches[0]
        got = cfg.budget_for(sum(tokens), len(batch))
        assert got == budget, f"{shapes}: budget {got}, want {budget}"
        assert adapter.variant_for(got, [shapes[i] for i in batch]).name == variant


@torch.no_grad()
def test_the_fused_text_phase_replays_every_graph_it_captures_with_the_eager_tokens(monkeypatch):
    """The phase that puts the kit's Triton kernels under the sanitizer: a fused engine's six graphs
    (prefill, sample and decode for one and two requests), each replayed (stand-ins here), no problem
    reported; and a graphed engine that gives other tokens than its eager twin is reported."""
    model = build_model("tiny", text_layers=4)
    problems = []
    assert san.fused_text_part(model, eager_stand_in, problems) == {"graphs": 6} and problems == []
    real = san.text_tokens
    calls = []

    def off_by_one(eng, *args, **kwargs):  # the graphed engine's tokens (its first call of each pair) change
        calls.append(eng)
        out = real(eng, *args, **kwargs)
        return out + 1 if len(calls) % 2 else out

    monkeypatch.setattr(san, "text_tokens", off_by_one)
    san.fused_text_part(model, eager_stand_in, problems)
    assert len(problems) == 2 and all("[text fused]" in p and "differ" in p for p in problems), problems

