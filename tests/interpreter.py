"""Running a Triton kernel on the CPU for the tests: Triton's interpreter reads ``TRITON_INTERPRET=1``
when Triton is imported, so a test module runs its kernel checks as one script in a subprocess that
prints its findings (``RESULT`` and a JSON object), and judges them in the test process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_interpreted(code: str) -> dict:
    """``code`` run by Triton's interpreter in a subprocess (``TRITON_INTERPRET=1`` must be set before
    Triton is imported); what it printed after ``RESULT``."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed: the kernel cannot run, even in its CPU interpreter")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))
