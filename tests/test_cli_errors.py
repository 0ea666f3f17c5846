"""Every bad command-line input is one ``error:`` line and exit status 2, never a traceback; good
input still parses. In-process through ``__main__.main`` (cheap: argparse rejects the value before
any model is built), plus one real subprocess for the real exit code."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lfm2vl_lab.cli.cli import build_parser, main
from lfm2vl_lab.measure.bench import run_bench
from lfm2vl_lab.measure.e2e import run_e2e
from lfm2vl_lab.model.presets import CHECKPOINT_ENV

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="the case is an error only on a machine without CUDA")

# (argv, a string the error line must contain: the bad value, or what is missing)
BAD = [
    (["bench", "--preset", "nope"], "'nope'"),
    (["bench", "--mode", "lab-eager,fast"], "'fast'"),
    (["bench", "--mode", "lab-eager", "--mode", "fast"], "'fast'"),
    (["bench", "--workload", "big"], "'big'"),
    (["bench", "--workload", "0x512"], "'0x512'"),
    (["bench", "--cu-rule", "safe,wrong"], "'wrong'"),
    (["bench", "--max-seqlen-mode", "medium"], "'medium'"),
    (["bench", "--attention", "flash"], "'flash'"),
    (["bench", "--fuse-qkv", "maybe"], "'maybe'"),
    (["bench", "--fused-compile-mode", "fastest"], "'fastest'"),
    (["bench", "--dtype", "fp64"], "'fp64'"),
    (["bench", "--device", "tpu"], "'tpu'"),
    (["bench", "--device", "cuda:99"], "'cuda:99'"),
    pytest.param(["bench", "--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    (["bench", "--budgets", "abc"], "'abc'"),
    (["bench", "--budgets", "64,-1"], "'64,-1'"),
    (["bench", "--repeats", "0"], "'0'"),
    (["bench", "--repeats", "-2"], "'-2'"),
    (["bench", "--repeats", "many"], "'many'"),
    (["bench", "--warmup", "-1"], "'-1'"),
    (["bench", "--stream-n", "0"], "'0'"),
    (["e2e", "--image", "banana"], "'banana'"),
    (["e2e", "--requests", "0"], "'0'"),
    (["e2e", "--new-tokens", "16,0"], "'0'"),
    (["e2e", "--repeats", "0"], "'0'"),
    (["e2e", "--preset", "nope"], "'nope'"),
    (["check", "--preset", "nope"], "'nope'"),
    (["check", "--dtype", "int8"], "'int8'"),
    pytest.param(["check"], "CUDA GPU", marks=NO_CUDA),
    pytest.param(["attention"], "CUDA GPU", marks=NO_CUDA),
    (["attention", "--preset", "nope"], "'nope'"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_input_is_one_error_line_and_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"python -m lfm2vl_lab {argv[0]}: error: "), err
    assert needle in errors[0], err


def test_bad_input_exit_code_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "bench", "--repeats", "0", "--out", str(tmp_path)],
                          cwd=ROOT,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "python -m lfm2vl_lab bench: error: argument --repeats: expected an integer >= 1, got '0'"
    assert list(tmp_path.iterdir()) == []  # no result file (before: one full of "-", and exit 0)


def _error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if "error:" in line]


def _checkpoint_folders(tmp_path, tiny_checkpoint) -> dict:
    """LFM2VL_CHECKPOINT values that name no loadable checkpoint -> what the error line must say."""
    empty, other, broken = tmp_path / "empty", tmp_path / "llama", tmp_path / "bad-tokenizer"
    empty.mkdir()
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "tokenizer.json").write_text("{not json")
    return {str(tmp_path / "missing"): f"{CHECKPOINT_ENV}='{tmp_path / 'missing'}' is not a folder",
            str(empty): f"{CHECKPOINT_ENV}='{empty}' has no config.json",
            str(other): f"{CHECKPOINT_ENV}='{other}' holds a 'llama' checkpoint, not an LFM2-VL one",
            str(broken): f"{CHECKPOINT_ENV}: '{broken}': its tokenizer files do not load"}


def test_a_bad_checkpoint_folder_is_one_error_line_in_every_command_that_loads_it(monkeypatch, capsys, tmp_path,
                                                                                  tiny_checkpoint):
    """bench and check load LFM2VL_CHECKPOINT's folder (README, "Real weights"): whatever is wrong
    with it, each says so in one ``error:`` line naming the value, exit status 2."""
    # check runs only on a GPU: a stand-in that holds until the model would move to it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for value, needle in _checkpoint_folders(tmp_path, tiny_checkpoint).items():
        monkeypatch.setenv(CHECKPOINT_ENV, value)
        for argv in (["bench", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "out")],
                     ["check", "--out", str(tmp_path / "out")]):
            with pytest.raises(SystemExit) as exc:
                main(argv)
            assert exc.value.code == 2, (argv, value)
            (line,) = _error_lines(capsys)
            assert line.startswith(f"python -m lfm2vl_lab {argv[0]}: error: {needle}"), (argv, line)
            assert line.endswith("or unset it to use the random-weight presets"), line
    assert not (tmp_path / "out").exists()  # nothing measured, no result file


def test_a_bad_checkpoint_folder_in_a_real_process(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", **{CHECKPOINT_ENV: "/nonexistent"})
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "bench", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"python -m lfm2vl_lab bench: error: {CHECKPOINT_ENV}='/nonexistent' is not a folder; set it to the folder "
        "you fetched the checkpoint into, or unset it to use the random-weight presets")
    assert list(tmp_path.iterdir()) == []


def test_good_input_still_parses():
    p = build_parser()
    a = p.parse_args(["bench", "--mode", "lab-eager,hf-eager", "--mode", "compile", "--workload", "1..4x256",
                      "--workload", "tiled", "--budgets", "auto", "--budgets", "256,64",
                      "--cu-rule", "safe,repeat_last",
                      "--fuse-qkv", "off,on", "--dtype", "BF16", "--device", "cpu", "--repeats", "3", "--warmup", "0",
                      "--preset", "tiny"])
    assert a.mode == [["lab-eager", "hf-eager"], ["compile"]]
    assert a.workload == [["1x256", "2x256", "4x256"], ["tiled"]]
    assert a.budgets == [None, [64, 256]] and a.cu_rule == ["safe", "repeat_last"] and a.fuse_qkv == [False, True]
    assert (a.dtype, a.device, a.repeats, a.warmup, a.preset) == ("bf16", torch.device("cpu"), 3, 0, "tiny")
    d = p.parse_args(["bench"])  # string defaults go through the same types
    assert (d.cu_rule, d.max_seqlen_mode, d.attention, d.fuse_qkv, d.fuse_elementwise, d.dense_graphs) == \
        (["safe"], ["tight"], ["auto"], None, None, None)  # None: the kit's own defaults (all on)
    e = p.parse_args(["e2e", "--image", "tiled", "--requests", "1,4", "--new-tokens", "2,8"])
    assert (e.image, e.requests, e.new_tokens, e.repeats) == (["tiled"], [1, 4], [2, 8], 5)


@pytest.mark.parametrize("kwargs,needle", [
    ({"repeats": 0}, "repeats"), ({"repeats": -1}, "repeats"), ({"warmup": -1}, "warmup"),
    ({"modes": ["fast"]}, "'fast'"), ({"sweep": {"cu_seqlens_rule": ["wrong"]}}, "'wrong'"),
    ({"sweep": {"attention": ["flash"]}}, "'flash'"), ({"sweep": {"cu_rule": ["safe"]}}, "cu_rule"),
    ({"compile_mode": "fastest"}, "'fastest'"),
    ({"workloads": ["stream"], "stream_n": 0}, "stream_n"), ({"sweep": {"budgets": ["abc"]}}, "'abc'"),
    ({"dtype": "fp64"}, "'fp64'"), ({"device": "tpu"}, "'tpu'"),
])
def test_run_bench_refuses_bad_arguments_before_building_anything(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        run_bench(**{"preset": "tiny", "device": "cpu", "progress": False, **kwargs})


@pytest.mark.parametrize("kwargs,needle", [
    ({"images": ("banana",)}, "'banana'"), ({"requests": (0,)}, "requests"), ({"repeats": 0}, "repeats"),
    ({"new_tokens": (0, 4)}, "new_tokens"),
])
def test_run_e2e_refuses_bad_arguments_before_building_anything(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        run_e2e(None, **kwargs)  # checked before the model is touched
