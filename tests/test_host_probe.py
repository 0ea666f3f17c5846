"""scripts/host_probe.py: the host-speed line every device call prints first (scripts/h200_run.sh)."""

from __future__ import annotations

import re
from pathlib import Path

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
hp = load_script("host_probe.py")


def test_the_probe_times_the_interpreter_and_the_dispatcher_and_says_when_it_has_no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = hp.probe()
    assert p["python_ms"] > 0 and p["torch_op_us"] > 0
    assert p["cuda_launch_us"] is None and p["device"] == "cpu"
    text = hp.line(p)
    pattern = r"host: python loop [\d.]+ ms, [\d.]+ us per torch CPU op, no CUDA GPU \(medians of 5; cpu\)"
    assert re.fullmatch(pattern, text), text


def test_the_line_gives_the_launch_rate_where_there_is_a_gpu():
    text = hp.line({"python_ms": 50.0, "torch_op_us": 1.5, "cuda_launch_us": 4.25, "device": "NVIDIA H200"})
    assert "4.25 us per CUDA launch" in text and text.endswith("NVIDIA H200)")


def test_every_device_call_prints_the_host_line_first():
    script = (ROOT / "scripts" / "h200_run.sh").read_text()
    probe_at, case_at = script.index("python3 scripts/host_probe.py"), script.index('case "$PART" in')
    assert probe_at < case_at, "the probe runs before any part, so every call's log names its host"
