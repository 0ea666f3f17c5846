"""The package's shape, checked by reading its source: two layers, a generic manager, small modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lfm2vl_lab"
CORE = sorted((PKG / "core").glob("*.py"))
ALL = sorted(PKG.rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# What the technique may use besides the standard library: torch, transformers, the two packages
# transformers' image processor itself needs, tokenizers (what transformers' fast tokenizers are
# made of; core/toy_processor.py builds one), and Triton, torch's own kernel language (installed with
# CUDA torch; core/fused.py imports it lazily and runs plain torch without it).
CORE_THIRD_PARTY = {"torch", "transformers", "numpy", "PIL", "tokenizers", "triton"}


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in a file; level > 0 for relative imports."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def test_the_layers_exist():
    assert CORE and sorted((PKG / "tools").glob("*.py")), "lfm2vl_lab/core and lfm2vl_lab/tools must both exist"


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_never_imports_tools(path):
    for level, mod in imports(path):
        top = mod.split(".")[0]
        if level == 0:
            assert top != "lfm2vl_lab", f"{path.name}: core imports {mod}; use relative imports within core"
            allowed = top in sys.stdlib_module_names or top in CORE_THIRD_PARTY
            assert allowed, f"{path.name} imports {mod}: core may use torch, transformers (numpy, PIL) and the stdlib"
        else:
            assert level == 1, f"{path.name}: 'from {'.' * level}{mod} import ...' leaves core"


def test_manager_knows_nothing_of_lfm2vl():
    found = imports(PKG / "core" / "manager.py")
    relative = {mod for level, mod in found if level}
    assert relative <= {"capture", "guard"}, f"the generic manager imports {relative}: only .capture and .guard"
    absolute = {mod.split(".")[0] for level, mod in found if not level}
    assert absolute <= {"__future__", "collections", "dataclasses", "typing", "torch", "warnings"}, absolute
    guard = imports(PKG / "core" / "guard.py")  # the weight stamp is as generic as the manager
    assert {mod.split(".")[0] for level, mod in guard} <= {"__future__", "types", "weakref", "torch"}, guard
    text = (PKG / "core" / "manager.py").read_text(encoding="utf-8")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    tree = ast.parse(code)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not {n for n in names if "lfm2" in n.lower() or n in ("pixel_values", "cu_seqlens", "gather_idx")}


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(PKG)))
def test_module_and_function_sizes(path):
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PKG)} has {lines} lines (limit {MAX_MODULE_LINES})"
    functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in functions
            if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(PKG)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
