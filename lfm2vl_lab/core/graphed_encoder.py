"""``GraphedEncoder``: LFM2-VL's vision encoder with CUDA-graph capture and replay, in one object.

It holds the generic :class:`~.manager.EncoderGraphManager`, given LFM2-VL's side of the protocol
(:class:`~.lfm2vl.Lfm2VlGraphModel`, or :class:`~.dense.DenseLfm2VlGraphModel` with the dense graphs
on) and a config derived from the model's own limits and one :class:`~.config.GraphOptions`; and
adds what a transformers user wants: a check of the inputs, host staging, and plugging the graphs
into ``forward``/``generate``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from contextlib import contextmanager

from .capture import WARMUP_ITERS, capture_graph
from .config import EncoderGraphConfig, GraphOptions
from .dense import DenseGraphConfig, DenseLfm2VlGraphModel
from .encoder import PackedVisionEncoder
from .lfm2vl import Lfm2VlGraphModel
from .manager import EncoderGraphManager
from .packing import model_limits
from .staging import PixelItems


class GraphedEncoder:
    """LFM2-VL's vision encoder with CUDA-graph capture and replay.

    >>> genc = GraphedEncoder(model)            # budgets from the processor: [64, 128, 256, 512, 1024]
    >>> genc.capture()                          # one graph per budget, one shared memory pool
    >>> feats = genc.encode(processor_output)   # per-item embeddings, in input order

    ``options`` (:class:`~.config.GraphOptions`, which names and explains every setting), changed by
    any keyword: ``GraphedEncoder(model, budgets=[64, 256])``. ``body``: the callable to capture
    instead of the packed encoder (the benchmark's fused mode passes an inductor-compiled copy, whose
    attention is baked in, so it gets only varlen graphs). ``record``: how one graph is recorded
    (:func:`~.capture.eager_stand_in` replays without graphs, on a CPU).

    ``encode`` returns per-item embeddings in input order, like transformers' ``get_image_features``.
    Without CUDA, ``encode`` runs the packed eager path (and says so once); ``capture`` raises
    (unless ``record`` is :func:`~.capture.eager_stand_in`). The graphs themselves are the
    ``manager``'s; ``adapter`` (LFM2-VL's side), ``config``, ``graphs``, ``stats`` and the rest read
    through to it.
    """

    def __init__(self, model, options: GraphOptions | None = None, *, body=None, record=capture_graph, **changes):
        self.options = opts = (options if options is not None else GraphOptions()).with_(**changes)
        self.model = model
        self.encoder = PackedVisionEncoder(model, attention=opts.attention, fuse_qkv=opts.fuse_qkv,
                                           fuse_elementwise=opts.fuse_elementwise)
        dense = opts.dense_graphs and body is None  # a compiled body bakes its attention in
        config = (DenseGraphConfig if dense else EncoderGraphConfig).from_options(
            opts, self.encoder.out_hidden_size, max_num_patches=self.encoder.max_num_patches,
            factor=self.encoder.factor,
            # the smallest item the model's processor makes: a preset's, or a loaded checkpoint's own
            min_item_tokens=model_limits(model).min_item_tokens)
        kind = DenseLfm2VlGraphModel if dense else Lfm2VlGraphModel
        self.manager = EncoderGraphManager(kind(self.encoder, config, opts, body=body), record=record)
        self.warned = False

    # -- what the manager holds ----------------------------------------------------------------------
    @property
    def adapter(self) -> Lfm2VlGraphModel:
        """LFM2-VL's side of the protocol (the manager's model)."""
        return self.manager.adapter

    @property
    def config(self) -> EncoderGraphConfig:
        return self.manager.config

    @property
    def record(self):
        """How one graph is recorded (:func:`~.capture.capture_graph`, or a stand-in)."""
        return self.manager.record

    @record.setter
    def record(self, fn) -> None:
        self.manager.record = fn

    @property
    def graphs(self) -> dict:
        return self.manager.graphs

    @property
    def pool(self):
        return self.manager.pool

    @property
    def stamp(self):
        return self.manager.stamp

    @property
    def stats(self):
        return self.manager.stats

    @property
    def serial(self):
        return self.manager.serial

    @property
    def graph_device(self):
        return self.manager.graph_device

    @property
    def captured(self) -> bool:
        return self.manager.captured

    @property
    def device(self):
        return self.encoder.device

    def capture(self, hook=None, warmup_iters: int = WARMUP_ITERS) -> list[dict]:
        """Capture every budget's graphs (:meth:`~.manager.EncoderGraphManager.capture`)."""
        return self.manager.capture(hook, warmup_iters)

    def capture_info(self) -> list[dict]:
        return self.manager.capture_info()

    def reset_stats(self) -> None:
        self.manager.reset_stats()

    # -- what a transformers user calls -------------------------------------------------------------
    def encode(self, inputs) -> list:
        """Processor output (or what :meth:`stage` returned) → per-item embeddings in input order."""
        if not isinstance(inputs, (Mapping, PixelItems)):
            raise TypeError(f"encode() takes the image processor's output (a dict), got {type(inputs).__name__}; "
                            "for images, lfm2vl_lab.process_images(images, model) makes it")
        if not self.captured and self.device.type != "cuda" and not self.warned:
            self.warned = True  # once per encoder: a notebook loop should not print it every call
            warnings.warn("GraphedEncoder: no CUDA device, so encode() runs the packed eager encoder (no graphs)",
                          stacklevel=2)
        return self.manager.encode(inputs)

    def stage(self, inputs: dict) -> PixelItems:
        """The processor's output on this encoder's device, the way ``encode`` reads it: only the
        real rows, in the model's dtype, queued from pinned memory (see :mod:`~.staging`). This is
        what an engine uploads before the encoder runs (the pipeline's ``h2d`` phase); ``encode``
        takes the result as it is and does no second upload. Under the encoder's lock, as
        ``encode`` is: the pinned staging buffers take turns (:mod:`~.serial`)."""
        with self.serial.hold(self.graph_device):
            return self.adapter.read_items(inputs)[0]

    def installed(self, model=None):
        """Within the block, ``model`` (default: the one this encoder wraps) computes its image
        features — in ``forward`` and so in ``generate`` — with this graphed encoder."""
        return installed(model if model is not None else self.model, self.encode)


def image_features_fn(encode):
    """A drop-in for ``Lfm2VlModel.get_image_features`` that computes the features with ``encode``
    (processor-output dict → per-item embeddings), e.g. a ``GraphedEncoder``'s."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def get_image_features(pixel_values, spatial_shapes, pixel_attention_mask=None, **kwargs):
        feats = encode({"pixel_values": pixel_values, "spatial_shapes": spatial_shapes.cpu(),
                        "pixel_attention_mask": pixel_attention_mask})
        return BaseModelOutputWithPooling(last_hidden_state=None, pooler_output=feats)

    return get_image_features


@contextmanager
def installed(model, encode):
    """Within the block, ``model`` computes its image features — in ``forward`` and so in
    ``generate`` — with ``encode``. Nesting-safe: the previous override (if any) comes back after."""
    inner = getattr(model, "model", model)
    prev = inner.__dict__.get("get_image_features")  # an earlier override, if any (nesting)
    inner.get_image_features = image_features_fn(encode)
    try:
        yield model
    finally:
        if prev is None:
            del inner.get_image_features  # back to the class's own method
        else:
            inner.get_image_features = prev
