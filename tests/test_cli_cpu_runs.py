"""On a machine without CUDA every subcommand says what actually ran: no line names a graphed path
for code that ran eagerly, and a target that needs a GPU reads "not measured here", never
"MISSED". The result files keep their data (mode names, targets as judged); only the words printed
differ. Each run is the smallest the options allow (tiny preset, one request, one round).
"""

from __future__ import annotations

import json

import pytest
import torch

from lfm2vl_lab.cli.cli import build_parser, main
from lfm2vl_lab.cli.cli_serving import target_line
from lfm2vl_lab.measure.table import format_table

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="what a run without CUDA prints")


def run_cli(argv, capsys) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().out


def graphed_lines(out: str) -> list[str]:
    """Lines that name a graphed path, except the targets' own names (judged "not measured here")."""
    return [line for line in out.splitlines() if ("graphed" in line or "lab-graph" in line)
            and not (line.startswith("target ") and "not measured here" in line)]


def only_result(root) -> dict:
    (path,) = root.rglob("*.json")
    return json.loads(path.read_text())


def test_ttft_on_cpu_names_what_ran_and_leaves_targets_unjudged(tmp_path, capsys):
    status, out = run_cli(["ttft", "--preset", "tiny", "--image", "1x512", "--requests", "1", "--repeats", "1",
                           "--decode-tokens", "1", "--no-progress", "--out", str(tmp_path)], capsys)
    assert status == 0
    assert "MISSED" not in out and not graphed_lines(out), out
    assert "note: no CUDA, so no CUDA graphs" in out
    assert "text-lab-eager+encoder-lab-eager  TTFT" in out and "encoder-graph cut" not in out
    timed = [line for line in out.splitlines() if line.startswith("target ") and "limit True" not in line]
    assert len(timed) == 3 and all("not measured here (no CUDA GPU" in line for line in timed), timed
    assert max(len(line) for line in out.splitlines() if not line.startswith("results:")) <= 130
    res = only_result(tmp_path)  # the file keeps the modes' names, the notes and the targets as judged
    graphed = [r for r in res["rows"] if r["mode"] == "text-graphed+encoder-graphed"]
    assert len(graphed) == 1 and "ran eagerly" in graphed[0]["note"]
    assert any(t["value"] is None and t["ok"] is False for t in res["targets"])
    assert set(res["parity"][0]["modes"]) == {f"text-{t}+encoder-{e}" for t in ("eager", "graphed")
                                              for e in ("eager", "graphed")}


def test_e2e_on_cpu_names_the_packed_eager_encoder(tmp_path, capsys):
    status, out = run_cli(["e2e", "--preset", "tiny", "--image", "1x512", "--requests", "1", "--new-tokens", "2",
                           "--repeats", "1", "--no-progress", "--out", str(tmp_path)], capsys)
    assert status == 0
    assert "MISSED" not in out and not graphed_lines(out), out
    assert "note: lab-eager rows: no CUDA graphs captured" in out
    assert [line.split()[3] for line in out.splitlines() if line.strip().startswith("tiny")] == ["hf-eager",
                                                                                                 "lab-eager"]
    assert "parity tiny: logits rel err" in out and "{" not in out  # a line, not a dict
    assert [r["mode"] for r in only_result(tmp_path)["rows"]] == ["hf-eager", "lab-eager"]


def test_bench_on_cpu_runs_no_graph_mode_and_says_so(tmp_path, capsys):
    status, out = run_cli(["bench", "--preset", "tiny", "--mode", "lab-eager,lab-graph", "--workload", "1x256",
                           "--repeats", "1", "--warmup", "0", "--no-progress", "--figure", "none",
                           "--out", str(tmp_path)], capsys)
    assert status == 0
    assert "MISSED" not in out
    assert [line.split()[0] for line in out.splitlines()[2:] if line.startswith("lab-")] == ["lab-eager"]
    assert "skipped lab-graph (not run, no row): CUDA graphs need a CUDA device (device is cpu)" in out
    res = only_result(tmp_path)
    assert [r["mode"] for r in res["rows"]] == ["lab-eager"] and [s["mode"] for s in res["skipped"]] == ["lab-graph"]


def test_a_bench_of_skipped_modes_only_says_nothing_ran():
    table = format_table({"rows": [], "skipped": [{"mode": "lab-graph", "reason": "CUDA graphs need a CUDA device"}]})
    assert table.splitlines()[0] == "no rows: nothing was measured (every mode asked for was skipped)"
    assert "median ms" not in table  # no empty table header


def test_check_on_cpu_is_one_error_line_and_prints_nothing_else(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--preset", "tiny", "--out", str(tmp_path)])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not list(tmp_path.iterdir())
    assert captured.err.strip().splitlines()[-1] == ("python -m lfm2vl_lab check: error: check needs a CUDA GPU "
                                                     "and none is available; on a CPU run the test suite instead "
                                                     "(make test)")


def test_build_model_on_cuda_without_cuda_names_the_cpu_way():
    from lfm2vl_lab import build_model
    from lfm2vl_lab.model.presets import load_model

    with pytest.raises(ValueError) as exc:
        build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda", text_layers="full")
    msg = str(exc.value)
    assert msg.startswith("build_model(device='cuda'): this machine has no CUDA GPU") and "\n" not in msg
    assert 'device="cpu"' in msg and '"tiny" preset' in msg
    with pytest.raises(ValueError, match=r"load_model\(device='cuda:1'\): this machine has no CUDA GPU"):
        load_model("no-such-folder", device="cuda:1")
    assert build_model("tiny", device="cpu").device.type == "cpu"


# ---- cheap: the printing of targets, and the help of every subcommand ----------------------------

def test_a_target_needing_a_gpu_is_not_measured_here_and_a_measured_miss_is_a_miss():
    timed = {"target": "TTFT ms, both graphed", "value": 7.25, "limit": 6.0, "ok": False, "detail": ""}
    assert target_line(timed, cuda=False) == \
        "target TTFT ms, both graphed (limit 6.0): not measured here (no CUDA GPU: no graphs ran)"
    assert target_line(timed, cuda=True) == "target TTFT ms, both graphed: 7.25 (limit 6.0) MISSED"
    absent = dict(timed, value=None)
    assert "not measured here (judged on lfm2-vl-450m" in target_line(absent, cuda=True)
    tokens = {"target": "every mode's first tokens equal eager's", "value": True, "limit": True, "ok": True,
              "detail": ""}
    assert target_line(tokens, cuda=False) == "target every mode's first tokens equal eager's: True (limit True) ok"


def test_seed_repeats_and_no_progress_have_help_wherever_they_are():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    seen = []
    for name, parser in sub.choices.items():
        for action in parser._actions:
            for option in set(action.option_strings) & {"--seed", "--repeats", "--no-progress"}:
                seen.append(f"{name} {option}")
                assert action.help, f"{name} {option} has no help text"
    assert {"bench --seed", "e2e --repeats", "ttft --repeats", "e2e --no-progress", "ttft --no-progress"} <= set(seen)
