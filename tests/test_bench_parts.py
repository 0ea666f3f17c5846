"""The benchmark's parts on the CPU: configurations from sweeps, errors that never disappear
(mismatches, tracebacks, unreadable result files) and the fused mode's fallback rule."""

import json
from dataclasses import fields

import pytest
import torch

from lfm2vl_lab.core.config import GraphOptions
from lfm2vl_lab.measure.bench import RunSpec, expand_specs, measure_fixed, run_bench
from lfm2vl_lab.measure.modes import SETTING_MODES, Runner, is_trace_failure, row_labels
from lfm2vl_lab.measure.results import UnreadableResultWarning, load_results, save_result
from lfm2vl_lab.measure.table import format_table
from lfm2vl_lab.measure.workloads import NXS, TILED_SIZE, parse_nxs, workload_images


def test_run_spec_defaults_are_explicit():
    s = RunSpec("lab-graph")
    assert (s.options, s.compile_mode) == (GraphOptions(), "default")
    d = GraphOptions()
    assert s.labels() == {"mode": "lab-graph", "budget_set": "auto", "cu_rule": d.cu_seqlens_rule,
                          "max_seqlen_mode": d.max_seqlen_mode, "attention": d.attention, "fuse_qkv": d.fuse_qkv,
                          "fuse_elementwise": d.fuse_elementwise, "dense_graphs": d.dense_graphs}
    assert RunSpec("lab-graph", GraphOptions(budgets=(64, 256))).labels()["budget_set"] == "64,256"
    # a setting that does not concern a mode is kept at its default, so it names no row
    assert RunSpec("hf-eager", GraphOptions(cu_seqlens_rule="repeat_last", fuse_qkv=False)) == RunSpec("hf-eager")
    assert RunSpec("hf-eager").labels() == {"mode": "hf-eager"}
    assert RunSpec("compile", compile_mode="max-autotune").labels() == {"mode": "compile",
                                                                        "compile_mode": "reduce-overhead"}


def test_row_labels_name_every_setting_a_mode_is_built_with():
    fused = row_labels("lab-graph-fused", GraphOptions(max_seqlen_mode="loose"), "max-autotune")
    assert fused["compile_mode"] == "max-autotune" and fused["max_seqlen_mode"] == "loose"
    assert "dense_graphs" not in fused  # a compiled body gets no dense graphs
    eager = row_labels("lab-eager", GraphOptions(fuse_qkv=False))
    assert eager == {"mode": "lab-eager", "attention": "auto", "fuse_qkv": False,
                     "fuse_elementwise": GraphOptions.fuse_elementwise}
    # a setting without a row name of its own is named only off its default
    assert "max_run_items" not in row_labels("lab-graph")
    assert row_labels("lab-graph", GraphOptions(max_run_items=2))["max_run_items"] == 2
    assert set(SETTING_MODES) == {f.name for f in fields(GraphOptions)}, "say which modes a new setting concerns"


def test_expand_specs_sweeps_only_where_a_setting_applies():
    sweep = {"budgets": [None, [64, 256]], "cu_seqlens_rule": ["safe", "repeat_last"],
             "attention": ["auto", "sdpa_blockmask"], "fuse_qkv": [False, True], "fuse_elementwise": [False, True],
             "dense_graphs": [True, False]}
    specs = expand_specs(["hf-eager", "lab-eager", "lab-graph", "compile"], sweep=sweep)
    by_mode = {m: [s for s in specs if s.mode == m] for m in ("hf-eager", "lab-eager", "lab-graph", "compile")}
    assert by_mode["hf-eager"] == [RunSpec("hf-eager")] and by_mode["compile"] == [RunSpec("compile")]
    assert len(by_mode["lab-eager"]) == 2 * 2 * 2  # attention x fuse_qkv x fuse_elementwise; no graph settings
    assert {(s.options.budgets, s.options.cu_seqlens_rule) for s in by_mode["lab-eager"]} == \
        {(None, GraphOptions.cu_seqlens_rule)}
    assert len(by_mode["lab-graph"]) == 2 * 2 * 2 * 2 * 2 * 2  # budgets x cu rules x attention x 2 fusions x dense
    assert {s.options.budgets for s in by_mode["lab-graph"]} == {None, (64, 256)}
    assert [s.mode for s in specs[:1]] == ["hf-eager"] and len(set(specs)) == len(specs)
    assert expand_specs(["lab-eager", "lab-eager"]) == [RunSpec("lab-eager")]  # duplicates run once
    # the base carries the settings not swept; "auto" and "64,256" are budget sets too
    base = GraphOptions(max_seqlen_mode="loose")
    (one,) = expand_specs(["lab-graph"], base, {"budgets": ["64,256"]}, compile_mode="max-autotune")
    assert one == RunSpec("lab-graph", GraphOptions(budgets=(64, 256), max_seqlen_mode="loose"), "max-autotune")
    with pytest.raises(ValueError, match="dense_graphs"):  # no None standing for "the default"
        expand_specs(["lab-graph"], sweep={"dense_graphs": [None]})
    with pytest.raises(ValueError, match="cu_seqlens_rule"):  # a string is not a list of values
        expand_specs(["lab-graph"], sweep={"cu_seqlens_rule": "safe"})


