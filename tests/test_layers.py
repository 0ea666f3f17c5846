"""The package's shape, checked by reading its source: the seed in ``core/``, packages beside it that
may use it but never the instrument, a generic manager, small modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lfm2vl_lab"
CORE = sorted((PKG / "core").glob("*.py"))
ALL = sorted(PKG.rglob("*.py"))
MAX_MODULE_LINES = 400
# A module is split by meaning, never to stay under a cap: one that holds a single idea may run past
# MAX_MODULE_LINES when it is named here with that idea (a review reads the list; a split only to
# shrink a file, re-exported from the old name, is what this replaces).
ONE_IDEA: dict[str, str] = {  # module path under lfm2vl_lab/ -> its one idea, in a few words
    "serving/engine.py": "the text model on static buffers, and the graphs that replay it",
}
MAX_FUNCTION_LINES = 60
# What the technique may use besides the standard library: torch, transformers, the two packages
# transformers' image processor itself needs, tokenizers (what transformers' fast tokenizers are
# made of; model/toy_processor.py builds one), safetensors (transformers' own weight format and
# dependency; model/folder.py writes a checkpoint's weights with it), and Triton, torch's own kernel
# language (installed with CUDA torch; kernels/fused.py imports it lazily and runs plain torch without it).
THIRD_PARTY = {"torch", "transformers", "numpy", "PIL", "tokenizers", "safetensors", "triton"}
# Which of the package's own packages each may import (besides itself). None of the four imports the
# instrument (INSTRUMENT below).
MAY_IMPORT = {
    "kernels": set(),                      # leaf: torch and Triton
    "core": {"kernels"},                   # the seed: its encoder calls the kernels
    "model": {"core", "kernels"},          # presets, inputs, the transformers reference path
    "serving": {"core", "kernels", "model"},  # text engine, pipeline, chat
}


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in a file; level > 0 for relative imports."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def package_imports(path: Path) -> set[str]:
    """The lfm2vl_lab packages a module imports (relative imports resolved; absolute ones refused)."""
    here = path.relative_to(PKG).parts[:-1]
    out = set()
    for level, mod in imports(path):
        if level == 0:
            assert mod.split(".")[0] != "lfm2vl_lab", f"{path.name} imports {mod}: use relative imports in the package"
            continue
        target = [*here[: len(here) - (level - 1)], *(mod.split(".") if mod else [])]
        assert target, f"{path.name}: 'from {'.' * level}{mod} import' reaches the package root"
        out.add(target[0])
    return out


# The instrument, in three layers above the technique: what each may import of the package. Nothing
# below the command line imports argparse (the measurements and the pages take plain values).
INSTRUMENT = {
    "measure": {"kernels", "core", "model", "serving"},
    "report": {"kernels", "core", "model", "serving", "measure"},
    "cli": {"kernels", "core", "model", "serving", "measure", "report"},
}


def test_the_packages_exist():
    for name in (*MAY_IMPORT, *INSTRUMENT):
        assert (PKG / name / "__init__.py").exists(), f"lfm2vl_lab/{name}/ must exist"


@pytest.mark.parametrize("path", [p for p in ALL if p.parent.name in MAY_IMPORT], ids=lambda p: str(p.relative_to(PKG)))
def test_each_package_imports_only_what_it_may(path):
    pkg = path.parent.name
    for level, mod in imports(path):
        top = mod.split(".")[0]
        if level == 0:
            allowed = top in sys.stdlib_module_names or top in THIRD_PARTY
            assert allowed, f"{path.name} imports {mod}: {pkg}/ may use torch, transformers (numpy, PIL) and the stdlib"
    reached = package_imports(path) - {pkg}
    assert reached <= MAY_IMPORT[pkg], f"{pkg}/{path.name} imports {sorted(reached - MAY_IMPORT[pkg])}: " \
        f"{pkg}/ may import only {sorted(MAY_IMPORT[pkg]) or 'nothing else of the package'}"


@pytest.mark.parametrize("path", [p for p in ALL if p.parent.name in INSTRUMENT], ids=lambda p: str(p.relative_to(PKG)))
def test_the_instrument_is_layered(path):
    pkg = path.parent.name
    reached = package_imports(path) - {pkg}
    assert reached <= INSTRUMENT[pkg], f"{pkg}/{path.name} imports {sorted(reached - INSTRUMENT[pkg])}: " \
        f"{pkg}/ may import only {sorted(INSTRUMENT[pkg])}"
    if pkg != "cli":
        assert "argparse" not in {mod.split(".")[0] for _, mod in imports(path)}, \
            f"{pkg}/{path.name} imports argparse: only the command line (cli/) parses arguments"


def test_import_lfm2vl_lab_loads_no_instrument():
    """The public API is the technique and its neighbours; the instrument loads on first use."""
    code = ("import sys, lfm2vl_lab; print(sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['lfm2vl_lab', 'measure'], ['lfm2vl_lab', 'report'], ['lfm2vl_lab', 'cli'])))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"import lfm2vl_lab loaded {out}"


# The generic half of the graph path (vLLM's manager and interface): what each may import of core/,
# and of the rest besides torch.
GENERIC = {
    "manager": {"capture", "lifecycle", "plan", "protocol", "serial"},
    "protocol": {"plan"},  # the contract: the config's planner
    "lifecycle": {"capture", "guard"},  # the graphs' life, shared with the text engine
}
GENERIC_STDLIB = {"__future__", "collections", "contextlib", "dataclasses", "typing", "warnings"}


@pytest.mark.parametrize("name", sorted(GENERIC))
def test_the_generic_half_knows_nothing_of_lfm2vl(name):
    found = imports(PKG / "core" / f"{name}.py")
    relative = {mod for level, mod in found if level}
    assert relative <= GENERIC[name], f"core/{name}.py imports {relative}: only .{', .'.join(sorted(GENERIC[name]))}"
    absolute = {mod.split(".")[0] for level, mod in found if not level}
    assert absolute <= GENERIC_STDLIB | {"torch"}, absolute
    text = (PKG / "core" / f"{name}.py").read_text(encoding="utf-8")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    tree = ast.parse(code)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not {n for n in names if "lfm2" in n.lower() or n in ("pixel_values", "cu_seqlens", "gather_idx")}


def test_the_generic_helpers_are_as_generic_as_the_manager():
    guard = imports(PKG / "core" / "guard.py")  # the weight stamp is as generic as the manager
    assert {mod.split(".")[0] for level, mod in guard} <= {"__future__", "types", "weakref", "torch", "ptrcheck"}, guard
    for helper, allowed in (("plan", {"__future__"}), ("serial", {"__future__", "contextlib", "functools",
                                                                  "threading", "torch"}),
                            ("ptrcheck", {"__future__", "functools", "hashlib", "importlib", "os", "pathlib", "shutil",
                                          "sys", "sysconfig", "warnings", "torch"})):
        mods = imports(PKG / "core" / f"{helper}.py")  # as generic as the manager that calls them
        assert not any(level for level, _ in mods) and {m.split(".")[0] for _, m in mods} <= allowed, (helper, mods)


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(PKG)))
def test_module_and_function_sizes(path):
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    name = path.relative_to(PKG).as_posix()
    assert lines <= MAX_MODULE_LINES or name in ONE_IDEA, (
        f"{name} has {lines} lines (over {MAX_MODULE_LINES}): split it by meaning, or name its one idea in ONE_IDEA")
    functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in functions
            if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(PKG)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
