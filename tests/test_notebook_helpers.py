"""What the notebooks lean on instead of copying it: report/notebook.py (setup, load_recorded),
plots.is_default_config, and a guard against re-implementing the
library inside a notebook cell."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import pytest
import torch
import transformers

import lfm2vl_lab
from lfm2vl_lab.measure.results import save_result
from lfm2vl_lab.measure.workloads import device_defaults
from lfm2vl_lab.report.frames import KERNEL_OPTIONS, is_default_config
from lfm2vl_lab.report.notebook import RECORDED_GPU, load_recorded, setup

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


# ------------------------------------------------------------------------------------------------
# setup()


def test_setup_on_cpu_prints_the_first_line_and_returns_the_device_defaults(capsys, tiny_model):
    import warnings

    from lfm2vl_lab.report.notebook import CPU_FALLBACK_NOTE

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        device, preset, dtype = setup("cpu")
        lfm2vl_lab.GraphedEncoder(tiny_model).encode(lfm2vl_lab.random_processor_output([(8, 8)], "tiny"))
    assert (device, (preset, dtype)) == ("cpu", device_defaults("cpu"))
    assert capsys.readouterr().out == (f"DEVICE=cpu  PRESET={preset}  DTYPE={dtype}  torch {torch.__version__}\n"
                                       f"{CPU_FALLBACK_NOTE}\n")
    # said once in the first cell, not again as a warning box where the first encode runs
    assert not [w for w in seen if "no CUDA device" in str(w.message)]


def test_setup_names_the_cuda_choice_without_touching_a_gpu(capsys):
    assert setup("cuda") == ("cuda", *device_defaults("cuda"))
    assert capsys.readouterr().out.startswith("DEVICE=cuda  PRESET=lfm2-vl-450m  DTYPE=torch.bfloat16  torch ")


def _fake_gpu(monkeypatch, capability, name="Tesla T4"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (14 * 2**30, 15 * 2**30))


SHOWS = {"launch counts": "any", "the kernel timeline": "gpu", "the H200 sweeps": "recorded"}


def test_environment_check_on_a_cpu_says_what_comes_from_recorded_results(capsys):
    setup("cpu", shows=SHOWS)
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("environment: no CUDA GPU") and f"transformers {transformers.__version__}" in out[1]
    assert out[2] == "  model: tiny in float32; encoder attention (auto): sdpa_blockmask"
    assert out[3] == "  live here: launch counts"
    assert out[4] == f"  from recorded {RECORDED_GPU} results: the kernel timeline (needs a GPU); the H200 sweeps"


@pytest.mark.parametrize(("capability", "dtype", "attention"), [
    ((7, 5), "float16", "sdpa_blockmask"), ((8, 6), "bfloat16", "varlen"), ((9, 0), "bfloat16", "varlen")])
def test_environment_check_on_a_gpu_names_it_and_the_backend_it_got(monkeypatch, capsys, capability, dtype, attention):
    """A T4 (sm75) gets fp16 and the block-mask attention; Ampere and newer get bf16 and varlen."""
    _fake_gpu(monkeypatch, capability)
    assert setup("cuda", shows=SHOWS)[2] == getattr(torch, dtype)
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"environment: Tesla T4 (sm{capability[0]}{capability[1]}), 14.0 of 15.0 GiB free")
    assert out[2] == f"  model: lfm2-vl-450m in {dtype}; encoder attention (auto): {attention}"
    assert out[3] == "  live here: launch counts; the kernel timeline"
    assert out[4] == f"  from recorded {RECORDED_GPU} results: the H200 sweeps"


def test_environment_check_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match=r"kinds must be one of .*'the timeline': 'cuda'"):
        setup("cpu", shows={"the timeline": "cuda"})


def test_setup_defaults_to_the_available_device(capsys):
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert setup()[0] == expected
    assert capsys.readouterr().out.startswith(f"DEVICE={expected}  ")


def test_setup_turns_hub_access_off_unless_the_environment_says_otherwise(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    setup("cpu")
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    setup("cpu")
    assert os.environ["HF_HUB_OFFLINE"] == "0"


# ------------------------------------------------------------------------------------------------
# load_recorded()


def _reference(tmp_path, **roles) -> None:
    """A reference set under ``tmp_path`` whose roles are the given results."""
    folder = tmp_path / RECORDED_GPU
    files = {}
    for role, res in roles.items():
        files[role] = {"file": save_result(res, tmp_path, role).name, "rc": 0}
    (folder / "reference.json").write_text(json.dumps({"gpu": "NVIDIA H200", "code_hash": "sha256:x", "files": files}))


def _result(name: str, date: str, **prov) -> dict:
    return {"name": name, "provenance": {"gpu": "NVIDIA H200", "date": date, "torch": "2.11", "transformers": "5.17",
                                         **prov}, "rows": []}


def test_load_recorded_reads_the_reference_set_not_the_newest_file(tmp_path, capsys):
    _reference(tmp_path, **{"bench-450m": _result("bench", "2026-11-01T10:00:00+00:00", preset="a", dtype="bf16")})
    save_result(_result("bench-450m", "2026-11-05T10:00:00+00:00", preset="b"), tmp_path)  # newer, not in the set
    res = load_recorded("bench-450m", root=tmp_path)
    assert res["provenance"]["preset"] == "a" and res["_role"] == "bench-450m"
    out = capsys.readouterr().out
    assert out.startswith("reference set, bench-450m: recorded on NVIDIA H200 on 2026-11-01")
    assert "(torch 2.11, transformers 5.17, a, bf16; file bench-450m-" in out


def test_load_recorded_leaves_out_what_a_file_lacks(tmp_path, capsys):
    _reference(tmp_path, check=_result("check", "2026-11-01T10:00:00+00:00", dtype="bf16"))  # no one preset
    load_recorded("check", root=tmp_path)
    assert "None" not in capsys.readouterr().out


def test_load_recorded_says_what_is_missing(tmp_path, capsys):
    assert load_recorded("e2e", root=tmp_path) is None
    assert capsys.readouterr().out == (f"Not in the reference set: no 'e2e' in data/results/{RECORDED_GPU}/"
                                       "reference.json (`python -m lfm2vl_lab record` on the H200 records it); "
                                       "the cells that read it skip.\n")


def test_the_recorded_gpu_is_the_one_the_repo_has_results_for():
    assert (ROOT / "data" / "results" / RECORDED_GPU).is_dir()


# ------------------------------------------------------------------------------------------------
# plots: is_default_config

GRAPH_ROW = {"mode": "lab-graph", "workload": "1x512", "budget_set": "auto", "cu_rule": "safe",
             "max_seqlen_mode": "tight", "attention": "varlen", **KERNEL_OPTIONS}


@pytest.mark.parametrize("change,default", [
    ({}, True),
    ({"attention": "auto"}, True),
    ({"attention": None}, True),
    ({"attention": "sdpa_blockmask"}, False),
    ({"fuse_qkv": not KERNEL_OPTIONS["fuse_qkv"]}, False),
    ({"fuse_elementwise": not KERNEL_OPTIONS["fuse_elementwise"]}, False),
    ({"cu_rule": "repeat_last"}, False),
    ({"max_seqlen_mode": "loose"}, False),
    ({"budget_set": "256,1024"}, False),
    ({"dense_graphs": not KERNEL_OPTIONS["dense_graphs"]}, False),
    # a row without an option's key ran before the option existed, with it off
    ({"fuse_elementwise": None} if KERNEL_OPTIONS["fuse_elementwise"] else {"fuse_elementwise": True}, False),
    # rows of eager modes carry no graph settings: they are default unless an option says otherwise
    ({"mode": "hf-eager", "budget_set": None, "cu_rule": None, "max_seqlen_mode": None, "attention": None}, True),
    ({"mode": "lab-eager", "budget_set": None, "dense_graphs": not KERNEL_OPTIONS["dense_graphs"]}, True),
    ({"mode": "hf-eager", "budget_set": None, "fuse_qkv": None, "fuse_elementwise": None}, True),
])
def test_is_default_config(change, default):
    assert is_default_config(dict(GRAPH_ROW, **change)) is default


def test_is_default_config_can_ignore_an_option():
    other = dict(GRAPH_ROW, dense_graphs=not KERNEL_OPTIONS["dense_graphs"])
    assert is_default_config(other, ignore=("dense_graphs",))
    assert not is_default_config(other, ignore=("fuse_qkv",))
    assert not is_default_config(dict(other, fuse_qkv=not KERNEL_OPTIONS["fuse_qkv"]), ignore=("dense_graphs",))


# ------------------------------------------------------------------------------------------------
# Notebooks call the library; they do not re-implement it


def _public_library_names() -> set[str]:
    """Names of the public functions and classes defined in any module of lfm2vl_lab."""
    names = set()
    for info in pkgutil.walk_packages(lfm2vl_lab.__path__, "lfm2vl_lab."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == mod.__name__ \
                    and not name.startswith("_"):
                names.add(name)
    return names


def _code_cells(path: Path):
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            # IPython magics and shell escapes are not Python
            yield i, re.sub(r"^\s*[%!].*$", "", source, flags=re.M)


def _defined_names(source: str) -> set[str]:
    tree = ast.parse(source)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name for node in ast.walk(tree) if isinstance(node, kinds)}


def test_public_library_names_are_found():
    names = _public_library_names()
    assert {"setup", "load_recorded", "tokens_for", "float32_reference", "latency_figure", "is_default_config",
            "measured_capture", "GraphedEncoder"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_cells_define_nothing_the_library_already_has(path):
    """A cheap guard by name: a notebook cell that defines a function or class named like one of
    the library's public ones is most likely a copy of it. Call the library instead."""
    library = _public_library_names()
    clashes = [(i, name) for i, source in _code_cells(path) for name in sorted(_defined_names(source) & library)]
    assert not clashes, f"{path.name}: cells redefine library names (cell index, name): {clashes}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_start_with_setup(path):
    first = next(source for _, source in _code_cells(path))
    assert "DEVICE, PRESET, DTYPE = setup(shows=" in first, "the first cell checks the environment"
    assert "torch.cuda.is_available() else" not in first, "the device choice lives in setup() and device_defaults()"
