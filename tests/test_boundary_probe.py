"""scripts/boundary_probe.py: what is left once launches are graphed (a kernel boundary inside a graph,
the copy bandwidth, the decode GEMVs). The probe runs on the H200; here its host side."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
bp = load_script("boundary_probe.py")


def test_the_450m_decode_step_reads_the_weights_the_floor_counts():
    """Every linear layer of LFM2-350M (16 layers: 10 conv, 6 attention) and its LM head: 0.709 GB of
    bf16 weights, the bandwidth floor's numerator for one decode token."""
    shapes = bp.linear_shapes("lfm2-vl-450m")
    assert shapes[(1024, 65536)] == 1  # the LM head
    assert shapes[(1024, 3072)] == 10  # one conv in_proj per conv layer
    assert sum(k * n * 2 * c for (k, n), c in shapes.items()) == 708_837_376


def test_the_boundary_cost_is_the_slope_of_time_against_kernels():
    assert bp.slope(bp.NS, [5.0 + 2.5 * n for n in bp.NS]) == pytest.approx(2.5)


def test_the_lines_name_each_number_with_its_unit():
    res = {"preset": "lfm2-vl-450m",
           "boundary": {"ns": list(bp.NS), "per_kernel_graph_us": 1.31, "per_kernel_eager_us": 4.2},
           "bandwidth": {"bytes": bp.BANDWIDTH_BYTES, "copy_gbs": 4012.0, "sum_gbs": 4150.0},
           "gemv": [{"in": 1024, "out": 4608, "count": 32, "us": 4.0, "gbs": 2359.3, "of_copy": 0.588}],
           "decode_floor": {"weight_bytes": 708_837_376, "ms_at_copy": 0.177, "ms_measured": 0.31}}
    text = "\n".join(bp.lines(res))
    assert "1.31 us per kernel (eager launches: 4.20 us)" in text
    assert "copy 4012 GB/s" in text and "58.8% of copy" in text
    assert "0.709 GB of weights per token, 0.177 ms at the copy bandwidth, 0.310 ms as the GEMVs ran" in text


def test_without_a_gpu_it_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bp.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs a CUDA GPU" in err


def test_the_device_script_has_a_part_for_it():
    script = (ROOT / "scripts" / "h200_run.sh").read_text()
    assert "boundary)" in script and "python3 scripts/boundary_probe.py --out" in script
