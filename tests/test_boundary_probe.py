"""scripts/boundary_probe.py: what is left once launches are graphed (a kernel boundary inside a graph,
the copy bandwidth, the decode GEMVs). The probe runs on the H200; here its host side."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
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


# --- the triton part: its host side, with stand-ins for the GPU timing and check ---------------


def test_the_linears_that_share_an_input_are_found_by_name():
    """LFM2-350M: q/k/v in each of its 6 attention layers, w1/w3 (gate/up) in each of its 16 MLPs."""
    assert bp.shared_groups("lfm2-vl-450m") == {("q/k/v", 1024, (1024, 512, 512)): 6,
                                                ("gate/up", 1024, (4608, 4608)): 16}


@pytest.mark.parametrize("k,n", [(1024, 512), (1024, 1024), (4608, 1024), (1024, 65536)])
def test_the_candidates_start_with_the_tables_pick_and_launch_differently(k, n):
    from lfm2vl_lab.kernels.gemv import pick_config, resolve

    cands = bp.candidates(k, n)
    assert cands[0] == resolve(pick_config(1, n, k), k)[0]
    assert len(cands) == len(set(cands)) >= 4
    assert all(resolve(c, k)[0] == c for c in cands)


def test_a_nan_never_passes_the_error_limit():
    ref = torch.ones(4)
    assert bp.rel_error(torch.tensor([1.0, 1.0, 1.0, 1.005]), ref) == pytest.approx(0.005)
    err = bp.rel_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref)
    assert err != err and not err <= bp.REL_LIMIT


SHAPES = Counter({(64, 48): 2, (64, 16): 4, (96, 32): 1})
GROUPS = Counter({("q/k/v", 64, (48, 16, 16)): 2})


def _stand_ins(monkeypatch, fail=None, error=None):
    """CPU stand-ins: ``_cold_us`` runs the call once on CPU tensors (kernels/gemv.py falls back to
    torch there) and answers µs = weight KiB; ``_rel_err`` compares gemv with fp32 F.linear on CPU."""
    from lfm2vl_lab.kernels import gemv as G

    def cold_us(call, shapes, repeats):
        if fail is not None and fail(shapes):
            raise RuntimeError("out of resource: shared memory\nsecond line")
        x = torch.randn(1, shapes[0][1]).bfloat16()
        call(x, *[torch.randn(*s).bfloat16() for s in shapes])
        return sum(n * k * 2 for n, k in shapes) / 1024, 2

    def rel_err(k, n, m, cfg):
        x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
        return error if error is not None else bp.rel_error(G.gemv(x, w, None, cfg), F.linear(x.float(), w.float()))

    monkeypatch.setattr(bp, "_cold_us", cold_us)
    monkeypatch.setattr(bp, "_rel_err", rel_err)
    monkeypatch.setattr(G, "triton_available", lambda: True)
    return [{"in": k, "out": n, "count": c, "weight_bytes": k * n * 2, "us": 2.0 * k * n * 2 / 1024,
             "gbs": 1024 / 2 / 1e3, "of_copy": 1024 / 2 / 1e3 / 1000.0} for (k, n), c in sorted(SHAPES.items())]


def test_the_triton_part_times_each_shape_and_group_and_sums_a_step(monkeypatch):
    flinear = _stand_ins(monkeypatch)
    t = bp.triton_section(SHAPES, GROUPS, flinear, repeats=3, copy_gbs=1000.0)
    assert t["available"] and t["rel_ok"] and t["not_run"] == 0 and t["max_rel_err"] <= bp.REL_LIMIT
    assert [(r["in"], r["out"], r["count"]) for r in t["shapes"]] == [(64, 16, 4), (64, 48, 2), (96, 32, 1)]
    for r in t["shapes"]:
        assert r["table"]["us"] == r["in"] * r["out"] * 2 / 1024 and r["best"]["us"] <= r["table"]["us"]
        assert r["table"]["config"] == list(bp.candidates(r["in"], r["out"])[0])
    g = t["groups"][0]
    assert g["one_triton_us"] == g["one_flinear_us"] == 64 * 80 * 2 / 1024 == g["separate_triton_us"]
    d = t["decode"]
    weight = sum(k * n * 2 * c for (k, n), c in SHAPES.items())
    assert d["weight_bytes"] == weight
    assert d["flinear"]["ms"] == pytest.approx(2 * weight / 1024 / 1e3)  # the stand-in F.linear: twice as slow
    assert d["triton_table"]["ms"] == pytest.approx(weight / 1024 / 1e3)
    assert d["triton_table"]["gbs"] == pytest.approx(weight / d["triton_table"]["ms"] / 1e6)
    # the group's one launch replaces its members' (here as long, since the stand-in's time is the bytes)
    assert d["triton_table_shared"]["ms"] == pytest.approx(d["triton_table"]["ms"])
    text = "\n".join(bp.triton_lines(t, flinear))
    assert "q/k/v 64 x 48+16+16 x2: separate_flinear" in text and ": ok;" in text
    assert "decode GEMVs (triton, table): 0.0" in text


def test_a_candidate_that_does_not_compile_is_reported_and_a_wrong_kernel_fails(monkeypatch):
    flinear = _stand_ins(monkeypatch, fail=lambda shapes: shapes == [(48, 64)])
    t = bp.triton_section(SHAPES, GROUPS, flinear, repeats=3, copy_gbs=1000.0)
    row = next(r for r in t["shapes"] if r["out"] == 48)
    assert row["table"]["error"] == "RuntimeError: out of resource: shared memory" and row["best"] is None
    assert t["decode"]["triton_table"] is None and not t["rel_ok"]  # the table's pick must run
    assert "failed (RuntimeError: out of resource" in "\n".join(bp.triton_lines(t, flinear))
    flinear = _stand_ins(monkeypatch, error=float("nan"))
    t = bp.triton_section(SHAPES, GROUPS, flinear, repeats=3, copy_gbs=1000.0)
    assert not t["rel_ok"] and t["max_rel_err"] != t["max_rel_err"]
    assert "max rel error nan" in "\n".join(bp.triton_lines(t, flinear)) and "FAILED" in "\n".join(
        bp.triton_lines(t, flinear))


def test_without_triton_the_part_says_so():
    lines = bp.triton_lines({"available": False, "error": "Triton is not importable here"}, [])
    assert lines == ["triton: not run (Triton is not importable here)"]
