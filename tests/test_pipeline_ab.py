"""The kit's side of the vLLM A/B (role ``pipeline``), apart from vLLM's (role ``vllm``): it runs every case,
arm and parity prompt on the CPU's tiny preset, the report sets its rows beside vLLM's and names both
files, and vLLM's role no longer measures the kit's serving code."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.measure import pipeline_ab, vllm_ab
from lfm2vl_lab.measure.role_code import command_modules, measured_files
from lfm2vl_lab.report.vllm_report import ab_frame, summary_lines, with_pipeline
from lfm2vl_lab.serving.engine import TextEngine

SHORT = (3, 5)


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    """The tiny preset through the kit's side, fp32 on the CPU. The CPU captures no graph, so the
    captures are stood in for: every call then runs the arms' eager fallbacks, which is what this
    checks the bookkeeping of. Requests of 3 and 5 tokens stand in for 16 and 128 (the CPU's time)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(pipeline_ab, "TOKENS", SHORT)
    mp.setattr(TextEngine, "capture", lambda self, shapes: {"stand_in": True})
    mp.setattr(GraphedEncoder, "capture", lambda self: None)
    try:
        yield pipeline_ab.measure_preset("tiny", 2, tmp_path_factory.mktemp("folders"), 0, lambda s: None,
                                         device="cpu", dtype=torch.float32)
    finally:
        mp.undo()


def test_every_case_output_length_and_arm_has_a_row_with_its_phases(section):
    got = {(r["case"], r["tokens"], r["arm"]) for r in section["rows"]}
    assert got == {(vllm_ab.case_name(i, n), t, a) for i, n in vllm_ab.CASES for t in SHORT for a in vllm_ab.ARMS}
    for r in section["rows"]:
        assert r["engine"] == "kit" and r["rounds"] == 2 and 0 < r["ttft_ms"] <= r["e2e_ms"]
        assert {"encoder", "prefill", "decode"} <= set(r["phases_ms"])
        assert ("ttft_cut" in r) == (r["arm"] != "off")


def test_each_arm_is_judged_on_both_parity_prompts_against_float32(section):
    assert set(section["parity"]) == {f"{a}/{im}" for a in vllm_ab.ARMS for im in vllm_ab.PARITY_IMAGES}
    for c in section["parity"].values():
        # fp32 against an fp32 copy of the same weights: the kit's pipeline follows its greedy path
        assert c["logits_ok"] and c["as_fp32"] == vllm_ab.PARITY_TOKENS
    assert [r["image"] for r in section["references"]] == list(vllm_ab.PARITY_IMAGES)


def _vllm_file(preset: str) -> dict:
    rows = [dict(r, engine="vllm") for r in vllm_ab.case_rows(
        preset, "1x512", 1, SHORT[0], {a: {"e2e_ms": [50.0, 52.0], "ttft_ms": [20.0, 21.0]} for a in vllm_ab.ARMS})]
    return {"name": "vllm", "provenance": {"vllm": "0.25.1"}, "settings": {"rounds": 2},
            "presets": {preset: {"rounds": 2}}, "rows": rows}


def test_the_report_sets_the_kits_rows_beside_vllms_and_names_both_files(section):
    kit = {"name": "pipeline", "settings": {"repeats": 2}, "presets": {"tiny": section},
           "rows": section["rows"] + [dict(section["rows"][0], preset="lfm2-vl-3b")]}
    vllm = _vllm_file("tiny")
    ab = with_pipeline(vllm, kit)
    assert ab["files"] == [vllm, kit] and ab["settings"]["kit_repeats"] == 2
    assert ab["presets"]["tiny"]["kit_repeats"] == 2
    # the kit's rows of the presets vLLM has, and only those; vLLM's file is left as it was
    assert {r["engine"] for r in ab["rows"]} == {"vllm", "kit"}
    assert {r["preset"] for r in ab["rows"]} == {"tiny"} and len(vllm["rows"]) == 3
    more = {**kit, "presets": {"tiny": section, "lfm2-vl-3b": {}}}  # a preset vLLM's file lacks: named
    assert with_pipeline(vllm, more)["kit_left_out"] == ["lfm2-vl-3b"]
    df = ab_frame(ab)
    assert set(df.index.get_level_values("engine")) == {"vLLM", "kit's pipeline"}
    assert with_pipeline(None, kit) is None
    alone = with_pipeline(vllm, None)
    assert alone["files"] == [vllm] and {r["engine"] for r in alone["rows"]} == {"vllm"}


def test_the_terminal_table_reads_a_pipeline_file(section):
    rows = [dict(r, tokens=vllm_ab.TOKENS[SHORT.index(r["tokens"])]) for r in section["rows"]]  # as recorded
    table = "\n".join(summary_lines({"presets": {"tiny": section}, "rows": rows}))  # what `pipeline` prints
    assert "kit's pipeline" in table and "TTFT cut %, pr" in table


def test_vllms_role_measures_no_serving_code_and_the_pipelines_does():
    vllm = measured_files(command_modules("vllm"))
    kit = measured_files(command_modules("pipeline"))
    assert not [f for f in vllm if f.startswith("lfm2vl_lab/serving/")]
    assert "lfm2vl_lab/serving/engine.py" in kit and "lfm2vl_lab/measure/pipeline_ab.py" in kit
    assert "lfm2vl_lab/measure/ab_inputs.py" in vllm and "lfm2vl_lab/measure/ab_inputs.py" in kit


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's one-line refusal")
def test_pipeline_refuses_a_machine_without_a_gpu_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "pipeline", "--preset", "tiny"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "pipeline needs a CUDA GPU" in errors[0]


def test_vllms_side_drives_three_engines_through_parity_and_rounds_without_the_kits_pipeline(monkeypatch, tmp_path):
    """vLLM's side of a preset with stand-in engines (the CPU has no vLLM): each arm's engine starts
    with its compilation config, is judged on the parity prompts and timed in the rounds; no kit row."""
    import functools

    from lfm2vl_lab.measure import ab_inputs, vllm_engine, vllm_preset

    started = []

    def run_batch(llm, prompt, images, max_tokens, logprobs=None):
        req = {"ttft_ms": 10.0, "queue_ms": 0.1, "scheduled_to_first_ms": 5.0, "processor_ms": 2.0, "prompt_len": 9,
               "tokens": [1] * max_tokens, "prompt_token_ids": [1] * 9}
        if logprobs:
            req["first_logits"] = {1: 0.5, 2: 0.1}
        return {"wall_ms": 20.0, "requests": [dict(req) for _ in images], "encoder": [{"gpu_ms": 1.0, "host_ms": 1.1}],
                "graph_stats": {"graph_hits": 1, "graph_misses": 0}}

    monkeypatch.setattr(vllm_preset, "prepare", functools.partial(ab_inputs.prepare, device="cpu", dtype=torch.float32))
    monkeypatch.setattr(vllm_engine, "start_engine", lambda folder, cfg, *a: started.append(cfg) or (object(), 1.0, {}))
    monkeypatch.setattr(vllm_engine, "run_batch", run_batch)
    monkeypatch.setattr(vllm_engine, "encoder_capture", lambda llm: {"graphs": 3})
    sec = vllm_preset.measure_preset("tiny", 2, tmp_path, 0, lambda s: None)
    assert started == [vllm_ab.compilation_config(a, "tiny") for a in vllm_ab.ARMS]
    assert set(sec["parity"]) == set(vllm_ab.ARMS) and "kit" not in sec and "kit_repeats" not in sec
    cases, _ = vllm_ab.vllm_cases("tiny")
    assert {(r["engine"], r["case"], r["tokens"], r["arm"]) for r in sec["rows"]} == {
        ("vllm", vllm_ab.case_name(i, n), t, a) for i, n in cases for t in vllm_ab.TOKENS for a in vllm_ab.ARMS}
    assert all(r["rounds"] == 2 for r in sec["rows"])

