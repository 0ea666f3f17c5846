"""Load one of the repo's scripts (scripts/ is no package) as a module, for its tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(filename: str):
    """``scripts/<filename>`` as a module. Callers pass the file name with its ``.py`` as a literal:
    tests/test_gpu_image_imports.py finds the scripts a test loads by those literals, and checks their
    imports too."""
    spec = importlib.util.spec_from_file_location(filename.removesuffix(".py"), SCRIPTS / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
