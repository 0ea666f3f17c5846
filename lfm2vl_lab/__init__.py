"""lfm2vl-lab: encoder CUDA graphs for LiquidAI's LFM2-VL, taught, implemented and measured.

Seven packages, the technique first:

* :mod:`lfm2vl_lab.core` — the technique: packing, the packed encoder, the graph config and padding
  logics, capture, the weight guard, the generic manager, LFM2-VL's side of it and ``GraphedEncoder``;
* :mod:`lfm2vl_lab.kernels` — the attention backends and fused elementwise kernels the encoder calls;
* :mod:`lfm2vl_lab.model` — presets and checkpoints, image inputs, transformers' reference path, parity;
* :mod:`lfm2vl_lab.serving` — the text model on static buffers (``TextEngine``), a request in phases
  (``VlmPipeline``), a chat turn (``chat``);
* the instrument, in three: :mod:`lfm2vl_lab.measure` (timing, workloads, the benchmark, profiling,
  check, e2e, ttft, vLLM, results and the reference run), :mod:`lfm2vl_lab.report` (the reference set
  as DataFrames, the pages' tables, the figures, the notebooks' helpers) and :mod:`lfm2vl_lab.cli`
  (``python -m lfm2vl_lab``).

The first four use torch and transformers only and never import the instrument
(``tests/test_layers.py`` checks which package may import which). The names below are the public
API; the instrument's modules are also reachable as ``lfm2vl_lab.bench``, ``lfm2vl_lab.e2e`` …, and
its workload helpers as ``lfm2vl_lab.load_sample_images`` … The helpers a learner calls to measure
(``from lfm2vl_lab.measure import time_calls``) and to read the recorded set (``from lfm2vl_lab.report
import load_recorded``) are public there, in the same lazy way. Every name loads on first use:
``import lfm2vl_lab`` imports no torch and no module of the instrument.
"""

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING

# The public API, by module. Each name loads on first use (``lab.GraphedEncoder`` imports
# lfm2vl_lab.core.graphed_encoder then), so ``import lfm2vl_lab``, and with it the command line's
# ``--help``, imports no torch. The same names under TYPE_CHECKING below are what type checkers and
# the API reference read; tests/test_cli_lazy.py keeps the two lists equal.
API = {
    "core.capture": ("capture_graph", "eager_stand_in", "recover_from_failed_capture"),
    "core.config": ("EncoderGraphConfig", "GraphOptions", "auto_budgets", "auto_max_items",
                    "pad_cu_seqlens_repeat_last"),
    "core.dense": ("DenseGraphConfig",),
    "core.encoder": ("PackedVisionEncoder", "SplitProjector"),
    "core.graphed_encoder": ("GraphedEncoder",),
    "core.packing": ("PackedBatch", "lfm2vl_local_gather_idx", "pack_inputs", "tokens_for"),
    "core.plan": ("plan_batches", "plan_config", "plan_stats"),
    "core.protocol": ("EncoderGraphModel", "pad_default", "protocol_members"),
    "core.ptrcheck": ("build_pointer_check",),
    "model.hf": ("hf_image_features",),
    "model.inputs": ("image_limits", "item_image", "process_images", "processor_for", "to_rgb"),
    "model.parity": ("float32_reference", "judge_replay", "lowp_parity", "max_rel_error", "rel_error"),
    "model.presets": ("Preset", "available_presets", "build_model", "checkpoint_from_env", "count_params",
                      "load_model", "model_for"),
    "serving.cache": ("bucket_len",),
    "serving.chat": ("ChatReply", "chat"),
    "serving.engine": ("TextEngine",),
    "serving.pipeline": ("VlmPipeline",),
}
API_NAMES = {name: module for module, names in API.items() for name in names}

if TYPE_CHECKING:
    from .core.capture import capture_graph, eager_stand_in, recover_from_failed_capture
    from .core.config import (
        EncoderGraphConfig,
        GraphOptions,
        auto_budgets,
        auto_max_items,
        pad_cu_seqlens_repeat_last,
    )
    from .core.dense import DenseGraphConfig
    from .core.encoder import PackedVisionEncoder, SplitProjector
    from .core.graphed_encoder import GraphedEncoder
    from .core.packing import PackedBatch, lfm2vl_local_gather_idx, pack_inputs, tokens_for
    from .core.plan import plan_batches, plan_config, plan_stats
    from .core.protocol import EncoderGraphModel, pad_default, protocol_members
    from .core.ptrcheck import build_pointer_check
    from .model.hf import hf_image_features
    from .model.inputs import image_limits, item_image, process_images, processor_for, to_rgb
    from .model.parity import float32_reference, judge_replay, lowp_parity, max_rel_error, rel_error
    from .model.presets import (
        Preset,
        available_presets,
        build_model,
        checkpoint_from_env,
        count_params,
        load_model,
        model_for,
    )
    from .serving.cache import bucket_len
    from .serving.chat import ChatReply, chat
    from .serving.engine import TextEngine
    from .serving.pipeline import VlmPipeline

__version__ = "0.1.0"

__all__ = [
    "auto_budgets", "auto_max_items", "available_presets", "bucket_len", "build_model", "build_pointer_check",
    "capture_graph", "chat", "ChatReply", "checkpoint_from_env", "count_params", "DenseGraphConfig", "eager_stand_in",
    "EncoderGraphConfig", "EncoderGraphModel", "float32_reference", "GraphedEncoder", "GraphOptions",
    "hf_image_features", "image_limits", "item_image", "judge_replay", "lfm2vl_local_gather_idx", "load_model",
    "load_sample_images", "lowp_parity", "max_rel_error", "model_for", "pack_inputs", "PackedBatch",
    "PackedVisionEncoder", "pad_cu_seqlens_repeat_last", "pad_default", "plan_batches", "plan_config", "plan_stats",
    "Preset", "process_images", "processor_for", "protocol_members", "random_processor_output",
    "recover_from_failed_capture", "rel_error", "SplitProjector", "synthetic_image", "synthetic_workload",
    "TextEngine", "to_rgb", "tokens_for", "VlmPipeline",
]

# every module of the instrument, read off its folders (importing none of them): name -> package
INSTRUMENT = ("measure", "report", "cli")
TOOL_MODULES = {m.name: pkg for pkg in INSTRUMENT
                for m in pkgutil.iter_modules([str(Path(__file__).parent / pkg)])}
# public names that live in the instrument: name -> its module (loaded on first use)
TOOL_NAMES = {"load_sample_images": "measure.workloads", "random_processor_output": "measure.workloads",
              "synthetic_image": "measure.workloads", "synthetic_workload": "measure.workloads"}


def __getattr__(name: str):
    """``lab.GraphedEncoder`` loads ``lfm2vl_lab.core.graphed_encoder`` (:data:`API`); ``from lfm2vl_lab
    import e2e`` (the README's GPU tour) loads ``lfm2vl_lab.measure.e2e``; ``lfm2vl_lab.load_sample_images``
    loads ``lfm2vl_lab.measure.workloads``."""
    if name in API_NAMES:
        value = getattr(importlib.import_module(f".{API_NAMES[name]}", __name__), name)
        globals()[name] = value  # the next lookup finds it without this function
        return value
    if name in TOOL_NAMES:
        return getattr(importlib.import_module(f".{TOOL_NAMES[name]}", __name__), name)
    if name in TOOL_MODULES:
        return importlib.import_module(f".{TOOL_MODULES[name]}.{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API_NAMES, *TOOL_NAMES, *TOOL_MODULES})
