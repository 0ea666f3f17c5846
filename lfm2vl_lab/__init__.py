"""lfm2vl-lab: encoder CUDA graphs for LiquidAI's LFM2-VL, taught, implemented and measured.

The whole path, one concept per module:

* :mod:`~lfm2vl_lab.presets`   — model shapes as data, random-weight models, local checkpoints
* :mod:`~lfm2vl_lab.inputs`    — the real image processor, sample photos, a seeded workload
* :mod:`~lfm2vl_lab.packing`   — processor output → packed varlen layout (cu_seqlens, gather_idx, …)
* :mod:`~lfm2vl_lab.encoder`   — the packed split-forward encoder on transformers' own weights
* :mod:`~lfm2vl_lab.budgets`   — graph config: budgets, item limit, padding logics
* :mod:`~lfm2vl_lab.graphs`    — capture/replay manager, ``GraphedEncoder``
"""

from .budgets import EncoderGraphConfig, auto_budgets
from .encoder import PackedVisionEncoder, SplitProjector, hf_image_features, max_rel_error, rel_error
from .graphs import GraphedEncoder, plan_batches, plan_stats, recover_from_failed_capture
from .inputs import (
    image_limits, item_image, load_sample_images, process_images, processor_for, random_processor_output, synthetic_image,
    synthetic_workload, to_rgb,
)
from .packing import PackedBatch, pack_inputs
from .presets import Preset, available_presets, build_model, count_params, load_model

__version__ = "0.1.0"

__all__ = [
    "EncoderGraphConfig", "GraphedEncoder", "PackedBatch", "PackedVisionEncoder", "Preset", "SplitProjector",
    "auto_budgets", "available_presets", "image_limits", "item_image", "plan_stats", "build_model", "count_params", "hf_image_features", "load_model",
    "load_sample_images", "max_rel_error", "pack_inputs", "plan_batches", "process_images", "processor_for",
    "random_processor_output", "recover_from_failed_capture", "rel_error", "synthetic_image", "synthetic_workload", "to_rgb",
]