def test_nxs_and_tiled_are_stated_once():
    assert parse_nxs("4x512") == (4, 512) and parse_nxs("tiled") is None and NXS.fullmatch("2x256")
    assert workload_images("tiled")[0].size == TILED_SIZE


def test_an_output_that_cannot_be_compared_is_an_error_not_a_blank():
    ref = [torch.ones(4, 8)]
    wrong_shape = Runner("lab-eager", lambda inp: [torch.ones(5, 8)])
    row = measure_fixed(wrong_shape, {}, "cpu", repeats=1, warmup=0, ref=ref)
    assert row["max_rel_err_vs_hf"] is None and "shape mismatch" in row["error"]
    wrong_count = Runner("lab-eager", lambda inp: [torch.ones(4, 8)] * 2)
    assert "2 outputs vs 1 references" in measure_fixed(wrong_count, {}, "cpu", 1, 0, ref=ref)["error"]
    good = measure_fixed(Runner("lab-eager", lambda inp: [torch.ones(4, 8)]), {}, "cpu", 1, 0, ref=ref)
    assert good["max_rel_err_vs_hf"] == 0 and "error" not in good
    table = format_table([dict(row, workload="1x256", n_items=1), dict(good, workload="1x256", n_items=1)])
    err_col = [line.split()[-1] for line in table.splitlines()[2:]]
    assert err_col == ["ERROR", "0.0e+00"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="attention='varlen' builds on CUDA")
def test_a_failed_configuration_keeps_its_traceback():
    res = run_bench(preset="tiny", modes=["lab-eager"], workloads=["1x256"], sweep={"attention": ["varlen", "auto"]},
                    repeats=1, warmup=0, device="cpu", progress=False)
    (err,) = res["errors"]
    assert (err["mode"], err["stage"]) == ("lab-eager", "setup") and err["error"].startswith("ValueError: ")
    assert err["traceback"].startswith("Traceback (most recent call last)") and "varlen" in err["traceback"]
    assert len(res["rows"]) == 1  # the other configuration still ran
    table = format_table(res)
    assert "ERROR lab-eager" in table and "Traceback" not in table  # the table shows the short form
    json.dumps(res)  # a result file can hold it


def test_load_results_names_an_unreadable_file(tmp_path):
    save_result({"name": "ok", "provenance": {"gpu": "cpu", "date": "2026-11-01T12:00:00+00:00"}, "rows": []},
                tmp_path)
    (tmp_path / "cpu" / "broken-20261101-120001.json").write_text('{"provenance": {')  # cut short
    with pytest.warns(UnreadableResultWarning, match="broken-20261101-120001.json"):
        loaded = load_results(tmp_path)
    assert [r["name"] for r in loaded] == ["ok"]  # the readable file is still there


def _graph_break_error() -> Exception:
    def body(x):
        torch._dynamo.graph_break()
        return x + 1

    torch._dynamo.reset()
    try:
        torch.compile(body, fullgraph=True, backend="eager")(torch.ones(2))
    except Exception as exc:  # what dynamo really raises for a body it cannot trace whole
        return exc
    raise AssertionError("fullgraph=True compiled a graph break")


def test_only_trace_failures_send_the_fused_mode_to_graph_breaks():
    trace = _graph_break_error()
    assert is_trace_failure(trace)
    try:  # a capture wraps the body's error in its own; the chain is searched
        try:
            raise trace
        except Exception as inner:
            raise RuntimeError("capturing the 256-token encoder graph failed") from inner
    except RuntimeError as wrapped:
        assert is_trace_failure(wrapped)
    try:  # as a failed capture raises it: ending the capture fails during the body's error, then is wrapped
        try:
            try:
                raise trace
            except Exception:
                raise RuntimeError("operation not permitted when stream is capturing") from None
        except RuntimeError as end:
            raise RuntimeError("capturing the 1024-token encoder graph failed") from end
    except RuntimeError as wrapped:
        assert wrapped.__cause__.__cause__ is None and is_trace_failure(wrapped)
    assert not is_trace_failure(RuntimeError("CUDA out of memory"))
    assert not is_trace_failure(ValueError("bad budget"))
