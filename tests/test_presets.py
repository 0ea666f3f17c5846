"""Presets: the shipped shapes, model construction, parameter counts and checkpoint loading."""

import json

import pytest
import torch

from lfm2vl_lab import Preset, available_presets, build_model, count_params, load_model
from lfm2vl_lab.model.presets import STUB_TEXT_LAYERS, STUB_VOCAB, build_config, match_preset, mlp_width

PRESETS = available_presets()

FIELDS = {
    "vision": {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
               "layer_norm_eps", "num_patches"},
    "projector": {"hidden_size", "use_layernorm", "hidden_act", "bias"},
    "text": {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "vocab_size", "full_attn_idxs"},
    "processor": {"patch_size", "downsample_factor", "max_num_patches", "tile_size", "min_tiles", "max_tiles",
                  "min_image_tokens", "max_image_tokens", "image_mean", "image_std", "max_pixels_tolerance",
                  "use_thumbnail"},
}

# Shapes from the reference table (vision hidden/inter/layers/heads, projector hidden & LayerNorm,
# text hidden, thumbnail).
EXPECTED = {
    "lfm2-vl-450m": ((768, 3072, 12, 12), (2560, True), 1024, False),
    "lfm2-vl-1.6b": ((1152, 4304, 26, 16), (2560, True), 2048, True),
    "lfm2.5-vl-1.6b": ((1152, 4304, 27, 16), (2048, False), 2048, True),
    "lfm2-vl-3b": ((1152, 4304, 26, 16), (2560, True), 2048, True),
}


