"""The ``compile-max`` bench mode on the CPU: listed but not a default, refused without CUDA, named
by its torch.compile mode, and built as ``torch.compile(mode="max-autotune")`` of the same function
``compile`` wraps (torch.compile is replaced by a recorder here: nothing compiles for real)."""

import pytest
import torch

from lfm2vl_lab import process_images, synthetic_image
from lfm2vl_lab.measure import modes
from lfm2vl_lab.measure.bench import RunSpec, measure_fixed, run_bench
from lfm2vl_lab.measure.modes import COMPILED_MODES, CUDA_ONLY, DEFAULT_MODES, MODES, Runner, make_runner, row_labels
from lfm2vl_lab.measure.table import format_table
from lfm2vl_lab.model.hf import hf_image_features
from lfm2vl_lab.report.plots import MODE_COLORS, MODE_ORDER


def test_compile_max_is_a_mode_but_not_a_default_one():
    assert "compile-max" in MODES and "compile-max" not in DEFAULT_MODES
    assert "compile-max" in CUDA_ONLY and "max-autotune" in CUDA_ONLY["compile-max"]
    assert MODE_ORDER.index("compile-max") == MODE_ORDER.index("compile") + 1  # drawn next to compile
    assert MODE_COLORS["compile-max"] not in {c for m, c in MODE_COLORS.items() if m != "compile-max"}


def test_row_labels_name_the_torch_compile_mode():
    assert row_labels("compile-max") == {"mode": "compile-max", "compile_mode": "max-autotune"}
    # compile's labels are the ones its recorded rows carry; the fused body's setting does not reach either
    assert row_labels("compile") == {"mode": "compile", "compile_mode": "reduce-overhead"}
    assert RunSpec("compile-max", compile_mode="default").labels() == row_labels("compile-max")


@pytest.mark.skipif(torch.cuda.is_available(), reason="compile-max runs on CUDA")
def test_a_cpu_run_refuses_compile_max_in_one_line():
    res = run_bench(preset="tiny", modes=["compile-max", "lab-eager"], workloads=["1x256"], repeats=1, warmup=0,
                    device="cpu", progress=False)
    assert res["skipped"] == [{"mode": "compile-max", "reason": f"{CUDA_ONLY['compile-max']} (device is cpu)"}]
    assert [r["mode"] for r in res["rows"]] == ["lab-eager"] and res["errors"] == []
    (line,) = [ln for ln in format_table(res).splitlines() if "compile-max" in ln]
    assert line.startswith("skipped compile-max (not run, no row): ") and "CUDA" in line


@pytest.mark.parametrize("mode", sorted(COMPILED_MODES))
def test_building_a_compiled_mode_wraps_transformers_image_path(mode, monkeypatch, tiny_model):
    """compile-max is torch.compile(mode="max-autotune"), compile torch.compile(mode="reduce-overhead"),
    of one function calling get_image_features; the runner's outputs are that function's."""
    seen = []

    def fake_compile(fn, **kwargs):
        seen.append(kwargs)
        return fn  # run eagerly: the wrapper is under test, not inductor

    monkeypatch.setattr(torch, "compile", fake_compile)
    runner = make_runner(mode, tiny_model)
    assert seen == [{"mode": COMPILED_MODES[mode]}]
    assert COMPILED_MODES["compile-max"] == "max-autotune" and COMPILED_MODES["compile"] == "reduce-overhead"
    assert runner.mode == mode and runner.info == row_labels(mode)
    inp = process_images(synthetic_image(256, 256), tiny_model)
    got, want = runner.call(inp), hf_image_features(tiny_model, inp)
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))


def test_make_compile_names_a_mode_it_does_not_know(tiny_model):
    with pytest.raises(ValueError, match="'lab-graph'"):
        modes.make_compile(tiny_model, "lab-graph")


def test_compile_max_rows_record_the_first_call_and_the_counters():
    row = measure_fixed(Runner("compile-max", lambda inp: [torch.ones(2)]), {}, "cpu", repeats=1, warmup=0)
    assert row["compile_first_call_s"] == pytest.approx(row["first_calls_ms"][0] / 1e3)
    assert isinstance(row["dynamo"], dict)
    rows = [dict(row, mode=m, workload="1x512", n_items=1, dynamo={"stats.unique_graphs": 2}) for m in COMPILED_MODES]
    notes = [ln for ln in format_table(rows).splitlines() if "first call" in ln]
    assert [ln.split(" [")[0] for ln in notes] == list(COMPILED_MODES)
    assert all("2 graphs compiled" in ln for ln in notes)
