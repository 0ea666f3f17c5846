"""scripts/engine_probe.py: the text engine's modes side by side on the H200. Here its host side: a
``-pdl``/``-gpdl`` mode captures the GEMV with programmatic dependent launch inside its block only."""

from __future__ import annotations

from script_loader import load_script

from lfm2vl_lab.kernels import gemv

ep = load_script("engine_probe.py")


def test_a_pdl_mode_launches_the_gemv_with_pdl_inside_the_block_only(monkeypatch):
    monkeypatch.delenv(gemv.PDL_ENV, raising=False)
    assert not gemv.pdl_wanted()  # the kernel's default: ordinary launches
    with ep.gemv_launches(True):
        assert gemv.pdl_wanted()
    assert not gemv.pdl_wanted()
    monkeypatch.setenv(gemv.PDL_ENV, "1")
    with ep.gemv_launches(False):
        assert not gemv.pdl_wanted()
    assert gemv.pdl_wanted()