def test_the_documented_presets_ship():
    assert {"tiny", "lfm2-vl-450m", "lfm2-vl-1.6b", "lfm2.5-vl-1.6b", "lfm2-vl-3b"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_with_documented_fields(name):
    p = Preset.from_name(name)
    assert p.name == name
    assert isinstance(p.description, str) and p.description
    assert set(p.status) == {"vision", "projector", "text", "processor"}
    for block, keys in FIELDS.items():
        assert set(getattr(p, block)) == keys, f"{name}.{block}"
    # Geometry shared by every LFM2-VL variant (and by the tiny preset, which keeps the processor).
    assert (p.patch_size, p.downsample_factor, p.max_num_patches) == (16, 2, 1024)
    assert (p.min_image_tokens, p.max_image_tokens) == (64, 256)
    assert p.vision["num_patches"] == 256
    proc = p.processor
    assert (proc["tile_size"], proc["min_tiles"], proc["max_tiles"]) == (512, 2, 10)
    assert proc["image_mean"] == [0.5] * 3 and proc["image_std"] == [0.5] * 3
    assert p.vision["hidden_size"] % p.vision["num_attention_heads"] == 0
    assert all(0 <= i < p.text["num_hidden_layers"] for i in p.text["full_attn_idxs"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_presets_match_the_reference_shapes(name):
    p = Preset.from_name(name)
    (hid, inter, layers, heads), (proj_hid, ln), text_hid, thumb = EXPECTED[name]
    v = p.vision
    assert (v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"], v["num_attention_heads"]) == (
        hid, inter, layers, heads)
    assert (p.projector["hidden_size"], p.projector["use_layernorm"]) == (proj_hid, ln)
    assert p.text["hidden_size"] == text_hid
    assert p.processor["use_thumbnail"] is thumb


def test_only_450m_is_marked_verified_for_vision():
    assert Preset.from_name("lfm2-vl-450m").status["vision"] == "verified"
    assert Preset.from_name("tiny").status["vision"] == "synthetic"
    assert not Preset.from_name("lfm2.5-vl-1.6b").is_verified
    assert not Preset.from_name("lfm2-vl-3b").is_verified


@pytest.mark.parametrize("name", PRESETS)
def test_sources_are_lines_of_text(name):
    sources = Preset.from_name(name).sources  # optional: presets without the field load with []
    assert isinstance(sources, list) and all(isinstance(line, str) and line for line in sources)


def test_3b_names_its_sources_and_what_is_unverified():
    p = Preset.from_name("lfm2-vl-3b")
    pages = " ".join(p.sources)
    for page in ("huggingface.co/LiquidAI/LFM2-VL-3B", "huggingface.co/LiquidAI/LFM2-2.6B",
                 "docs.liquid.ai/lfm/getting-started/vision"):
        assert page in pages
    assert "attention layer positions unverified" in p.status["text"]
    assert "unverified" in p.status["vision"] and "inferred" in p.status["projector"]


def _meta_model(name, text_layers=None):
    """The preset's model built on the meta device: shapes and parameter counts, no memory, no init."""
    from transformers import Lfm2VlForConditionalGeneration

    with torch.device("meta"):
        return Lfm2VlForConditionalGeneration(build_config(name, text_layers=text_layers))


def test_3b_text_tower_shapes():
    tc = build_config("lfm2-vl-3b", text_layers="full").text_config
    assert (tc.hidden_size, tc.num_hidden_layers, tc.vocab_size) == (2048, 30, 65536)
    assert (tc.num_attention_heads, tc.num_key_value_heads, tc.tie_word_embeddings) == (32, 8, True)
    assert tc.layer_types.count("full_attention") == 8 and tc.layer_types.count("conv") == 22
    assert mlp_width(tc) == 10752  # intermediate_size 16128 after transformers' auto-adjust (2/3)
    text = _meta_model("lfm2-vl-3b", "full").model.language_model
    attn = text.layers[Preset.from_name("lfm2-vl-3b").text["full_attn_idxs"][0]].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features) == (32 * 64, 8 * 64)  # head dim 64
    assert text.layers[0].feed_forward.w1.out_features == 10752


@pytest.mark.parametrize("name, published", [("lfm2-vl-3b", 2_569_272_320),  # LFM2-2.6B's model card
                                             ("lfm2-vl-1.6b", 1_170_340_608)])  # LFM2-1.2B's, same arithmetic
def test_full_text_tower_has_the_published_parameter_count(name, published):
    assert count_params(_meta_model(name, "full"))["text"] == published
    exp = Preset.from_name(name).expected_params
    assert exp.get("text", published) == published


def test_3b_vision_path_is_the_1_6b_one_and_its_own_preset_matches():
    """Same encoder and projector as LFM2-VL-1.6B (docs.liquid.ai); the text MLP width tells them apart."""
    a, b = build_config("lfm2-vl-3b"), build_config("lfm2-vl-1.6b")
    assert a.vision_config.to_dict() == b.vision_config.to_dict()
    assert (a.projector_hidden_size, a.projector_use_layernorm) == (b.projector_hidden_size, b.projector_use_layernorm)
    assert match_preset(a).name == "lfm2-vl-3b" and match_preset(b).name == "lfm2-vl-1.6b"


def test_3b_vision_only_build_has_the_text_stub():
    m = build_model("lfm2-vl-3b", device="meta")  # build_model's own path, without allocating weights
    assert m.lab_preset.name == "lfm2-vl-3b"
    assert len(m.model.vision_tower.encoder.layers) == 26
    assert len(m.model.language_model.layers) == STUB_TEXT_LAYERS and m.config.text_config.vocab_size <= STUB_VOCAB
    assert m.model.multi_modal_projector.linear_2.out_features == 2048  # the text width


def test_unknown_preset_names_the_available_ones():
    with pytest.raises(ValueError) as e:
        Preset.from_name("lfm2-vl-9000b")
    msg = str(e.value)
    assert "lfm2-vl-9000b" in msg
    for name in PRESETS:
        assert name in msg


def test_build_tiny(tiny_model):
    from transformers import Lfm2VlForConditionalGeneration

    m = tiny_model
    assert isinstance(m, Lfm2VlForConditionalGeneration)
    assert not m.training
    assert m.lab_preset.name == "tiny"
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())
    vt = m.model.vision_tower
    assert vt.embeddings.patch_embedding.in_features == 3 * 16 * 16
    assert vt.embeddings.patch_embedding.out_features == 64
    assert len(vt.encoder.layers) == 2
    # vision_use_head=False: no attention-pooling head parameters
    assert not any("head" in n for n, _ in vt.named_parameters())
    assert m.model.multi_modal_projector.linear_2.out_features == 64


def test_build_is_seeded():
    a, b, c = build_model("tiny", seed=3), build_model("tiny", seed=3), build_model("tiny", seed=4)
    wa = a.model.vision_tower.embeddings.patch_embedding.weight
    assert torch.equal(wa, b.model.vision_tower.embeddings.patch_embedding.weight)
    assert not torch.equal(wa, c.model.vision_tower.embeddings.patch_embedding.weight)


def test_build_dtype():
    m = build_model("tiny", dtype=torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}


@pytest.mark.slow
def test_450m_parameter_counts(model_450m):
    counts = count_params(model_450m)
    assert counts["vision"] == pytest.approx(85.8e6, abs=0.1e6)
    assert counts["projector"] == pytest.approx(10.5e6, abs=0.1e6)
    exp = Preset.from_name("lfm2-vl-450m").expected_params
    assert counts["vision"] == pytest.approx(exp["vision"], abs=0.1e6)
    assert counts["projector"] == pytest.approx(exp["projector"], abs=0.1e6)


@pytest.mark.slow
def test_vision_only_default_has_a_one_layer_text_stub(tiny_model, model_450m):
    for m in (tiny_model, model_450m):
        tc = m.config.text_config
        assert tc.num_hidden_layers == STUB_TEXT_LAYERS == 1
        assert len(m.model.language_model.layers) == 1
        assert tc.vocab_size <= STUB_VOCAB
        assert tc.layer_types == ["full_attention"]
        # the text width is real: it is what the projector writes
        assert tc.hidden_size == m.lab_preset.text["hidden_size"]
    assert count_params(model_450m)["text"] < 20e6  # the full LFM2-350M text model would be ~350M


def test_full_text_depth_config():
    p = Preset.from_name("lfm2-vl-450m")
    cfg = build_config(p, text_layers="full")
    tc = cfg.text_config
    assert tc.num_hidden_layers == p.text["num_hidden_layers"] == 16
    assert tc.vocab_size == 65536
    assert [i for i, t in enumerate(tc.layer_types) if t == "full_attention"] == p.text["full_attn_idxs"]
    assert len(tc.layer_types) == 16
    assert cfg.vision_config.num_hidden_layers == 12
    assert cfg.vision_config.vision_use_head is False
    assert cfg.projector_hidden_size == 2560 and cfg.downsample_factor == 2


def test_int_text_layers_config():
    cfg = build_config("lfm2-vl-450m", text_layers=3)
    assert cfg.text_config.num_hidden_layers == 3
    assert cfg.text_config.vocab_size == 65536
    assert cfg.text_config.layer_types == ["conv", "conv", "full_attention"]
    cfg1 = build_config("lfm2-vl-450m", text_layers=1)  # no full-attention index below 1: the last layer
    assert cfg1.text_config.layer_types == ["full_attention"]


@pytest.mark.parametrize("bad", [0, -2, "half", 1.5])
def test_bad_text_layers(bad):
    with pytest.raises(ValueError, match="text_layers"):
        build_config("tiny", text_layers=bad)


def test_load_model_missing_folder(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(ValueError) as e:
        load_model(missing)
    assert str(missing) in str(e.value)


def test_load_model_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError) as e:
        load_model(tmp_path)
    assert str(tmp_path) in str(e.value) and "config.json" in str(e.value)


def test_load_model_non_lfm2_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError) as e:
        load_model(tmp_path)
    assert "'bert'" in str(e.value) and str(tmp_path) in str(e.value)


def test_load_model_roundtrip(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="preset 'tiny'"):  # no processor file saved: the matching preset's
        m = load_model(tmp_path, dtype=torch.float32)
    assert m.lab_preset.name == "tiny"
    assert not m.training
    assert m.config.model_type == "lfm2_vl"
    ref = dict(tiny_model.named_parameters())
    got = dict(m.named_parameters())
    assert set(got) == set(ref)
    for name, p in got.items():
        assert torch.equal(p, ref[name]), name
