"""The notebooks and the README import from the public surface only: ``lfm2vl_lab`` (the technique),
``lfm2vl_lab.measure`` (the measuring helpers) and ``lfm2vl_lab.report`` (what reads the recorded set).
A deeper path (``lfm2vl_lab.core.packing``, ``lfm2vl_lab.report.plots``) is the package's inside, free
to move; a name a learner needs is added to one of the three lazy tables instead. Each of the three
packages stays cheap to import: its names load on first use."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
README = ROOT / "README.md"
PUBLIC = ("lfm2vl_lab", "lfm2vl_lab.measure", "lfm2vl_lab.report")
SUBPACKAGES = ("lfm2vl_lab.measure", "lfm2vl_lab.report")


def notebook_sources(path: Path) -> list[tuple[str, str]]:
    """(where, source) of each code cell, IPython magics and shell escapes blanked (they are not Python)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(f"{path.name} cell {i}", re.sub(r"^\s*[%!].*$", "", "".join(c["source"]), flags=re.M))
            for i, c in enumerate(cells) if c["cell_type"] == "code"]


def readme_sources() -> list[tuple[str, str]]:
    """(where, source) of each ```python block of the README."""
    text = README.read_text(encoding="utf-8")
    return [(f"README.md block {i}", m.group(1)) for i, m in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S))]


SOURCES = [s for p in NOTEBOOKS for s in notebook_sources(p)] + readme_sources()


def kit_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) of each import of the kit in ``source``: name None for ``import module``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "lfm2vl_lab"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "lfm2vl_lab":
            out += [(node.module, a.name) for a in node.names]
    return out


def deep_imports(source: str) -> list[str]:
    """The imports in ``source`` that reach past the public surface, as written."""
    return [f"from {m} import {n}" if n else f"import {m}" for m, n in kit_imports(source) if m not in PUBLIC]


def test_the_sources_are_found():
    assert len(NOTEBOOKS) >= 8 and len(readme_sources()) >= 3
    assert sum(len(kit_imports(src)) for _, src in SOURCES) > 20, "the notebooks import the kit"


def test_deep_imports_are_caught():
    """The check below is not blind: each of these reaches past the public surface."""
    code = ("from lfm2vl_lab.core.packing import tokens_for\nimport lfm2vl_lab.measure.profiling\n"
            "from lfm2vl_lab.report.plots import timeline_figure\nimport lfm2vl_lab.core as c\n")
    assert len(deep_imports(code)) == 4
    fine = ("import lfm2vl_lab as lab\nfrom lfm2vl_lab import tokens_for, e2e\n"
            "from lfm2vl_lab.measure import idle_gaps, workloads\nfrom lfm2vl_lab.report import setup, ttft_summary\n")
    assert deep_imports(fine) == []


@pytest.mark.parametrize("path", [*NOTEBOOKS, README], ids=lambda p: p.name)
def test_notebooks_and_readme_import_only_the_public_surface(path):
    sources = readme_sources() if path == README else notebook_sources(path)
    deep = [(where, line) for where, src in sources for line in deep_imports(src)]
    assert not deep, f"import from {', '.join(PUBLIC)} (add a name to its lazy table), not: {deep}"


def test_every_name_imported_from_the_public_surface_resolves():
    used = {(m, n) for _, src in SOURCES for m, n in kit_imports(src) if m in PUBLIC and n}
    assert used, "the notebooks import names from the public packages"
    for module, name in sorted(used):
        assert getattr(importlib.import_module(module), name, None) is not None, f"{module} has no {name!r}"


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_public_name_loads_from_its_module_and_is_listed(package):
    pkg = importlib.import_module(package)
    assert sorted(pkg.__all__) == sorted(pkg.API_NAMES), f"{package}: __all__ and API name the same things"
    assert not set(pkg.API_NAMES) & pkg.MODULES, f"{package}: a name must not shadow a submodule"
    for name, module in pkg.API_NAMES.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(f"{package}.{module}"), name), name
    assert set(pkg.API_NAMES) | pkg.MODULES <= set(dir(pkg))
    for module in pkg.MODULES:  # a submodule by attribute, as `from lfm2vl_lab.measure import bench` gets it
        assert getattr(pkg, module) is importlib.import_module(f"{package}.{module}")
    with pytest.raises(AttributeError, match="no_such_name"):
        pkg.no_such_name  # noqa: B018


@pytest.mark.parametrize("package", ["lfm2vl_lab.measure"])  # report lists its names once, in its table
def test_the_lazy_tables_match_the_type_checking_imports(package):
    """Where a package also imports its names under TYPE_CHECKING (what type checkers and editors read),
    they are the same names from the same modules as the table that loads at runtime."""
    pkg = importlib.import_module(package)
    tree = ast.parse(Path(pkg.__file__).read_text(encoding="utf-8"))
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in guarded.body for alias in node.names}
    assert imported == pkg.API_NAMES


def test_importing_the_public_packages_is_cheap():
    """`import lfm2vl_lab.measure, lfm2vl_lab.report` loads no torch, numpy, pandas or matplotlib and
    none of their modules; the first use of a name loads its module (and torch with it)."""
    code = ("import sys, lfm2vl_lab, lfm2vl_lab.measure, lfm2vl_lab.report\n"
            "heavy = ('torch', 'numpy', 'pandas', 'matplotlib', 'transformers', 'PIL')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.count('.') > 1 and "
            "m.startswith(('lfm2vl_lab.measure.', 'lfm2vl_lab.report.'))))\n"
            "lfm2vl_lab.measure.time_calls\n"
            "print('lfm2vl_lab.measure.timing' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "True"], out
