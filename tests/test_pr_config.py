"""The named graph configs (``GraphOptions.named``): "pr" is the budget set and item limit vLLM PR
#44930 measured with, every other setting the kit's; what it captures and how it plans batches, read
off the CPU stand-in, and that its replays equal transformers'. Then ``bench --graph-config kit,pr``:
graph modes run once per name and their rows name it; other modes run once and never name it; a bad
name, or a named config beside the settings it sets itself, is refused before anything is built."""

from __future__ import annotations

import random
import time
from dataclasses import fields

import pytest

from lfm2vl_lab.cli.cli import bench_graph_configs, build_parser, main
from lfm2vl_lab.core.capture import EagerStandIn, eager_stand_in
from lfm2vl_lab.core.config import GRAPH_CONFIGS, GraphOptions
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.packing import tokens_for
from lfm2vl_lab.core.plan import plan_config
from lfm2vl_lab.measure import bench, modes
from lfm2vl_lab.measure.bench import RunSpec, expand_specs, run_bench
from lfm2vl_lab.measure.table import graph_config_label
from lfm2vl_lab.measure.workloads import random_processor_output
from lfm2vl_lab.model.hf import hf_image_features
from lfm2vl_lab.model.parity import rel_error

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


def lazy_stand_in(fn, pool=None, warmup=0):
    """The eager stand-in without its run at capture: the "pr" set's 49 variants, 24 of them on 16384
    rows, would cost the CPU more than every replay these tests make."""
    return EagerStandIn(fn)


@pytest.fixture(scope="module")
def pr_encoder(tiny_model):
    """The "pr" config captured on the tiny preset (same processor limits as the real ones)."""
    genc = GraphedEncoder(tiny_model, GraphOptions.named("pr"), record=lazy_stand_in)
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
    assert {b: tuple(v.name for v in pr_encoder.adapter.graph_variants(b)) for b in PR_BUDGETS} == PR_VARIANTS
    assert {b: tuple(map(str, g.graphs)) for b, g in pr_encoder.graphs.items()} == PR_VARIANTS
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
    assert [adapter.variant_for(u, tuple(shapes[i] for i in b)).name for u, b in zip(used, planned)] == variants


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


# --------------------------------------------------------------------------------------------
# bench --graph-config
# --------------------------------------------------------------------------------------------

ALL = ["hf-eager", "lab-eager", "lab-graph", "compile", "lab-graph-fused"]


def test_graph_modes_run_once_per_named_config_and_the_others_once():
    specs = expand_specs(ALL, graph_configs=["kit", "pr"])
    by_mode = {m: [s for s in specs if s.mode == m] for m in ALL}
    for m in ("hf-eager", "lab-eager", "compile"):
        assert len(by_mode[m]) == 1 and by_mode[m][0].graph_config is None
        assert "graph_config" not in by_mode[m][0].labels()
    for m in ("lab-graph", "lab-graph-fused"):
        assert [(s.graph_config, s.options) for s in by_mode[m]] == \
            [("kit", GraphOptions()), ("pr", GraphOptions.named("pr"))]
        kit, pr = (s.labels() for s in by_mode[m])
        assert (kit["graph_config"], kit["budget_set"]) == ("kit", "auto")
        assert (pr["graph_config"], pr["budget_set"]) == ("pr", "64,256,512,1024,2048,4096")
    assert expand_specs(["lab-graph"], graph_configs=["pr", "pr"]) == [RunSpec("lab-graph", GraphOptions.named("pr"),
                                                                               graph_config="pr")]


def test_named_configs_combine_with_the_other_sweeps():
    specs = expand_specs(["lab-eager", "lab-graph"], sweep={"cu_seqlens_rule": ["safe", "repeat_last"]},
                         graph_configs=["kit", "pr"])
    graph = [(s.graph_config, s.options.cu_seqlens_rule, s.options.max_items) for s in specs if s.mode == "lab-graph"]
    assert graph == [("kit", "safe", None), ("kit", "repeat_last", None), ("pr", "safe", 16), ("pr", "repeat_last", 16)]
    assert [s.mode for s in specs].count("lab-eager") == 1  # the cu rule does not concern it


