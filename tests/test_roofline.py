"""``python -m lfm2vl_lab roofline`` without a GPU: a decode step's linears as the fused engine runs them,
the bytes and FLOPs a kernel's shapes imply, the boundary fit, the composed GEMV sum (labelled composed),
and a one-line refusal on a machine without CUDA."""

import pytest
import torch

from lfm2vl_lab.cli.cli import main
from lfm2vl_lab.measure import roofline
from lfm2vl_lab.measure.record import STEPS
from lfm2vl_lab.report.reference import load


def test_the_decode_linears_carry_the_weights_the_engine_floor_counts():
    shapes = roofline.decode_shapes("lfm2-vl-450m")
    t = shapes["text"]
    assert (t["layers"], t["attention_layers"], t["mlp"], t["head_dim"]) == (16, 6, 4608, 64)
    counts = {lin["name"]: lin["count"] for lin in shapes["linears"]}
    assert counts["q/k/v (attention layers)"] + counts["in_proj (short-conv layers)"] == 16
    weights = sum(roofline.BF16 * lin["n"] * lin["k"] * lin["count"] for lin in shapes["linears"])
    # the recorded engine floor counts every parameter the step reads; the linears are nearly all of it
    floor = load("engine")["setup"][0]["floor"]["param_bytes"]
    assert 0.99 * floor <= weights <= floor


def test_a_kernel_s_bytes_and_flops_follow_from_its_shapes():
    assert roofline.traffic("gemm", m=1, n=3, k=4) == (2 * (4 + 12 + 3), 24)
    assert roofline.traffic("add", numel=10) == (60, 10)
    b, f = roofline.traffic("attention", cache=5, heads=4, kv_heads=2, head_dim=8)
    assert (b, f) == (2 * (2 * 32 + 2 * 5 * 2 * 8), 4 * 5 * 32)
    with pytest.raises(ValueError, match="unknown kind 'conv'"):
        roofline.traffic("conv", numel=1)


def test_the_boundary_fit_reads_a_slope_and_an_intercept():
    fit = roofline.slope([256, 512, 1024], [266.0, 522.0, 1034.0])
    assert fit["us_per_kernel"] == pytest.approx(1.0) and fit["intercept_us"] == pytest.approx(10.0)


def test_each_kernel_graph_reads_past_l2():
    assert roofline.copies_for(2 * 2**20) * 2 * 2**20 >= roofline.COLD_BYTES  # a 1024x1024 bf16 weight
    assert roofline.copies_for(10) == 512 and roofline.copies_for(2**30) == 8


def test_the_step_s_gemvs_sum_by_count_and_say_they_are_composed():
    rows = [{"class": "GEMV", "impl": "F.linear", "per_step": 3, "us": 2.0, "predicted_us": 1.0, "bytes": 10},
            {"class": "GEMV", "impl": "triton", "per_step": 3, "us": 1.5, "predicted_us": 1.0, "bytes": 10},
            {"class": "GEMV", "impl": "F.linear", "per_step": 1, "us": 5.0, "predicted_us": 4.0, "bytes": 40}]
    c = roofline.composed_gemvs(rows, "F.linear")
    assert c == {"impl": "F.linear", "kernels": 4, "us": 11.0, "predicted_us": 7.0, "bytes": 70, "composed": True}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a machine without CUDA sees")
def test_without_cuda_the_command_refuses_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["roofline", "--out", "/nonexistent"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "roofline needs a CUDA GPU" in err and "Traceback" not in err


def test_the_reference_run_records_it():
    step = next(s for s in STEPS if s.role == "roofline")
    assert step.argv[0] == "roofline" and step.limit_s >= 60


def _result():
    kernel = {"kind": "kernel", "class": "GEMV", "impl": "F.linear", "name": "w2, F.linear", "bytes": 9_448_448,
              "flops": 9_437_184, "us": 7.8, "gb_s": 1211.3, "tflop_s": 1.2, "predicted_us": 2.2}
    return {"peaks": [{"name": "streaming add", "gb_s": 4300.0}, {"name": "GEMM", "tflop_s": 700.0}],
            "boundary": {"rows": [{"n": n, "us": 10 + 1.1 * n} for n in roofline.BOUNDARY_N],
                         "graph": {"us_per_kernel": 1.1, "intercept_us": 10.0, "fit_from": 256},
                         "eager": {"us_per_kernel": 9.0}},
            "rows": [kernel, dict(kernel, impl="triton", name="w2, the kit's Triton GEMV", us=6.9, gb_s=1369.3)]}


def test_the_figure_labels_its_axes_and_names_the_roofs_it_measured():
    from lfm2vl_lab.report import roofline_figure

    fig = roofline_figure(_result(), title="t")
    left, right = fig.axes
    assert "FLOPs per byte" in left.get_xlabel() and "TFLOP/s" in left.get_ylabel()
    assert "GB/s" in right.get_ylabel() and "bytes" in right.get_xlabel()
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "roofs: 4.30 TB/s, 700 TFLOP/s (measured)" in labels and "GEMV (the kit's Triton GEMV)" in labels


def test_a_file_without_rows_draws_no_figure():
    from lfm2vl_lab.report import NoData, roofline_figure

    with pytest.raises(NoData, match="no kernel rows"):
        roofline_figure({"peaks": [], "rows": []})
