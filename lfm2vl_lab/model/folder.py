"""A model folder in a real LFM2-VL checkpoint's layout, written from a model in memory.

vLLM never takes a model object: it loads a folder. For vLLM, transformers' ``generate`` and the kit
to run the same seeded random weights of a preset, :func:`write_model_folder` writes that model as
the folder a real checkpoint is, which vLLM and transformers both load. transformers' own
``save_pretrained`` is not that folder: it writes the vision tower's weights without their
``vision_model.`` level and a text config without the fields vLLM's LFM2 reads (see
:func:`folder_config` and :func:`checkpoint_name`). It needs torch, transformers and safetensors
(transformers' own dependency) only, and writes a 3B model in seconds: the folder is meant to be
written on the machine that runs it, not carried there.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch

# What a real LFM2-VL checkpoint names its classes: vLLM picks its model class by the top-level
# name, and builds the text model from ``text_config.architectures``.
ARCHITECTURE = "Lfm2VlForConditionalGeneration"
TEXT_ARCHITECTURE = "Lfm2ForCausalLM"
WEIGHTS_FILE = "model.safetensors"
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
VISION_PREFIX = "model.vision_tower."
VISION_LEVEL = "vision_model."  # the level transformers' Siglip2VisionModel drops and vLLM's keeps


def legacy_text_fields(text_config) -> dict[str, int]:
    """The text-config fields of the original LFM2 config that transformers' ``Lfm2Config`` no longer
    has and vLLM's LFM2 still reads: ``block_dim`` (the MLP's input width) and ``conv_dim`` (the
    short convolution's width and the size of its state cache). Real checkpoints carry them with
    ``block_ff_dim`` and ``conv_dim_out``: the hidden size, and the MLP's ``intermediate_size``."""
    hidden = text_config.hidden_size
    return {"block_dim": hidden, "conv_dim": hidden, "conv_dim_out": hidden,
            "block_ff_dim": text_config.intermediate_size}


def folder_config(model, dtype: torch.dtype = torch.bfloat16) -> dict:
    """``model``'s config as the folder's config.json holds it: every field (not only those that
    differ from this transformers' defaults, which another version may not share), the
    architectures vLLM dispatches on, :func:`legacy_text_fields`, and ``dtype``, the weights' dtype
    (vLLM's default ``dtype="auto"`` and transformers' ``dtype="auto"`` read it; ``torch_dtype`` is
    its older name, which older readers look for)."""
    check_lfm2vl(model)
    cfg = model.config.to_dict()
    name = dtype_name(dtype)
    cfg.update(architectures=[ARCHITECTURE], dtype=name, torch_dtype=name)
    cfg["text_config"].update(legacy_text_fields(model.config.text_config), architectures=[TEXT_ARCHITECTURE],
                              dtype=name, torch_dtype=name)
    cfg["vision_config"].update(dtype=name, torch_dtype=name)
    return cfg


def write_config(model, folder: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write :func:`folder_config` as ``folder``/config.json (the folder made if need be): all vLLM
    needs to build the model's modules, on the meta device too. Returns the file."""
    path = Path(folder).expanduser() / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(folder_config(model, dtype), indent=2, sort_keys=True) + "\n")
    return path


def checkpoint_name(name: str) -> str:
    """A parameter's name in a real checkpoint: the vision tower's weights sit under
    ``model.vision_tower.vision_model.``, where vLLM's Siglip2 model looks for them (transformers
    drops and restores that level itself on load). Every other name is transformers' own."""
    if name.startswith(VISION_PREFIX) and not name.startswith(VISION_PREFIX + VISION_LEVEL):
        return VISION_PREFIX + VISION_LEVEL + name[len(VISION_PREFIX):]
    return name


def tied(model) -> bool:
    """Whether the output layer is the token embedding: then a checkpoint holds no ``lm_head.weight``
    (vLLM's loader skips the name; transformers ties the two on load). Every preset and real LFM2-VL
    ties them; vLLM's LFM2 (0.25.1) ties them whatever the config says, so an untied model's folder,
    which holds ``lm_head.weight`` for transformers, would not run its own output layer in vLLM."""
    return bool(model.config.tie_word_embeddings)


def checkpoint_tensors(model, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The weights under :func:`checkpoint_name`, each its own contiguous CPU tensor in ``dtype``
    (converted on the model's device first: a GPU casts a 3B model faster than the CPU). The tied
    ``lm_head.weight`` is left out; on the meta device the tensors are meta ones (names and shapes)."""
    check_lfm2vl(model)
    dtype_name(dtype)
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and tied(model):
            continue
        t = tensor.detach().to(dtype=dtype).contiguous()
        out[checkpoint_name(name)] = t if t.device.type == "meta" else t.cpu()
    return out


def generation_config(model, tokenizer, own_tokenizer: bool):
    """The folder's generation config: the model's own, with a stand-in tokenizer's end of sequence
    as ``eos_token_id``. transformers' ``generate`` stops at this id only, vLLM at the tokenizer's and
    this one, the kit's chat at the tokenizer's: the same id makes all three stop at the same token
    (a preset's text config says 2, ``<|endoftext|>``, where the chat ends a turn with ``<|im_end|>``)."""
    gen = copy.deepcopy(model.generation_config)
    if not own_tokenizer:
        gen.eos_token_id = tokenizer.eos_token_id
        gen._from_model_config = False  # it no longer is the model config's
    return gen


def folder_processor(model):
    """The ``Lfm2VlProcessor`` of the folder ``model`` was loaded from (:func:`~.presets.load_model`),
    or None. A model built from a preset has none of its own: the stand-in that ``chat`` may have
    set on it is :func:`~.toy_processor.toy_processor`'s, which the writer makes afresh."""
    if getattr(model, "lab_checkpoint", None) is None:
        return None
    return getattr(model, "lab_chat_processor", None)


def write_model_folder(model, folder: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``model`` (an LFM2-VL ``Lfm2VlForConditionalGeneration``) as a checkpoint folder that vLLM
    (``LLM(model=folder)``), transformers (``from_pretrained``) and :func:`~.presets.load_model` load.

    It writes config.json (:func:`folder_config`), model.safetensors (:func:`checkpoint_tensors`, in
    ``dtype``), generation_config.json (:func:`generation_config`) and the processor files: the
    model's own when it was loaded from a folder with a tokenizer (:func:`folder_processor`), else
    :func:`~.toy_processor.toy_processor` (tokenizer, chat template, image processor), which vLLM's
    processor reads to expand ``<image>``. ``folder`` must be new or empty. Returns it.
    """
    from safetensors.torch import save_file

    from .toy_processor import toy_processor

    check_lfm2vl(model)
    dtype_name(dtype)
    folder = Path(folder).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{str(folder)!r} exists and is not an empty folder; write_model_folder writes a new one")
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ValueError("write_model_folder: the model is on the meta device and has no weights to write")
    own = folder_processor(model)
    processor = own if own is not None else toy_processor(model)
    tensors = checkpoint_tensors(model, dtype)
    write_config(model, folder, dtype)
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    generation_config(model, processor.tokenizer, own is not None).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def check_lfm2vl(model) -> None:
    """A one-line ``ValueError`` for anything that is not an LFM2-VL model."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type != "lfm2_vl":
        raise ValueError(f"not an LFM2-VL model: a {type(model).__name__} with model_type {model_type!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """The config name of a dtype vLLM and transformers both load; a one-line ``ValueError`` for others."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(map(str, DTYPES))}")
    return DTYPES[dtype]


def save_toy_checkpoint(folder: str | os.PathLike, preset: str = "tiny", seed: int = 0) -> Path:
    """A checkpoint folder in a real one's layout (config, weights, tokenizer, chat template, image
    processor), with random weights in the preset's shapes (full text depth) and :func:`~.toy_processor.toy_processor`:
    what the tests and the README check run ``load_model`` and ``chat`` on. Written in float32 by
    :func:`write_model_folder`, so a model loaded from it has the built model's weights
    exactly. Returns the folder."""
    from .presets import build_model

    model = build_model(preset, seed=seed, text_layers="full")
    # At transformers' initial scale (std 0.02) a small random text model answers every prompt with
    # one token repeated; ten times that scale makes its greedy tokens vary, so a test comparing two
    # paths' tokens compares sequences, not one id.
    with torch.no_grad():
        for p in model.model.language_model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 if p is model.model.language_model.embed_tokens.weight else 0.2)
    return write_model_folder(model, folder, dtype=torch.float32)
