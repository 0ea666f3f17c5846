"""scripts/engine_probe.py: the text engine's modes side by side on the H200. Here its host side: the
programmatic-dependent-launch modes compile under inductor's PDL setting and leave it as it was."""

from __future__ import annotations

import torch._inductor.config as inductor_config
from script_loader import load_script

ep = load_script("engine_probe.py")


def test_a_pdl_mode_compiles_with_inductors_pdl_setting_and_restores_it():
    assert ep.pdl_available()  # this torch has the setting; the probe skips the mode where it does not
    before = inductor_config.triton.enable_pdl
    with ep.pdl_compile(True):
        assert inductor_config.triton.enable_pdl is True
    with ep.pdl_compile(False):
        assert inductor_config.triton.enable_pdl == before
    assert inductor_config.triton.enable_pdl == before
