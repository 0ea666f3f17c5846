"""On a GPU: the roofline's timings are what they claim: a kernel in a graph costs less than an eager
launch, the fitted boundary cost is positive, every kernel's rate stays under the measured roofs
(within 10%: L2 is defeated, so a faster rate would be a counting error), and a run writes its file."""

import json

import pytest
import torch

from lfm2vl_lab.cli.cli import main
from lfm2vl_lab.measure import roofline

pytestmark = pytest.mark.gpu


def test_a_kernel_in_a_graph_costs_less_than_an_eager_launch():
    b = roofline.measure_boundary(trials=3)
    assert 0 < b["graph"]["us_per_kernel"] < b["eager"]["us_per_kernel"]
    assert [r["n"] for r in b["rows"]] == list(roofline.BOUNDARY_N)


def test_a_run_writes_every_part_and_no_kernel_beats_the_roofs(tmp_path):
    assert main(["roofline", "--trials", "3", "--out", str(tmp_path), "--no-progress"]) == 0
    res = json.loads(next(tmp_path.rglob("roofline-*.json")).read_text())
    assert res["complete"] and res["provenance"]["gpu"] == torch.cuda.get_device_name()
    bw, peak = res["peaks"][0]["gb_s"], res["peaks"][1]["tflop_s"]
    assert bw > 1000 and peak > 100  # an H200 copies TB/s and multiplies hundreds of TFLOP/s
    for r in res["rows"]:
        assert r["us"] > 0 and r["gb_s"] <= 1.1 * bw and r["tflop_s"] <= 1.1 * peak, r["name"]
    assert {c["impl"] for c in res["composed"]} >= {"F.linear"} and all(c["composed"] for c in res["composed"])
