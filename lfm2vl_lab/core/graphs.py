"""``GraphedEncoder``: LFM2-VL's vision encoder with CUDA-graph capture and replay, in one object.

It is the generic :class:`~.manager.EncoderGraphManager` given LFM2-VL's side of the protocol
(:class:`~.lfm2vl.Lfm2VlGraphModel`) and a config built from the model's own limits, plus the two
things a transformers user wants: encoding images directly, and plugging the graphs into
``forward``/``generate``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from .capture import capture_graph
from .config import DEFAULT_MAX_BUDGET, EncoderGraphConfig
from .encoder import FUSE_ELEMENTWISE, FUSE_QKV, PackedVisionEncoder
from .hf import installed
from .inputs import image_limits, process_images
from .lfm2vl import STAGED, Lfm2VlGraphModel
from .manager import EncoderGraphManager, plan_batches, plan_stats

__all__ = ["DENSE_GRAPHS", "MAX_RUN_ITEMS", "GraphedEncoder", "plan_batches", "plan_stats"]

# Dense graphs (see GraphedEncoder) are on unless a caller turns them off. Their one-item case, the
# single-item graphs of earlier runs, made one 512 px or 256 px image faster on the H200 at the same
# parity (data/results/nvidia-h200/single-item-*.json); dense-*.json measures the rest.
DENSE_GRAPHS = True
# The most 512 px images or tiles one replay carries: 8 (a 2048-token run budget), so 8 tiles run as
# one replay with large GEMMs and 16 as two, instead of 2 or 4 replays of the largest regular budget
# (1024 tokens). Why not 16: on the H200 a 16-item run budget made the 450M graphs hold 1005 MiB and
# the 1.6B ones 1663 MiB, captured in 3.03 s (floor-*-20261201-*.json), against the 1 GiB and 3 s
# the kit allows itself, for 3% at 16x512 (7.03 ms in one replay; 8x512 took 3.64).
MAX_RUN_ITEMS = 8


class GraphedEncoder(EncoderGraphManager):
    """LFM2-VL's vision encoder with CUDA-graph capture and replay.

    >>> genc = GraphedEncoder(model)            # budgets from the preset: [64, 128, 256, 512, 1024]
    >>> genc.capture()                          # one graph per budget, one shared memory pool
    >>> feats = genc.encode(processor_output)   # or genc.encode_images([pil, ...])

    ``encode`` returns per-item embeddings in input order, like transformers' ``get_image_features``.
    Without CUDA, ``encode`` runs the packed eager path (and says so once); ``capture`` raises
    (unless ``record`` is :func:`~.capture.eager_stand_in`, which replays without graphs).

    Config: ``budgets`` (default: doubling from the processor's smallest item up to ``max_budget``),
    ``max_items``, ``cu_seqlens_rule`` (``"safe"`` or vLLM's ``"repeat_last"``), ``max_seqlen_mode``
    (:class:`~.config.EncoderGraphConfig` explains each). Encoder: ``attention`` backend, ``fuse_qkv`` and
    ``fuse_elementwise`` (:class:`~.encoder.PackedVisionEncoder`), and ``body``, the callable to capture
    instead of the packed encoder (the benchmark's fused mode
    passes an inductor-compiled copy).

    ``dense_graphs`` (on by default): each budget also captures graphs that run batched dense
    attention (cuDNN first) over the full-length items a batch starts with (:mod:`~.lfm2vl` lists the
    variants); a replay picks one from the patch grids on the host. With them, ``max_run_items``
    (default 8, 0: off) full-length items may share one replay in an extra *run budget* that holds
    only such runs and computes only their rows. ``check_finite=True`` makes ``encode`` refuse pixel
    values holding NaN or Inf with an error naming the items (off by default: on device input it
    costs one device sync per call). ``stage_rows`` (default: on when the model is on CUDA):
    processor output on the host is uploaded as only its real rows, in the model's dtype, through
    a reused pinned buffer and without a sync (:mod:`~.staging`); ``False`` uploads the padded
    float32 tensor as it is, the path before staging.
    """

    def __init__(self, model, budgets=None, max_items=None, cu_seqlens_rule: str = "safe",
                 max_seqlen_mode: str = "tight", attention: str = "auto", max_budget: int | None = None,
                 body=None, meta_cache_size: int = 256, fuse_qkv: bool = FUSE_QKV,
                 fuse_elementwise: bool = FUSE_ELEMENTWISE,
                 dense_graphs: bool = DENSE_GRAPHS, max_run_items: int = MAX_RUN_ITEMS, check_finite: bool = False,
                 record=capture_graph, stage_rows: bool | None = None):
        self.model = model
        self.encoder = PackedVisionEncoder(model, attention=attention, fuse_qkv=fuse_qkv,
                                           fuse_elementwise=fuse_elementwise)
        config = EncoderGraphConfig.build(
            out_hidden_size=self.encoder.out_hidden_size, budgets=budgets, max_items=max_items,
            # the smallest item the model's processor makes: a preset's, or a loaded checkpoint's own
            min_tokens=image_limits(model).min_image_tokens,
            max_tokens=max_budget if max_budget is not None else DEFAULT_MAX_BUDGET,
            max_num_patches=self.encoder.max_num_patches, factor=self.encoder.factor,
            cu_seqlens_rule=cu_seqlens_rule, max_seqlen_mode=max_seqlen_mode,
            # runs need dense graphs: the run budget has no varlen graph
            max_run_items=max_run_items if dense_graphs and body is None else 0,
        )
        adapter = Lfm2VlGraphModel(self.encoder, config, body=body, dense_graphs=dense_graphs,
                                   check_finite=check_finite, meta_cache_size=meta_cache_size,
                                   stage_rows=stage_rows)
        super().__init__(adapter, record=record)
        self.warned = False

    @property
    def device(self):
        return self.encoder.device

    def encode(self, inputs) -> list:
        """Processor output (or a list of images) → per-item embeddings in input order."""
        if not isinstance(inputs, Mapping):  # a dict, or transformers' BatchFeature (the processor's own return)
            return self.encode_images(inputs)
        if not self.captured and self.device.type != "cuda" and not self.warned:
            self.warned = True  # once per encoder: a notebook loop should not print it every call
            warnings.warn("GraphedEncoder: no CUDA device, so encode() runs the packed eager encoder (no graphs)",
                          stacklevel=2)
        return super().encode(inputs)

    def encode_images(self, images) -> list:
        """Images (anything ``process_images`` takes) → per-item embeddings, through the processor
        the model carries (its preset's, or a loaded checkpoint's own)."""
        return self.encode(process_images(images, self.model))

    def stage(self, inputs: dict) -> dict:
        """The processor's output on this encoder's device, the way ``encode`` reads it: only the
        real rows, in the model's dtype, queued from pinned memory (see :mod:`~.staging`). This is
        what an engine uploads before the encoder runs (the pipeline's ``h2d`` phase); ``encode``
        takes the returned dict as it is and does no second upload."""
        return {STAGED: self.adapter.read_items(inputs)}

    def installed(self, model=None):
        """Within the block, ``model`` (default: the one this encoder wraps) computes its image
        features — in ``forward`` and so in ``generate`` — with this graphed encoder."""
        return installed(model if model is not None else self.model, self.encode)
