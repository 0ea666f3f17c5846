"""Small library helpers the notebooks lean on: plan_stats, SplitProjector.unshuffle,
item_image, results.latest."""

import json

import numpy as np
import torch

from lfm2vl_lab import EncoderGraphConfig, SplitProjector, item_image, plan_stats, process_images, synthetic_image
from lfm2vl_lab.core.packing import lfm2vl_local_gather_idx
from lfm2vl_lab.tools.results import latest


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
    from lfm2vl_lab.tools.results import recorded_label

    res = {"provenance": {"gpu": "NVIDIA H200", "date": "2026-11-30", "command":
                          "python -m lfm2vl_lab bench --out /root/out/w/x/res --name bench --repeats 30"},
           "_path": "data/results/nvidia-h200/bench-1.json"}
    label = recorded_label(res)
    assert "/root" not in label and "--out" not in label
    assert "`python -m lfm2vl_lab bench --name bench --repeats 30`" in label and "bench-1.json" in label


def test_report_draws_each_preset_from_its_newest_file():
    from lfm2vl_lab.tools.report import newest_per_preset

    def res(date, presets, tag):
        return {"provenance": {"gpu": "NVIDIA H200", "date": date},
                "rows": [{"preset": p, "mode": m, "tag": tag} for p in presets for m in ("hf-eager", "lab-graph")]}

    old = res("2026-11-29", ["450m", "1.6b"], "old")
    new450, new16 = res("2026-11-30T10", ["450m"], "new"), res("2026-11-30T11", ["1.6b"], "newer")
    ((slug, (files, rows)),) = newest_per_preset([old, new450, new16]).items()
    assert slug == "nvidia-h200" and files == [new450, new16]
    assert {(r["preset"], r["tag"]) for r in rows} == {("450m", "new"), ("1.6b", "newer")} and len(rows) == 4
    (_, (files, rows)), = newest_per_preset([old, new450]).items()
    assert files == [old, new450] and {(r["preset"], r["tag"]) for r in rows} == {("450m", "new"), ("1.6b", "old")}
