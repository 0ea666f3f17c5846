"""write_model_folder: a model in memory written as a checkpoint folder in a real one's layout. The
folder loads back (the kit's load_model, transformers' from_pretrained) with every weight bit for bit
and the same logits; its config carries the fields vLLM's LFM2 reads; its weights sit under a real
checkpoint's names (the vision tower under ``vision_model.``, no tied ``lm_head``), for every preset
(names only, on the meta device). Whether vLLM itself accepts the folder: tests/test_vllm_parity.py."""

from __future__ import annotations

import json

import pytest
import torch

import lfm2vl_lab as lab
from lfm2vl_lab.model.folder import checkpoint_name, checkpoint_tensors, write_model_folder
from lfm2vl_lab.serving.chat import build_prompt

PRESETS = ("lfm2-vl-450m", "lfm2-vl-1.6b", "lfm2-vl-3b")


@pytest.fixture(scope="module")
def built():
    return lab.build_model("tiny", text_layers="full", seed=3)


@pytest.fixture(scope="module")
def folder(built, tmp_path_factory):
    return write_model_folder(built, tmp_path_factory.mktemp("folder") / "tiny-fp32", dtype=torch.float32)


def safetensors_names(path) -> dict[str, str]:
    """name -> dtype of every tensor in a safetensors file, read from its header."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {name: str(f.get_slice(name).get_dtype()) for name in f.keys()}


def same_weights(a, b) -> list[str]:
    """The names whose tensors differ (or that only one model has)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sorted(set(sa) ^ set(sb)) + [k for k in sa if k in sb and not torch.equal(sa[k], sb[k])]


def last_logits(model, proc) -> torch.Tensor:
    ids, inputs = build_prompt(proc, [lab.synthetic_image(640, 480)], "Describe this image.")
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs).logits[0, -1]


def test_the_folder_loads_back_bit_for_bit(built, folder):
    from transformers import Lfm2VlForConditionalGeneration

    loaded = lab.load_model(folder, dtype=torch.float32)
    assert same_weights(built, loaded) == []
    theirs = Lfm2VlForConditionalGeneration.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    assert same_weights(built, theirs) == []
    assert theirs.lm_head.weight is theirs.model.language_model.embed_tokens.weight  # tied on load
    proc = loaded.lab_chat_processor
    assert proc is not None and loaded.lab_preset.name == "tiny"
    assert torch.equal(last_logits(built, proc), last_logits(loaded, proc))


def test_the_config_carries_what_vllm_reads(built, folder):
    cfg = json.loads((folder / "config.json").read_text())
    text, hidden = cfg["text_config"], built.config.text_config.hidden_size
    assert cfg["architectures"] == ["Lfm2VlForConditionalGeneration"] and text["architectures"] == ["Lfm2ForCausalLM"]
    assert (text["block_dim"], text["conv_dim"], text["conv_dim_out"]) == (hidden, hidden, hidden)
    assert text["block_ff_dim"] == text["intermediate_size"] == built.config.text_config.intermediate_size
    assert cfg["dtype"] == cfg["torch_dtype"] == text["dtype"] == "float32"
    assert text["layer_types"] == built.config.text_config.layer_types


def test_the_weights_sit_under_a_checkpoints_names(built, folder):
    names = safetensors_names(folder / "model.safetensors")
    vision = [n for n in names if n.startswith("model.vision_tower.")]
    assert vision and all(n.startswith("model.vision_tower.vision_model.") for n in vision)
    assert "lm_head.weight" not in names and built.config.tie_word_embeddings
    assert set(names) == {checkpoint_name(n) for n in built.state_dict()} - {"lm_head.weight"}
    assert set(names.values()) == {"F32"}


def test_bfloat16_is_the_default_and_loads_as_written(built, tmp_path):
    folder = write_model_folder(built, tmp_path / "bf16")
    assert set(safetensors_names(folder / "model.safetensors").values()) == {"BF16"}
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = lab.load_model(folder, dtype=torch.bfloat16).state_dict()
    ours = {k: v.to(torch.bfloat16) for k, v in built.state_dict().items()}
    assert loaded.keys() == ours.keys() and all(torch.equal(ours[k], loaded[k]) for k in ours)


def test_generate_and_the_tokenizer_end_at_the_same_token(folder):
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    gen = GenerationConfig.from_pretrained(folder, local_files_only=True)
    assert gen.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


def test_a_loaded_model_keeps_its_own_processor(folder, tmp_path):
    loaded = lab.load_model(folder, dtype=torch.float32)
    loaded.lab_chat_processor.chat_template += "{# the folder's own #}"
    loaded.generation_config.eos_token_id = 2
    again = write_model_folder(loaded, tmp_path / "again", dtype=torch.float32)
    assert (again / "chat_template.jinja").read_text().endswith("{# the folder's own #}")
    assert json.loads((again / "generation_config.json").read_text())["eos_token_id"] == 2
    assert same_weights(loaded, lab.load_model(again, dtype=torch.float32)) == []


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_names_its_weights_as_a_checkpoint_does(preset):
    """On the meta device (no memory): the names and shapes a full-depth preset would write."""
    model = lab.build_model(preset, device="meta", text_layers="full")
    tensors = checkpoint_tensors(model)
    assert "lm_head.weight" not in tensors and len(tensors) == len(model.state_dict()) - 1
    vision = [n for n in tensors if n.startswith("model.vision_tower.")]
    assert len(vision) == sum(1 for _ in model.model.vision_tower.state_dict())
    assert all(n.startswith("model.vision_tower.vision_model.") for n in vision)
    assert all(t.dtype == torch.bfloat16 and t.device.type == "meta" for t in tensors.values())


def test_the_toy_checkpoint_is_written_by_the_writer(tiny_checkpoint):
    names = safetensors_names(tiny_checkpoint / "model.safetensors")
    assert "model.vision_tower.vision_model.post_layernorm.weight" in names and "lm_head.weight" not in names
    assert json.loads((tiny_checkpoint / "config.json").read_text())["text_config"]["conv_dim"] == 64


def test_bad_inputs_are_one_line_errors(built, folder, tmp_path):
    cases = [
        (lambda: write_model_folder(torch.nn.Linear(2, 2), tmp_path / "a"), "not an LFM2-VL model: a Linear"),
        (lambda: write_model_folder(built, folder), "exists and is not an empty folder"),
        (lambda: write_model_folder(built, tmp_path / "b", dtype=torch.int8), "dtype torch.int8 is not one of"),
        (lambda: write_model_folder(lab.build_model("tiny", device="meta"), tmp_path / "c"), "meta device"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    assert not any((tmp_path / n).exists() for n in "abc")  # nothing written on a refusal
