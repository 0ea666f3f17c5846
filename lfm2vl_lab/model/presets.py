"""Model presets and model construction.

A preset is data (``data/presets/<name>.json``) carrying the real LFM2-VL shapes: vision tower,
projector, text model and image-processor settings, plus a ``status`` block that says which of
those shapes are verified (and, optionally, ``sources``: where each fact comes from).
``build_model`` turns a preset into a transformers ``Lfm2VlForConditionalGeneration`` with seeded
random weights; ``load_model`` loads a real checkpoint from a local folder. Nothing here ever reaches a model hub.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PRESET_DIR = Path(__file__).resolve().parents[2] / "data" / "presets"

# Vision-only work does not need a 65k-token vocabulary or 16 text layers: the projector's output
# width is all the vision path sees of the text model. These stub sizes keep it cheap.
STUB_TEXT_LAYERS = 1
STUB_VOCAB = 1024


@dataclass(frozen=True)
class Preset:
    """One named model shape. ``vision``/``projector``/``text``/``processor`` are plain dicts;
    ``sources`` lists, one line each, the public pages the shapes come from (optional)."""

    name: str
    description: str
    status: dict[str, str]
    vision: dict[str, Any]
    projector: dict[str, Any]
    text: dict[str, Any]
    processor: dict[str, Any]
    expected_params: dict[str, float] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    @classmethod
    def from_name(cls, name: str) -> Preset:
        path = PRESET_DIR / f"{name}.json"
        if not path.exists():
            raise ValueError(f"unknown preset {name!r}; available: {', '.join(available_presets())}")
        return cls(**json.loads(path.read_text()))

    # -- handy derived numbers ------------------------------------------------------------
    @property
    def patch_size(self) -> int:
        return self.processor["patch_size"]

    @property
    def downsample_factor(self) -> int:
        return self.processor["downsample_factor"]

    @property
    def max_num_patches(self) -> int:
        return self.processor["max_num_patches"]

    @property
    def min_image_tokens(self) -> int:
        return self.processor["min_image_tokens"]

    @property
    def max_image_tokens(self) -> int:
        return self.processor["max_image_tokens"]

    @property
    def is_verified(self) -> bool:
        return all(v == "verified" for v in self.status.values())


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def as_preset(preset: str | Preset) -> Preset:
    return preset if isinstance(preset, Preset) else Preset.from_name(preset)


def build_config(preset: str | Preset, text_layers: int | str | None = None):
    """Build an ``Lfm2VlConfig`` for a preset.

    ``text_layers``: ``None`` → a one-layer text stub with a small vocabulary (vision-only work);
    ``"full"`` → the preset's real text depth and vocabulary; an int → that many text layers with
    the real vocabulary.
    """
    from transformers import Lfm2VlConfig

    p = as_preset(preset)
    text = dict(p.text)
    if text_layers is None:
        text["num_hidden_layers"] = STUB_TEXT_LAYERS
        text["vocab_size"] = min(text["vocab_size"], STUB_VOCAB)
    elif text_layers != "full":
        if not isinstance(text_layers, int) or text_layers < 1:
            raise ValueError(f"text_layers must be None, 'full' or a positive int, got {text_layers!r}")
        text["num_hidden_layers"] = text_layers
    n = text["num_hidden_layers"]
    full_idx = [i for i in text.pop("full_attn_idxs") if i < n] or [n - 1]
    text["layer_types"] = ["full_attention" if i in full_idx else "conv" for i in range(n)]
    text["model_type"] = "lfm2"

    vision = dict(p.vision, patch_size=p.patch_size, num_channels=3, model_type="siglip2_vision_model")
    # The default Siglip2 vision config builds an attention-pooling head LFM2-VL never uses.
    vision["vision_use_head"] = False
    cfg = Lfm2VlConfig(
        vision_config=vision,
        text_config=text,
        projector_hidden_size=p.projector["hidden_size"],
        projector_use_layernorm=p.projector["use_layernorm"],
        projector_hidden_act=p.projector["hidden_act"],
        projector_bias=p.projector["bias"],
        downsample_factor=p.downsample_factor,
    )
    cfg.vision_config.vision_use_head = False
    return cfg


def check_device(device, where: str = "build_model", hint: str = "") -> torch.device:
    """``device`` as a ``torch.device``. A CUDA device this machine lacks is a one-line ``ValueError``
    naming the call, the value and what to use instead (``hint`` adds to it), not torch's "Found no
    NVIDIA driver on your system" from deep inside the build."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{where}(device={str(device)!r}): this machine has no CUDA GPU; use device=\"cpu\"{hint}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{where}(device={str(device)!r}): this machine has {torch.cuda.device_count()} "
                         "CUDA device(s); use device=\"cuda\"")
    return dev


