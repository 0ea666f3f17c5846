"""scripts/step_profile.py: where a record step's seconds go, split from a saved cProfile profile."""

from __future__ import annotations

import cProfile

import pytest
from script_loader import load_script

sp = load_script("step_profile.py")


def test_a_profile_s_self_time_is_split_by_where_it_was_spent(tmp_path):
    import torch

    from lfm2vl_lab.model.presets import build_model

    prof = cProfile.Profile()
    prof.enable()
    build_model("tiny", dtype=torch.float32, device="cpu")
    x = torch.randn(256, 256)
    for _ in range(50):  # torch's C++ ops
        x = (x @ x).tanh()
    prof.disable()
    path = tmp_path / "p.prof"
    prof.dump_stats(path)
    split = sp.phase_seconds(path)
    total = split.pop("total (profiled)")
    assert "the kit" in split and split["torch's C++ ops"] > 0  # the kit's own time may round to 0 ms
    assert abs(sum(split.values()) - total) < 0.05 and list(split.values()) == sorted(split.values(), reverse=True)
    assert sp.bucket("/x/site-packages/torch/_inductor/scheduler.py", "codegen") == "torch.compile's machinery"
    assert sp.bucket("~", "<built-in method builtins.compile>") == "Python's compile() (code generation, imports)"
    assert any(line.endswith("(the kit)") for line in sp.top_functions(path, n=10_000))


def test_a_role_no_step_plays_is_refused_with_the_roles_that_exist(tmp_path):
    with pytest.raises(SystemExit, match="no record step plays role 'bench-9b': one of check, bench-450m"):
        sp.run_step("bench-9b", tmp_path, 10)
