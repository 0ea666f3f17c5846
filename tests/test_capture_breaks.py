"""measure/capture_breaks.py: what breaks a CUDA-graph capture (notebook 02, section 2 and exercise 1).

On a CPU: the meta-device check for host reads (which constructs fail on meta tensors, and where),
``to_meta`` on the things notebook 02 moves, and the claim notebook 02 makes with it: transformers'
image path fails on meta at its ``.tolist()``, the packed encoder runs. On a GPU (``gpu`` marker) the
capture itself is in tests/test_graph_apis.py.
"""

from __future__ import annotations

import pytest
import torch

import lfm2vl_lab as lab
from lfm2vl_lab.measure import capture_breaks as cb


def test_the_cases_are_notebook_02s_constructs():
    assert list(cb.host_read_cases("cpu")) == [".item()", ".tolist()", "pageable CPU->GPU copy", "v * 2 (no host read)"]


def test_host_reads_fail_on_meta_and_the_rest_runs():
    out = cb.meta_errors()
    assert set(out) == set(cb.host_read_cases("cpu"))
    assert not out[".item()"]["ran"] and out[".item()"]["error"].startswith("RuntimeError: ")
    assert not out[".tolist()"]["ran"] and "meta" in out[".tolist()"]["error"]
    # a copy to the device reads no value on the host: meta lets it through (capture refuses it)
    assert out["pageable CPU->GPU copy"] == out["v * 2 (no host read)"] == {"ran": True, "error": None, "at": None}


def test_meta_outcome_names_the_line_outside_torch_that_raised():
    v = torch.ones(3, device="meta")

    def body():
        return int(v.sum())   # the host read

    out = cb.meta_outcome(body)
    assert not out["ran"] and out["at"].startswith("test_capture_breaks.py:") and "int(v.sum())" in out["at"]
    assert cb.meta_outcome(lambda: v * 2)["ran"]


def test_to_meta_copies_and_leaves_the_original_where_it_is():
    model = torch.nn.Linear(4, 2)
    meta = cb.to_meta(model)
    assert meta.weight.is_meta and not model.weight.is_meta
    got = cb.to_meta({"a": torch.ones(2), "b": [torch.ones(1), 3], "c": "text"})
    assert got["a"].is_meta and got["b"][0].is_meta and got["b"][1] == 3 and got["c"] == "text"
    assert isinstance(cb.to_meta((torch.ones(1),)), tuple)


@pytest.fixture(scope="module")
def tiny():
    model = lab.build_model("tiny")
    return model, lab.process_images(lab.load_sample_images(), "tiny")


def test_a_packed_batch_keeps_its_python_fields_on_meta(tiny):
    model, inputs = tiny
    batch = lab.PackedVisionEncoder(model).pack(inputs)
    meta = cb.to_meta(batch)
    assert meta.pixel_values.is_meta and meta.cu_seqlens.is_meta and meta.gather_idx.is_meta
    assert meta.max_seqlen == batch.max_seqlen and meta.shapes == batch.shapes and not batch.pixel_values.is_meta


def test_transformers_path_fails_on_meta_at_its_tolist_and_the_packed_encoder_runs(tiny):
    model, inputs = tiny
    meta_model = cb.to_meta(model)
    keys = ("pixel_values", "spatial_shapes", "pixel_attention_mask")
    hf = cb.meta_outcome(lambda: meta_model.model.get_image_features(**cb.to_meta({k: inputs[k] for k in keys})))
    assert not hf["ran"] and hf["at"].startswith("modeling_siglip2.py:") and ".tolist()" in hf["at"]
    batch = lab.PackedVisionEncoder(model).pack(inputs)
    assert cb.meta_outcome(lambda: lab.PackedVisionEncoder(meta_model).forward_packed(cb.to_meta(batch)))["ran"]