def build_model(
    preset: str | Preset = "tiny",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    text_layers: int | str | None = None,
    attn_implementation: str = "sdpa",
):
    """A transformers LFM2-VL model with seeded random weights and the preset's shapes.

    Random weights are fine for timing and for parity checks: every kernel sees the real shapes.
    A CUDA ``device`` on a machine without one is a ``ValueError`` (:func:`check_device`).
    """
    from transformers import Lfm2VlForConditionalGeneration

    cfg = build_config(preset, text_layers)
    check_device(device, hint=" and the \"tiny\" preset there (it builds in seconds)")
    cfg._attn_implementation = attn_implementation
    cfg.vision_config._attn_implementation = attn_implementation
    cfg.text_config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    # Construct (and randomly initialise) directly on the target device: a full-depth 1.6B model
    # takes tens of seconds to initialise on the CPU. Seeded draws are reproducible per device type.
    # (After a failed graph capture the device's random generator needs resetting first; the graph
    # manager does that itself: capture.recover_from_failed_capture.)
    with torch.device(device):
        model = Lfm2VlForConditionalGeneration(cfg)
    model.lab_preset = as_preset(preset)  # remembered so helpers can find processor settings
    model.lab_processor = make_processor(model.lab_preset)  # what the encoder reads its limits from
    return model.to(device=device, dtype=dtype).eval()


def mlp_width(text_config) -> int:
    """The width of the MLP transformers builds from an LFM2 text config: with
    ``block_auto_adjust_ff_dim`` on it is not ``intermediate_size`` (2/3 of it, rounded up to
    ``block_multiple_of``). Read off transformers' own ``Lfm2MLP``, built on the meta device."""
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    with torch.device("meta"):
        return Lfm2MLP(text_config).w1.out_features


def _shape_signature(cfg) -> tuple:
    """The numbers that make two LFM2-VL configs the same model shape for the vision path (text
    depth and vocabulary left out: presets build a text stub). The text MLP width tells apart
    presets whose vision path is the same (LFM2-VL-1.6B and LFM2-VL-3B)."""
    v = cfg.vision_config
    return (
        v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads, v.patch_size,
        v.num_patches, cfg.projector_hidden_size, bool(cfg.projector_use_layernorm), cfg.downsample_factor,
        cfg.text_config.hidden_size, mlp_width(cfg.text_config),
    )


def match_preset(cfg) -> Preset | None:
    """The shipped preset whose vision, projector and text shapes equal ``cfg``'s, or None."""
    sig = _shape_signature(cfg)
    for name in available_presets():
        if _shape_signature(build_config(name)) == sig:
            return Preset.from_name(name)
    return None


class CheckpointError(ValueError):
    """A folder the kit cannot load as an LFM2-VL checkpoint, said in one line that names it.
    ``python -m lfm2vl_lab`` reports it as a usage error: one ``error:`` line, exit status 2."""


# transformers reads an image processor's settings from either file: the classic one, or the
# newer combined processor file (its "image_processor" entry).
def make_processor(preset: str | Preset):
    """transformers' ``Lfm2VlImageProcessor`` with the preset's settings."""
    from transformers import Lfm2VlImageProcessor

    p = as_preset(preset).processor
    return Lfm2VlImageProcessor(
        downsample_factor=p["downsample_factor"],
        encoder_patch_size=p["patch_size"],
        tile_size=p["tile_size"],
        min_tiles=p["min_tiles"],
        max_tiles=p["max_tiles"],
        use_thumbnail=p["use_thumbnail"],
        min_image_tokens=p["min_image_tokens"],
        max_image_tokens=p["max_image_tokens"],
        max_pixels_tolerance=p["max_pixels_tolerance"],
        image_mean=p["image_mean"],
        image_std=p["image_std"],
    )


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def _folder_processor(folder: Path, cfg):
    """The folder's own ``Lfm2VlImageProcessor``, or None when it ships none; checked against the
    model's patch size and downsample factor, which the processor must share."""
    from transformers import Lfm2VlImageProcessor

    if not any((folder / f).exists() for f in PROCESSOR_FILES):
        return None
    try:
        proc = Lfm2VlImageProcessor.from_pretrained(folder, local_files_only=True)
    except OSError:  # a processor_config.json without an image_processor entry
        return None
    for what, ours, model_value in (("patch size", proc.encoder_patch_size, cfg.vision_config.patch_size),
                                    ("downsample factor", proc.downsample_factor, cfg.downsample_factor)):
        if ours != model_value:
            raise CheckpointError(f"{str(folder)!r}: the image processor's {what} is {ours} "
                             f"but the model's is {model_value}")
    return proc


# A folder holds a tokenizer when it ships either file (transformers reads both).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHECKPOINT_ENV = "LFM2VL_CHECKPOINT"  # the folder of a real checkpoint, set by the user: checkpoint_from_env


def checkpoint_problem(folder: Path) -> str | None:
    """What keeps ``folder`` from being an LFM2-VL checkpoint, in a few words (None: it looks like one,
    a folder whose config.json says ``lfm2_vl``). Reads only that file: no transformers, no weights."""
    if not folder.is_dir():
        return "is not a folder"
    if not (folder / "config.json").is_file():
        return "has no config.json (not a transformers checkpoint)"
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return "has a config.json that is no JSON object"
    return None if model_type == "lfm2_vl" else f"holds a {model_type!r} checkpoint, not an LFM2-VL one"


