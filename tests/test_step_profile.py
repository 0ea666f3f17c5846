"""scripts/step_profile.py: where a record step's seconds go, split from a saved cProfile profile."""

from __future__ import annotations

import cProfile

import pytest
from script_loader import load_script

sp = load_script("step_profile.py")


def test_a_profile_s_phases_count_the_kit_s_named_functions_and_nothing_else(tmp_path):
    import torch

    from lfm2vl_lab.model.presets import build_model

    prof = cProfile.Profile()
    prof.enable()
    build_model("tiny", dtype=torch.float32, device="cpu")
    x = torch.randn(256, 256)
    for _ in range(50):  # time outside every phase
        x = (x @ x).tanh()
    prof.disable()
    path = tmp_path / "p.prof"
    prof.dump_stats(path)
    phases = sp.phase_seconds(path)
    assert 0 < phases["build a model (random weights)"] <= phases["total (profiled)"]
    assert phases["first compile (dynamo and inductor)"] == 0 and phases["encoder graph capture"] == 0
    assert any("presets.py:build_model" in line for line in sp.top_functions(path))


def test_a_role_no_step_plays_is_refused_with_the_roles_that_exist(tmp_path):
    with pytest.raises(SystemExit, match="no record step plays role 'bench-9b': one of check, bench-450m"):
        sp.run_step("bench-9b", tmp_path, 10)
