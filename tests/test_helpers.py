"""Small library helpers the notebooks lean on: plan_stats, SplitProjector.unshuffle,
item_image, results.latest."""

import json

import numpy as np
import torch

from lfm2vl_lab import EncoderGraphConfig, SplitProjector, item_image, plan_stats, process_images, synthetic_image
from lfm2vl_lab.core.packing import lfm2vl_local_gather_idx
from lfm2vl_lab.measure.results import latest


def test_plan_stats_counts_replays_padding_and_eager():
    cfg = EncoderGraphConfig.build(out_hidden_size=8, budgets=[64, 256], max_items=4)
    # call 1: 100 + 60 tokens -> one replay in 256 (96 padded); call 2: 300 tokens -> eager; 64 -> exact
    stats = plan_stats([[100, 60], [300, 64]], cfg)
    assert stats == {"replays": 2, "real": 224, "padded": 96, "eager_items": 1, "waste": 96 / 224}


def test_unshuffle_matches_transformers_pixel_unshuffle(tiny_model):
    proj = tiny_model.model.multi_modal_projector
    split = SplitProjector(proj, factor=2)
    x = torch.randn(1, 6, 10, 64)
    ours = split.unshuffle(x.reshape(60, 64), lfm2vl_local_gather_idx(6, 10))
    assert torch.equal(ours, proj.pixel_unshuffle(x).reshape(-1, 256))


def test_item_image_inverts_the_processor():
    img = synthetic_image(256, 256, seed=3)
    inputs = process_images([img], "tiny")
    out = item_image(inputs, 0, "tiny")
    h, w = inputs["spatial_shapes"][0].tolist()
    assert out.shape == (16 * h, 16 * w, 3) and out.min() >= 0 and out.max() <= 1
    # the processor only resized this image: the mean colour survives the round trip
    assert np.allclose(out.mean(axis=(0, 1)), np.asarray(img).mean(axis=(0, 1)) / 255, atol=0.02)


def test_latest_picks_the_newest_file_by_date(tmp_path):
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    for name, date in [("check-b.json", "2026-01-02T00:00:00"), ("check-a.json", "2026-03-01T00:00:00"),
                       ("bench-c.json", "2026-12-01T00:00:00")]:
        (folder / name).write_text(json.dumps({"provenance": {"date": date, "gpu": "NVIDIA H200"}}))
    assert latest("check", "NVIDIA H200", root=tmp_path)["provenance"]["date"] == "2026-03-01T00:00:00"
    assert latest("e2e", "NVIDIA H200", root=tmp_path) is None


def test_recorded_label_hides_the_output_folder_of_the_machine_it_ran_on():
    from lfm2vl_lab.measure.results import recorded_label

    res = {"provenance": {"gpu": "NVIDIA H200", "date": "2026-11-30", "command":
                          "python -m lfm2vl_lab bench --out /root/out/w/x/res --name bench --repeats 30"},
           "_path": "data/results/nvidia-h200/bench-1.json"}
    label = recorded_label(res)
    assert "/root" not in label and "--out" not in label
    assert "`python -m lfm2vl_lab bench --name bench --repeats 30`" in label and "bench-1.json" in label


def test_report_draws_each_preset_from_its_own_reference_file():
    """Each preset's figures come from the file of its role, none from two files (the budget sweep
    beside them draws none)."""
    from lfm2vl_lab.report.report import figure_jobs

    def res(role, preset, date):
        return {"name": role, "_role": role, "_path": f"x/{role}.json",
                "provenance": {"gpu": "NVIDIA H200", "date": date, "preset": preset, "dtype": "bfloat16"},
                "rows": [{"preset": preset, "mode": m, "workload": "1x512", "median_ms": 1.0}
                         for m in ("hf-eager", "lab-graph")]}

    files = {"bench-450m": res("bench-450m", "lfm2-vl-450m", "2026-11-29"),
             "bench-1.6b": res("bench-1.6b", "lfm2-vl-1.6b", "2026-11-30"),
             "sweep-budgets": res("sweep-budgets", "lfm2-vl-450m", "2026-12-01")}
    used = {stem: [f["_role"] for f in src] for stem, _draw, src in figure_jobs(files, "nvidia-h200")}
    kinds = ("latency", "timeline")
    assert set(used) == {f"nvidia-h200-{p}-bfloat16-{k}" for p in ("lfm2-vl-450m", "lfm2-vl-1.6b") for k in kinds}
    for stem, roles in used.items():
        assert roles == ["bench-450m" if "-450m-" in stem else "bench-1.6b"], stem
