"""The reference set as DataFrames (:mod:`lfm2vl_lab.report.frames`): every role loads with its provenance,
nested fields are columns a reader can select, and the pages' Markdown keeps its exact form."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import lfm2vl_lab
from lfm2vl_lab.report import frames, reference
from lfm2vl_lab.report.reference import ReferenceError


@pytest.mark.parametrize("role", list(reference.load_manifest()["files"]))
def test_every_role_of_the_reference_set_loads_with_its_provenance(role):
    df = frames.load(role)
    res = reference.load(role)
    assert len(df) == len(res.get("rows", [None])) > 0
    assert df.attrs["role"] == role
    assert df.attrs["provenance"] == res["provenance"]
    assert df.attrs["file"] == f"data/results/nvidia-h200/{reference.load_manifest()['files'][role]['file']}"


def test_nested_fields_are_dotted_columns_and_samples_stay_lists():
    df = frames.load("ttft")
    assert {"phases_ms.encoder", "phases_ms.prefill"} <= set(df.columns)
    first = reference.load("ttft")["rows"][0]
    assert df.loc[0, "phases_ms.encoder"] == first["phases_ms"]["encoder"]
    assert df.loc[0, "ttft_samples_ms"] == first["ttft_samples_ms"]  # a list in one cell


def test_a_file_of_sections_gives_one_row():
    df = frames.load("check")  # check has no rows: one row of its sections
    assert len(df) == 1 and "presets" in df.columns and "provenance" not in df.columns


def test_a_missing_role_says_which_roles_there_are(tmp_path):
    with pytest.raises(ReferenceError, match=r"has no 'nope' \(roles recorded: check, ") as err:
        frames.load("nope")
    assert "\n" not in str(err.value)
    with pytest.raises(ReferenceError, match="roles recorded: none"):
        frames.load("ttft", root=tmp_path)


def test_the_package_reaches_the_module():
    assert lfm2vl_lab.frames is frames


def test_md_writes_the_pages_table_form():
    df = pd.DataFrame([["a", None, 1], ["b c", "x", float("nan")]], columns=["name", "v", "n"], dtype=object)
    assert frames.md(df) == "| name | v | n |\n|---|---|---|\n| a | – | 1 |\n| b c | x | – |"


def test_a_role_recorded_elsewhere_names_its_file(tmp_path):
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    (folder / "x-1.json").write_text(json.dumps({"provenance": {"gpu": "NVIDIA H200"},
                                                 "rows": [{"a": {"b": 1}, "s": [1, 2]}]}))
    (folder / "reference.json").write_text(json.dumps({"gpu": "NVIDIA H200", "code_hash": "sha256:0",
                                                       "files": {"x": {"file": "x-1.json"}}}))
    df = frames.load("x", root=tmp_path)
    assert list(df.columns) == ["s", "a.b"] and df.attrs["file"].endswith("nvidia-h200/x-1.json")
