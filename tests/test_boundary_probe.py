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


# --- the norm part: an RMSNorm kernel then the GEMV, against the norm inside the GEMV -----------


def test_the_normed_groups_and_their_counts_come_from_the_model():
    """LFM2-350M: operator_norm before q/k/v in 6 attention layers and before in_proj in 10 conv layers,
    ffn_norm before w1/w3 in all 16: 32 norm kernels a decode step."""
    assert bp.norm_groups("lfm2-vl-450m") == {("q/k/v", 1024, (1024, 512, 512)): 6, ("in_proj", 1024, (3072,)): 10,
                                              ("w1/w3", 1024, (4608, 4608)): 16}
    assert bp.norm_eps("lfm2-vl-450m") == 1e-5


NORM_GROUPS = Counter({("q/k/v", 64, (48, 16, 16)): 2, ("in_proj", 64, (96,)): 3})


def _norm_stand_ins(monkeypatch, error=None, fail=None):
    """CPU stand-ins: ``_cold_us`` runs the call once on CPU tensors and answers µs = weight KiB, plus 1
    for each call of the (eager, here) norm; ``_norm_rel_err`` runs gemv_rmsnorm_shared (plain torch on
    the CPU) against the fp32 reference."""
    from lfm2vl_lab.kernels import gemv as G

    calls = []

    def norm(x, nw, eps):
        calls.append(x.shape)
        return G.torch_rmsnorm(x, nw, eps)

    def cold_us(call, shapes, repeats):
        before = len(calls)
        x = torch.randn(1, shapes[0][1]).bfloat16()
        parts = call(x, *[torch.randn(*s).bfloat16() for s in shapes])
        if fail is not None and fail(shapes, len(calls) > before):
            raise RuntimeError("out of resource: registers\nsecond line")
        assert sum(p.shape[-1] for p in parts) == shapes[0][0]
        return sum(n * k * 2 for n, k in shapes) / 1024 + (len(calls) - before), 2

    def rel_err(k, sizes, m, eps):
        if error is not None:
            return error
        x, nw, w = torch.randn(m, k).bfloat16(), torch.ones(k).bfloat16(), torch.randn(sum(sizes), k).bfloat16()
        h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        return bp.rel_error(torch.cat(G.gemv_rmsnorm_shared(x, nw, eps, w, sizes), -1), F.linear(h, w.float()))

    monkeypatch.setattr(bp, "_cold_us", cold_us)
    monkeypatch.setattr(bp, "_norm_rel_err", rel_err)
    monkeypatch.setattr(bp, "_compiled_rmsnorm", lambda: norm)
    monkeypatch.setattr(G, "triton_available", lambda: True)


def test_the_norm_part_times_both_ways_and_sums_the_saving_per_step(monkeypatch):
    _norm_stand_ins(monkeypatch)
    t = bp.norm_section(NORM_GROUPS, 1e-5, repeats=3)
    assert t["available"] and t["rel_ok"] and t["checks"] == 4 and t["not_run"] == 0
    assert [(g["label"], g["count"]) for g in t["groups"]] == [("in_proj", 3), ("q/k/v", 2)]
    for g in t["groups"]:
        assert g["fused_us"] == 64 * sum(g["sizes"]) * 2 / 1024 and g["saving_us"] == 1.0  # the norm's call
    assert t["step"]["saving_ms"] == pytest.approx(5 / 1e3) and t["launches_fewer"] == 5
    assert t["step"]["norm_then_gemv_ms"] - t["step"]["fused_ms"] == pytest.approx(t["step"]["saving_ms"])
    text = "\n".join(bp.norm_lines(t))
    assert "q/k/v 64 x 48+16+16 x2: 11.00 us | 10.00 us, saves 1.00 us per call, 2.0 us per step" in text
    assert "per decode step: 0.061 ms -> 0.056 ms, saves 0.005 ms (5 kernels fewer" in text
    assert "(limit 1e-02): ok;" in text


def test_a_wrong_or_missing_fused_kernel_shows_as_failed(monkeypatch):
    _norm_stand_ins(monkeypatch, error=float("nan"))
    t = bp.norm_section(NORM_GROUPS, 1e-5, repeats=3)
    assert not t["rel_ok"] and "max rel error nan" in "\n".join(bp.norm_lines(t))
    _norm_stand_ins(monkeypatch, error=0.02)
    assert "FAILED" in "\n".join(bp.norm_lines(bp.norm_section(NORM_GROUPS, 1e-5, repeats=3)))
    _norm_stand_ins(monkeypatch, fail=lambda shapes, normed: not normed and shapes == [(80, 64)])
    t = bp.norm_section(NORM_GROUPS, 1e-5, repeats=3)
    row = next(g for g in t["groups"] if g["label"] == "q/k/v")
    assert row["fused_us"]["error"] == "RuntimeError: out of resource: registers" and row["saving_us"] is None
    assert t["step"]["saving_ms"] is None
    assert "failed (RuntimeError: out of resource: registers)" in "\n".join(bp.norm_lines(t))
    assert "per decode step: incomplete" in "\n".join(bp.norm_lines(t))


def test_without_triton_the_norm_part_says_so():
    assert bp.norm_lines({"available": False, "error": "Triton is not importable here"}) == [
        "rmsnorm + GEMV: not run (Triton is not importable here)"]
