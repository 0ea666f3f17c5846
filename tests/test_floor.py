"""measure/floor: the kernel classes of a profiled call and the encoder's targets, judged on rows
shaped like the bench's and on the reference set's 450M bench."""

import pytest

from lfm2vl_lab.measure.floor import (
    BUSY_OVER_WALL_REASON,
    TARGETS,
    busy_over_wall,
    busy_over_wall_note,
    idle_breakdown,
    judge_targets,
    kernel_breakdown,
    kernel_class,
)
from lfm2vl_lab.report import reference


@pytest.mark.parametrize("name,cls", [
    ("nvjet_sm90_tst_96x64_64x10_1x2_h_bz_bias_TNN", "GEMM"),
    ("gemv_kernel", "GEMV"),  # the kit's Triton GEMV; inductor's kernels that read its output are not it
    ("triton_per_fused__to_copy_add_gemv_mean_mul_pow_rsqrt_2", "other"),
    ("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_gelubias_TNT", "GEMM"),  # GELU in the epilogue
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "attention"),
    ("add_ln", "add+LayerNorm (Triton)"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16>", "LayerNorm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "GELU"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>", "residual add"),
    ("Memset (Device)", "memset"),
    ("Memcpy DtoD (Device -> Device)", "copies"),
    ("something new", "other"),
])
def test_kernel_class(name, cls):
    assert kernel_class(name) == cls


def test_kernel_breakdown_sums_one_call():
    row = {"mode": "lab-graph", "workload": "1x512",
           "timeline": {"gpu": [[0, 5.0, "nvjet_a"], [6, 2.0, "add_ln"], [9, 3.0, "nvjet_b"], [13, 1.0, "Memset"]]}}
    assert kernel_breakdown(row) == {"GEMM": {"count": 2, "us": 8.0}, "add+LayerNorm (Triton)": {"count": 1, "us": 2.0},
                                     "memset": {"count": 1, "us": 1.0}}
    with pytest.raises(ValueError, match="--profile"):
        kernel_breakdown({"mode": "hf-eager", "workload": "1x512"})


def _rows(lab_ms, compile_ms=2.0, busy=0.7):
    rows = []
    for w in ("1x512", "1x256", "2x512", "4x512", "8x512", "16x512", "tiled", "stream"):
        rows.append({"mode": "lab-graph", "workload": w, "median_ms": lab_ms, "p99_ms": lab_ms, "gpu_busy_ms": busy,
                     "capture_s": 1.0, "graph_total_mb": 500.0})
        rows.append({"mode": "compile", "workload": w, "median_ms": compile_ms, "p99_ms": 10.0})
        rows.append({"mode": "hf-eager", "workload": w, "median_ms": 4.0, "gpu_busy_ms": 0.9})
    return rows


def test_targets_met_and_missed_are_both_reported():
    met = {t["target"]: t for t in judge_targets(_rows(0.5, busy=0.48))}
    assert met["450M 1x512 median ms"]["ok"] and met["1x512 speedup over compile"]["value"] == pytest.approx(4.0)
    assert met["fastest mode at 8x512"]["ok"] and met["GPU-busy <= transformers' at 4x512"]["ok"]
    missed = {t["target"]: t for t in judge_targets(_rows(1.2, compile_ms=1.0))}
    assert not missed["450M 1x512 median ms"]["ok"] and not missed["fastest mode at 1x512"]["ok"]
    assert not missed["1x512 wall / GPU-busy"]["ok"]  # 1.2 / 0.7 > 1.10


def test_targets_of_the_reference_run():
    """The reference set's 450M bench gives every target a measured value."""
    res = reference.load("bench-450m")
    assert res["provenance"]["preset"] == "lfm2-vl-450m"  # the targets are the 450M preset's
    judged = judge_targets(res["rows"])
    latency = [t for t in judged if t["target"].startswith("450M") and "median" in t["target"]]
    assert len(latency) == len(TARGETS["latency"])
    missing = [t["target"] for t in judged if not isinstance(t["value"], (int, float, bool))]
    assert not missing, f"targets without a measured value: {missing}"


def _profiled(gpu, median_ms, **kw):
    return {"mode": "lab-graph", "workload": "1x512", "median_ms": median_ms, "timeline": {"gpu": gpu}, **kw}


def test_idle_breakdown_splits_the_time_beyond_the_kernels():
    # gemm [0, 10], memset [10, 11] (idle time, as in gpu_busy_ms), FA2 [13, 20], gemm [20.5, 30]
    fa2 = "void pytorch_flash::flash_fwd_kernel"
    row = _profiled([[0, 10.0, "nvjet_a"], [10, 1.0, "Memset (Device)"], [13, 7.0, fa2], [20.5, 9.5, "nvjet_b"]],
                    median_ms=0.040)
    b = idle_breakdown(row)
    assert (b["span_us"], b["busy_us"], b["n_gaps"]) == (30.0, 26.5, 2)
    assert b["gaps_us"] == pytest.approx(3.5) and b["busy_us"] + b["gaps_us"] == b["span_us"]
    assert (b["n_before"], b["before_us"], b["other_median_us"]) == (1, 3.0, 0.5)  # the gap before the attention
    assert b["outside_us"] == pytest.approx(10.0)  # 40 µs median, 30 µs of kernels' span
    assert idle_breakdown(row, before="GEMM")["before_us"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"lab-graph/1x512 .*--profile"):
        idle_breakdown(_profiled([], 0.04))


def test_idle_breakdown_of_the_reference_replay():
    """One graphed 1x512 call of the reference set: its kernels' span is its GPU-busy time plus the
    gaps, one gap before each of the 12 layers' attention kernels, and the replay's median is longer
    than that span (the host side around it)."""
    rows = reference.load("bench-450m")["rows"]
    row = next(r for r in rows if (r["mode"], r["workload"]) == ("lab-graph", "1x512"))
    b = idle_breakdown(row)
    assert b["busy_us"] == pytest.approx(1000 * row["gpu_busy_ms"], rel=0.01)
    assert b["n_before"] == 12 and b["before_us"] > b["other_median_us"] * 12
    assert 0 < b["outside_us"] < b["span_us"]


def test_busy_over_wall_lists_the_rows_a_share_cannot_describe():
    rows = [{"mode": "a", "median_ms": 1.0, "gpu_busy_ms": 1.2}, {"mode": "b", "median_ms": 1.0, "gpu_busy_ms": 0.8},
            {"mode": "c", "median_ms": 1.0, "gpu_busy_ms": None}, {"mode": "d", "median_ms": None, "gpu_busy_ms": 1.0}]
    assert [r["mode"] for r in busy_over_wall(rows)] == ["a"]
    assert "profiled call" in BUSY_OVER_WALL_REASON


def test_busy_over_wall_note_names_the_rows_and_the_reason():
    rows = [{"mode": "lab-graph", "workload": "1x512", "median_ms": 1.0, "gpu_busy_ms": 1.25, "fuse_qkv": False},
            {"mode": "hf-eager", "workload": "1x512", "median_ms": 4.0, "gpu_busy_ms": 1.0}]
    note = busy_over_wall_note(rows, "x.json")
    assert note.splitlines()[1] == "  lab-graph 1x512 (fuse_qkv off): busy 1.250 ms > median 1.000 ms"
    assert BUSY_OVER_WALL_REASON in note and "hf-eager" not in note
    assert "no row" in busy_over_wall_note(rows[1:], "x.json")