@pytest.mark.parametrize("kwargs, needle", [
    ({"graph_configs": ["vllm"]}, "unknown graph config 'vllm'; choose from kit, pr"),
    ({"graph_configs": []}, "non-empty"),
    ({"graph_configs": ["pr"], "sweep": {"budgets": ["auto"]}},
     "['pr'] set budgets, max_items themselves: leave budgets out"),
    ({"graph_configs": ["kit", "pr"], "base": GraphOptions(max_items=4)}, "leave max_items out"),
])
def test_named_configs_refuse_what_they_cannot_honour(kwargs, needle):
    with pytest.raises(ValueError) as exc:
        expand_specs(["lab-graph"], **kwargs)
    assert needle in str(exc.value)
    with pytest.raises(ValueError, match="unknown graph config"):
        RunSpec("lab-graph", graph_config="vllm")


def test_the_flag_parses_a_comma_list():
    args = build_parser().parse_args(["bench", "--graph-config", "kit,pr", "--mode", "lab-graph"])
    assert args.graph_config == ["kit", "pr"] and bench_graph_configs(args) == ["kit", "pr"]
    assert bench_graph_configs(build_parser().parse_args(["bench"])) is None


@pytest.mark.parametrize("argv, needle", [
    (["bench", "--graph-config", "kit,vllm"], "argument --graph-config: unknown graph config 'vllm'"),
    (["bench", "--graph-config", "pr", "--budgets", "64,256", "--device", "cpu"], "leave out --budgets"),
])
def test_bad_flags_are_one_error_line_and_exit_2(argv, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert exc.value.code == 2 and "Traceback" not in err
    assert len(errors) == 1 and needle in errors[0], err
    assert list(tmp_path.iterdir()) == []


def _cpu_capture(genc, progress):
    """modes._captured without CUDA: the stand-in, the meter's fields (no pool on a CPU)."""
    genc.record = lazy_stand_in
    t0 = time.perf_counter()
    rows = [dict(r, capture_s=0.0, pool_mb=0.0, total_mb=r["buffers_mb"]) for r in genc.capture(warmup_iters=0)]
    return modes._graph_info(genc, rows, time.perf_counter() - t0)


def test_each_named_config_has_its_own_rows_with_capture_memory_and_waste(monkeypatch):
    """The whole bench path on the CPU (graphs replaced by the stand-in): each config's rows carry
    what the PR-config table reads."""
    monkeypatch.setattr(bench, "CUDA_ONLY", {})
    monkeypatch.setattr(modes, "_captured", _cpu_capture)
    res = run_bench(preset="tiny", device="cpu", modes=["hf-eager", "lab-graph"], workloads=["16x512", "stream"],
                    stream_n=3, repeats=1, warmup=0, progress=False, graph_configs=["kit", "pr"])
    assert res["errors"] == []
    hf = [r for r in res["rows"] if r["mode"] == "hf-eager"]
    assert len(hf) == 2 and all("graph_config" not in r for r in hf)
    graph = {(r["graph_config"], r["workload"]): r for r in res["rows"] if r["mode"] == "lab-graph"}
    assert sorted(graph) == [("kit", "16x512"), ("kit", "stream"), ("pr", "16x512"), ("pr", "stream")]
    for (name, _), r in graph.items():
        assert {"capture_s", "graph_total_mb", "graph_pool_mb", "graph_buffers_mb", "padding_waste",
                "replays"} <= set(r)
        assert (r["budgets"], r["max_items"]) == (([64, 128, 256, 512, 1024], 16) if name == "kit" else
                                                  ([64, 256, 512, 1024, 2048, 4096], 16))
        assert graph_config_label(r).startswith(f"{name}:{r['budget_set']}/")
    assert graph["pr", "16x512"]["replays"] == {"4096": 1}  # 16 tiles in one replay
    assert graph["kit", "16x512"]["replays"] == {"2048": 2}  # 8 per replay on the kit's run budget
    assert graph["pr", "16x512"]["max_rel_err_vs_hf"] <= 1e-4