def checkpoint_info(folder: Path) -> dict:
    """How a result names a checkpoint: the folder's name and the sha256 of its config.json (never
    the path, which says nothing about the weights and names the user's machine)."""
    import hashlib

    return {"name": folder.name, "config_sha256": hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()}


def _folder_chat_processor(folder: Path, image_processor):
    """The folder's ``Lfm2VlProcessor`` (tokenizer, chat template, image processor), or None when it
    ships no tokenizer. Without an image processor file, ``image_processor`` (a preset's) stands in."""
    from transformers import AutoTokenizer, Lfm2VlProcessor

    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        return None
    try:
        if any((folder / f).exists() for f in PROCESSOR_FILES):
            return Lfm2VlProcessor.from_pretrained(folder, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return Lfm2VlProcessor(image_processor=image_processor, tokenizer=tok, chat_template=tok.chat_template)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{str(folder)!r}: its tokenizer files do not load ({first})") from exc


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16, device="cpu"):
    """Load a real LFM2-VL checkpoint from a local folder (never from a hub; ``~`` is expanded).

    The model knows its image processor, so ``process_images(images, model)`` and the graph budgets
    use the checkpoint's own settings: ``model.lab_processor`` is the folder's ``Lfm2VlImageProcessor``
    (from preprocessor_config.json) when it ships one. ``model.lab_preset`` is set when a shipped
    preset has the model's shapes; with no processor file, that preset's processor is used (with a
    warning). With neither, a warning says images cannot be processed for this model.

    ``model.lab_chat_processor`` is the folder's ``Lfm2VlProcessor`` (tokenizer and chat template,
    for :func:`~lfm2vl_lab.serving.chat.chat`), None when the folder has no tokenizer; ``model.lab_checkpoint`` names
    the folder for result files (:func:`checkpoint_info`).
    """
    from transformers import AutoConfig, Lfm2VlForConditionalGeneration

    check_device(device, "load_model")
    folder = Path(path).expanduser()
    problem = checkpoint_problem(folder)
    if problem is not None:
        never = " (load_model reads local folders only, it never downloads)" if not folder.is_dir() else ""
        raise CheckpointError(f"checkpoint folder {str(folder)!r} {problem}{never}")
    cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    processor = _folder_processor(folder, cfg)
    preset = match_preset(cfg)
    if processor is None:
        if preset is not None:
            warnings.warn(f"{str(folder)!r} has no preprocessor_config.json; using the image processor settings of "
                          f"the preset {preset.name!r}, whose shapes match the model", stacklevel=2)
        else:
            warnings.warn(f"{str(folder)!r} has no preprocessor_config.json and no preset matches its shapes: "
                          "process_images cannot prepare images for this model; set model.lab_processor to "
                          "its Lfm2VlImageProcessor", stacklevel=2)
    if processor is None and preset is not None:
            processor = make_processor(preset)
    chat_processor = _folder_chat_processor(folder, processor)
    model = Lfm2VlForConditionalGeneration.from_pretrained(
        folder, local_files_only=True, dtype=dtype, attn_implementation="sdpa"
    )
    model.lab_processor = processor
    model.lab_chat_processor = chat_processor
    model.lab_checkpoint = checkpoint_info(folder)
    if preset is not None:
        model.lab_preset = preset
    return model.to(device).eval()


UNSET_HINT = "set it to the folder you fetched the checkpoint into, or unset it to use the random-weight presets"


def checkpoint_from_env() -> Path | None:
    """The checkpoint folder ``LFM2VL_CHECKPOINT`` names (``~`` expanded), or None when it is unset or
    empty. A value that names no LFM2-VL checkpoint (:func:`checkpoint_problem`) is a one-line
    :class:`CheckpointError` naming the value."""
    value = os.environ.get(CHECKPOINT_ENV, "").strip()
    if not value:
        return None
    folder = Path(value).expanduser()
    problem = checkpoint_problem(folder)
    if problem is not None:
        raise CheckpointError(f"{CHECKPOINT_ENV}={value!r} {problem}; {UNSET_HINT}")
    return folder


def model_for(preset: str | Preset, dtype: torch.dtype = torch.float32, device="cpu", **build_kw):
    """The model the notebooks and the benchmark run: the checkpoint ``LFM2VL_CHECKPOINT`` names when
    it is set (:func:`load_model`: real weights, full depth), else ``build_model(preset, ...)`` with
    ``build_kw`` (seed, text_layers, ...). A folder that does not load is a one-line
    :class:`CheckpointError` naming the variable."""
    folder = checkpoint_from_env()
    if folder is None:
        return build_model(preset, dtype=dtype, device=device, **build_kw)
    try:
        return load_model(folder, dtype=dtype, device=device)
    except CheckpointError as exc:  # its processor or tokenizer: say where the folder came from
        raise CheckpointError(f"{CHECKPOINT_ENV}: {exc}; {UNSET_HINT}") from None


def count_params(model) -> dict[str, int]:
    """Parameter counts of the vision tower, projector and text model."""
    m = model.model

    def count(mod) -> int:
        return sum(p.numel() for p in mod.parameters())

    return {
        "vision": count(m.vision_tower),
        "projector": count(m.multi_modal_projector),
        "text": count(m.language_model),
    }
