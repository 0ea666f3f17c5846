"""The GPU suite collects on the H200 image, which has torch, transformers, pytest, numpy, PIL,
matplotlib and pandas (with tabulate) but no Jupyter (nbformat, nbclient), no docs or browser stack
and no vLLM. A test module that needs anything else at import time gets it through
``pytest.importorskip`` (or an ``import`` in a ``try`` whose ``except ModuleNotFoundError`` skips), so
there it skips, saying why, instead of failing to collect; so do the scripts a test module loads. The
kit itself imports nothing else at module level (its optional packages are imported where they are
used)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the GPU image has besides the standard library; then the kit and tests/' own modules: helpers, and a
# test module whose helpers another imports (each of them is checked here itself).
# pandas and tabulate: the device tool's list of the H200 image's packages holds both (the report
# layer's DataFrames need them; `record` on the device never imports that layer). triton: the image's CUDA
# torch brings its own (kernels/fused.py's kernels run there); kernels/_gemv_triton.py imports it at module
# level and is itself imported only where Triton is found (kernels/gemv.py).
GPU_IMAGE = {"torch", "transformers", "pytest", "numpy", "PIL", "matplotlib", "pandas", "tabulate", "triton"}
LOCAL = {"lfm2vl_lab", "chromium", "conftest", "interpreter", "nbcheck", "script_loader",
         *(p.stem for p in (ROOT / "tests").glob("test_*.py"))}
NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _top(name: str) -> str:
    return name.split(".")[0]


def _imports(nodes) -> set[str]:
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {_top(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add(_top(node.module))
    return out


def _catches_missing(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError") for t in types)


def _module_level(tree: ast.Module):
    """Every node that runs at import: the module body, not inside functions or classes."""
    todo = [n for n in tree.body if not isinstance(n, NESTED)]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, NESTED))


def unguarded_imports(source: str) -> tuple[set[str], set[str]]:
    """(the top-level packages a module imports when it is imported, less those it only tries to
    import; those: ``pytest.importorskip``, or an import in a ``try`` that catches a missing module)."""
    nodes = list(_module_level(ast.parse(source)))
    guarded, plain = set(), _imports(nodes)
    for node in nodes:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip"
                and node.args and isinstance(node.args[0], ast.Constant)):
            guarded.add(_top(node.args[0].value))
        if isinstance(node, ast.Try) and any(_catches_missing(h) for h in node.handlers):
            guarded |= _imports(node.body)
    return plain - guarded, guarded


def missing_on_gpu_image(path: Path) -> set[str]:
    """What importing ``path`` (and the scripts it loads) needs that the GPU image lacks, unguarded."""
    source = path.read_text(encoding="utf-8")
    needs, guarded = unguarded_imports(source)
    for node in ast.walk(ast.parse(source)):  # scripts/NAME.py loaded with importlib: their imports too
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py")
                and "/" not in node.value and (ROOT / "scripts" / node.value).is_file()):
            needs |= unguarded_imports((ROOT / "scripts" / node.value).read_text(encoding="utf-8"))[0]
    return needs - guarded - GPU_IMAGE - LOCAL - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("*.py")), ids=lambda p: p.name)
def test_test_modules_collect_on_the_gpu_image(path):
    assert not missing_on_gpu_image(path), (
        f"{path.name} imports {sorted(missing_on_gpu_image(path))} at module level, which the GPU image lacks: "
        "use pytest.importorskip so the module skips there")


def test_the_kit_imports_only_what_the_gpu_image_has():
    bad = {p.relative_to(ROOT).as_posix(): sorted(missing_on_gpu_image(p)) for p in (ROOT / "lfm2vl_lab").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_sees_an_unguarded_import(tmp_path):
    bare = tmp_path / "test_bare.py"
    bare.write_text("import json\nimport nbformat\nfrom vllm.config import X\n")
    assert missing_on_gpu_image(bare) == {"nbformat", "vllm"}
    guarded = tmp_path / "test_guarded.py"
    guarded.write_text('import pytest\nnbformat = pytest.importorskip("nbformat")\n'
                       "try:\n    import vllm\nexcept ModuleNotFoundError:\n"
                       "    pytest.skip('no vllm', allow_module_level=True)\n")
    assert missing_on_gpu_image(guarded) == set()
    loader = tmp_path / "test_loader.py"  # loads scripts/handout.py, which imports nbformat
    loader.write_text('from pathlib import Path\nSCRIPT = Path("scripts") / "handout.py"\n')
    assert missing_on_gpu_image(loader) == {"nbformat"}
