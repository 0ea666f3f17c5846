"""``python -m lfm2vl_lab --help`` answers at once: neither the command's help nor a subcommand's
imports torch (or transformers, or matplotlib), ``import lfm2vl_lab`` does not either, and the
copies that make that possible (the options' choices in cli/cli_options.py, the public names in
lfm2vl_lab/__init__.py, the subcommands' help lines) stay equal to what they copy."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lfm2vl_lab
from lfm2vl_lab.cli import cli_options
from lfm2vl_lab.cli.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "matplotlib", "numpy", "PIL")

# Runs `python -m lfm2vl_lab <argv>` for each argv in turn, in this one process, and prints which of
# the heavy modules were loaded after each (json: [[argv, exit status, [modules]], ...]).
HELP_SCRIPT = """
import json, runpy, sys
heavy, out = {heavy!r}, []
for argv in {argvs!r}:
    sys.argv = ["lfm2vl_lab", *argv]
    try:
        runpy.run_module("lfm2vl_lab", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out.append([argv, code, sorted(m for m in heavy if m in sys.modules)])
print(json.dumps(out))
"""


def test_help_of_the_command_and_of_every_subcommand_imports_no_torch():
    argvs = [["--help"]] + [[name, "--help"] for name in SUBCOMMANDS]
    code = HELP_SCRIPT.format(heavy=HEAVY, argvs=argvs)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [argv for argv, _, _ in runs] == argvs
    for argv, status, loaded in runs:
        assert status == 0, f"{argv}: exit status {status}"
        assert loaded == [], f"python -m lfm2vl_lab {' '.join(argv)} imported {loaded}"


def test_the_check_can_fail_a_run_does_import_torch():
    """The same script sees torch once a command runs (bench with a bad value needs no model, but
    its parsing of --device imports torch): the help test above is not blind."""
    code = HELP_SCRIPT.format(heavy=HEAVY, argvs=[["bench", "--device", "tpu"]])
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    (run,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run[1] == 2 and "torch" in run[2], run


def test_import_lfm2vl_lab_imports_no_torch_and_every_public_name_loads():
    code = "import sys, lfm2vl_lab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    # the two public packages of the instrument are as lazy (tests/test_public_api.py checks their names)
    code = f"import sys, lfm2vl_lab.measure, lfm2vl_lab.report; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    for name in lfm2vl_lab.__all__:
        assert getattr(lfm2vl_lab, name) is not None, name
    for name, module in lfm2vl_lab.API_NAMES.items():
        assert getattr(lfm2vl_lab, name) is getattr(importlib.import_module(f"lfm2vl_lab.{module}"), name)


def test_the_public_names_are_the_ones_type_checkers_and_the_api_reference_read():
    """lfm2vl_lab.API (what loads at runtime) and the imports under TYPE_CHECKING (what griffe, which
    builds the API reference, and type checkers read) name the same things from the same modules."""
    tree = ast.parse(Path(lfm2vl_lab.__file__).read_text(encoding="utf-8"))
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in guarded.body for alias in node.names}
    assert imported == lfm2vl_lab.API_NAMES
    assert set(lfm2vl_lab.API_NAMES) <= set(lfm2vl_lab.__all__)


def test_the_options_copies_equal_what_they_copy():
    from lfm2vl_lab.cli import cli_vllm
    from lfm2vl_lab.core import config
    from lfm2vl_lab.kernels import attention
    from lfm2vl_lab.measure import check, e2e, engine_peers, modes, request, ttft, vllm_ab, workloads

    defaults = config.GraphOptions()
    copies = {
        "MODES": modes.MODES, "DEFAULT_MODES": modes.DEFAULT_MODES, "COMPILE_MODES": modes.COMPILE_MODES,
        "DEFAULT_WORKLOADS": workloads.DEFAULT_WORKLOADS, "CU_SEQLENS_RULES": config.CU_SEQLENS_RULES,
        "MAX_SEQLEN_MODES": config.MAX_SEQLEN_MODES, "GRAPH_CONFIGS": tuple(config.GRAPH_CONFIGS),
        "ATTENTION_BACKENDS": attention.ATTENTION_BACKENDS, "CHECK_PRESETS": check.PRESETS,
        "E2E_IMAGES": tuple(e2e.IMAGES), "DECODE_TOKENS": ttft.DECODE_TOKENS,
        "THROUGHPUT_BATCH": request.THROUGHPUT_BATCH, "ENGINE_MODES": engine_peers.MODES,
        "VLLM_PRESETS": vllm_ab.PRESETS, "VLLM_NAME": cli_vllm.NAME,
        "GRAPH_DEFAULTS": {k: getattr(defaults, k) for k in cli_options.GRAPH_DEFAULTS},
    }
    for name, source in copies.items():
        assert getattr(cli_options, name) == source, f"cli/cli_options.py {name} differs from its source"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommands_help_line_is_its_runs_docstring(name):
    run = SUBCOMMANDS[name][1]
    module, function = getattr(run, "target", (None, None))
    real = getattr(importlib.import_module(f"lfm2vl_lab.{module}"), function) if module else run
    assert inspect.getdoc(real).splitlines()[0] == run.__doc__.strip().splitlines()[0]
