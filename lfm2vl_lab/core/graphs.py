"""``GraphedEncoder``: LFM2-VL's vision encoder with CUDA-graph capture and replay, in one object.

It is the generic :class:`~.manager.EncoderGraphManager` given LFM2-VL's side of the protocol
(:class:`~.lfm2vl.Lfm2VlGraphModel`) and a config built from the model's own limits, plus the two
things a transformers user wants: encoding images directly, and plugging the graphs into
``forward``/``generate``.
"""

from __future__ import annotations

import warnings

from .capture import capture_graph
from .config import DEFAULT_MAX_BUDGET, EncoderGraphConfig
from .encoder import PackedVisionEncoder
from .hf import installed
from .inputs import image_limits, process_images
from .lfm2vl import Lfm2VlGraphModel
from .manager import EncoderGraphManager, plan_batches, plan_stats

__all__ = ["SINGLE_ITEM_GRAPHS", "GraphedEncoder", "plan_batches", "plan_stats"]

# Single-item graphs (see GraphedEncoder) are on unless a caller turns them off: on the H200 they
# made one 512 px or 256 px image faster at the same parity (data/results/nvidia-h200/single-item-*.json).
SINGLE_ITEM_GRAPHS = True


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
    (:class:`~.config.EncoderGraphConfig` explains each). Encoder: ``attention`` backend, ``fuse_qkv``,
    and ``body``, the callable to capture instead of the packed encoder (the benchmark's fused mode
    passes an inductor-compiled copy).

    ``single_item_graphs`` (on by default): for each budget whose rows one item can fill (64, 128 and
    256 tokens by default) a second graph on the same buffers runs dense SDPA instead of varlen
    attention; a replay of exactly one item that fills the budget (a 512 px or 256 px image alone)
    uses it. ``check_finite=True`` makes ``encode`` refuse pixel values holding NaN or Inf with an
    error naming the items (off by default: it costs one device sync per call).
    """

    def __init__(self, model, budgets=None, max_items=None, cu_seqlens_rule: str = "safe",
                 max_seqlen_mode: str = "tight", attention: str = "auto", max_budget: int | None = None,
                 body=None, meta_cache_size: int = 256, fuse_qkv: bool = False,
                 single_item_graphs: bool = SINGLE_ITEM_GRAPHS, check_finite: bool = False, record=capture_graph):
        self.model = model
        self.encoder = PackedVisionEncoder(model, attention=attention, fuse_qkv=fuse_qkv)
        config = EncoderGraphConfig.build(
            out_hidden_size=self.encoder.out_hidden_size, budgets=budgets, max_items=max_items,
            # the smallest item the model's processor makes: a preset's, or a loaded checkpoint's own
            min_tokens=image_limits(model).min_image_tokens,
            max_tokens=max_budget if max_budget is not None else DEFAULT_MAX_BUDGET,
            max_num_patches=self.encoder.max_num_patches, factor=self.encoder.factor,
            cu_seqlens_rule=cu_seqlens_rule, max_seqlen_mode=max_seqlen_mode,
        )
        adapter = Lfm2VlGraphModel(self.encoder, config, body=body, single_item_graphs=single_item_graphs,
                                   check_finite=check_finite, meta_cache_size=meta_cache_size)
        super().__init__(adapter, record=record)
        self.warned = False

    @property
    def device(self):
        return self.encoder.device

    def encode(self, inputs) -> list:
        """Processor output (or a list of images) → per-item embeddings in input order."""
        if not isinstance(inputs, dict):
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

    def installed(self, model=None):
        """Within the block, ``model`` (default: the one this encoder wraps) computes its image
        features — in ``forward`` and so in ``generate`` — with this graphed encoder."""
        return installed(model if model is not None else self.model, self.encode)
