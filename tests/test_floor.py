"""tools/floor: the kernel classes of a profiled call and the encoder's targets, judged on rows
shaped like the bench's and on the reference set's 450M bench."""

import pytest

from lfm2vl_lab.tools import reference
from lfm2vl_lab.tools.floor import TARGETS, judge_targets, kernel_breakdown, kernel_class, targets_table


@pytest.mark.parametrize("name,cls", [
    ("nvjet_sm90_tst_96x64_64x10_1x2_h_bz_bias_TNN", "GEMM"),
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
    table = targets_table(judge_targets(_rows(1.2, compile_ms=1.0)))
    assert "**no**" in table and table.count("\n") == len(judge_targets(_rows(1.2))) + 1


def test_targets_of_the_reference_run():
    """The reference set's 450M bench gives every target a measured value."""
    res = reference.load("bench-450m")
    assert res["provenance"]["preset"] == "lfm2-vl-450m"  # the targets are the 450M preset's
    judged = judge_targets(res["rows"])
    latency = [t for t in judged if t["target"].startswith("450M") and "median" in t["target"]]
    assert len(latency) == len(TARGETS["latency"])
    missing = [t["target"] for t in judged if not isinstance(t["value"], (int, float, bool))]
    assert not missing, f"targets without a measured value: {missing}"
