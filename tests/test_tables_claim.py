"""The one verdict on the PR's claim (report/tables_vllm.py): each group of cases is placed by the
intervals of its cuts, the lines say where the claim holds and where it does not, and a set without a
``vllm`` file says what to record."""

from __future__ import annotations

import json

import pytest

from lfm2vl_lab.report import tables_vllm
from lfm2vl_lab.report.frames import Refs


def cut(median, lo, hi):
    return {"cut": median, "ci": [lo, hi]}


@pytest.mark.parametrize("cuts, verdict", [
    ([cut(0.25, 0.21, 0.3), cut(0.12, 0.05, 0.2)], "holds"),  # one above, one open
    ([cut(0.15, 0.11, 0.19)], "holds"),  # within
    ([cut(0.03, -0.02, 0.08), cut(0.05, 0.0, 0.12)], "does not hold"),  # one below, one open
    ([cut(0.03, -0.02, 0.08), cut(0.3, 0.25, 0.35)], "mixed"),
    ([cut(0.12, 0.05, 0.2), cut(0.15, 0.08, 0.3)], "not settled"),  # every interval open
])
def test_a_group_is_placed_by_its_intervals(cuts, verdict):
    assert tables_vllm.group_cell(cuts).startswith(f"**{verdict}**: ")


def vllm_row(engine, preset, case, tokens, e2e, ttft):
    return {"engine": engine, "preset": preset, "case": case, "tokens": tokens, "arm": "pr", "e2e_cut": e2e,
            "ttft_cut": ttft}


def make_refs(tmp_path, with_vllm=True) -> Refs:
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    prov = {"gpu": "NVIDIA H200", "torch": "2.11", "transformers": "5.17", "date": "2030-01-02", "vllm": "0.25.1"}
    short, long_ = cut(0.25, 0.21, 0.3), cut(0.03, -0.02, 0.08)
    rows = [vllm_row(e, "lfm2-vl-3b", "1x512", t, short if t == 16 else long_, cut(0.4, 0.3, 0.5))
            for e in ("vllm", "kit") for t in (16, 128)]
    files = {"vllm": {"provenance": prov, "presets": {"lfm2-vl-3b": {}}, "rows": rows}} if with_vllm else {}
    files["ttft"] = {"provenance": prov, "rows": []}
    for role, data in files.items():
        (folder / f"{role}-x.json").write_text(json.dumps(data))
    man = {"gpu": "NVIDIA H200", "files": {role: {"file": f"{role}-x.json"} for role in files}}
    (folder / "reference.json").write_text(json.dumps(man))
    return Refs(root=tmp_path)


def test_the_verdict_says_where_the_claim_holds_and_where_it_does_not(tmp_path):
    out = tables_vllm.BLOCKS["pr-verdict"](make_refs(tmp_path))
    lines = out.splitlines()
    assert lines[0] == ("| measure | preset | inside vLLM 0.25.1, PR config | the kit's pipeline, PR config, "
                        "same weights |")
    assert ("| whole requests of 16 tokens | LFM2-VL-3B | **holds**: 25.0% over 1 case (1 above) | "
            "**holds**: 25.0% over 1 case (1 above) |") in lines
    assert ("| whole requests of 128 tokens | LFM2-VL-3B | **does not hold**: 3.0% over 1 case (1 below) | "
            "**does not hold**: 3.0% over 1 case (1 below) |") in lines
    assert "(role `vllm`)" in out


def test_without_a_vllm_file_the_verdict_says_what_to_record(tmp_path):
    out = tables_vllm.BLOCKS["pr-verdict"](make_refs(tmp_path, with_vllm=False))
    assert "record --part vllm" in out and "role `vllm`" in out
