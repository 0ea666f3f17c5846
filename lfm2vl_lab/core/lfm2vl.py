"""LFM2-VL's side of encoder graphs: the :class:`~.protocol.EncoderGraphModel` protocol implemented
for the packed vision encoder (what vLLM PR #44930 added to LFM2-VL as ``SupportsEncoderCudaGraph``),
and :class:`Variant`, the name of one graph on a budget's buffers.

Per budget B (output tokens), the graphs read the config's named buffers (``buffer_keys``):

* ``pixel_values`` [4B, 3·p·p]  the real patch rows of the batch, then zero rows
* ``pos_embeds``   [4B, C]      each item's resized position grid (computed eagerly, cached per shape)
* ``cu_seqlens``   int32 [cu_size]  the items' row offsets; under the safe rule dummy sequences
                                cover the padded rows; then the last offset repeated (vLLM's padding)
* ``gather_idx``   int32 [4B]   pixel-unshuffle as an index into the packed rows

``max_seqlen`` is baked into each budget's attention kernel at capture (the config says it), and
the manager writes the output rows into its own [B, text hidden] buffer. The body is
``PackedVisionEncoder.forward`` on these buffers. Per replay the model hands the manager a source
per buffer and the manager pads each into its buffer; the sources of a batch layout are built once
and kept (:class:`~.staging.LayoutCache`), and a replay of the grids a budget's buffers already
hold hands over only the pixel rows. :mod:`~.dense` adds graph variants on the same buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import EncoderGraphConfig, GraphOptions
from .encoder import PackedVisionEncoder, lfm2vl_parts
from .guard import WeightStamp
from .packing import (
    Shape,
    lfm2vl_check_shapes,
    lfm2vl_cu_seqlens,
    lfm2vl_gather_idx,
    lfm2vl_read_inputs,
    move_to,
    packed_batch,
    tokens_for,
)
from .protocol import EncoderGraphModel, Replay
from .staging import LayoutCache, PixelItems, RowStager, row_offsets


@dataclass(frozen=True, order=True)
class Variant:
    """One graph on a budget's buffers: ``dense`` full-length items through dense attention (0: none),
    then, with ``varlen``, a ragged rest through varlen attention over ``cu_seqlens``
    (:mod:`~.dense`). :attr:`name` is what stats and recorded files call it: ``varlen``,
    ``dense3``, ``dense3+varlen``."""

    dense: int = 0
    varlen: bool = True

    def __post_init__(self):
        if not isinstance(self.dense, int) or isinstance(self.dense, bool) or self.dense < 0 \
                or not (self.dense or self.varlen):
            raise ValueError(f"no graph variant has dense={self.dense!r}, varlen={self.varlen!r}")

    @property
    def name(self) -> str:
        return "varlen" if not self.dense else f"dense{self.dense}" + ("+varlen" if self.varlen else "")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> Variant:
        """``"varlen"``, ``"dense3"``, ``"dense3+varlen"`` → the variant (a ``ValueError`` otherwise)."""
        if name == "varlen":
            return cls()
        if isinstance(name, str) and name.startswith("dense"):
            k, _, rest = name[5:].partition("+")
            if k.isdigit() and int(k) > 0 and rest in ("", "varlen"):
                return cls(int(k), rest == "varlen")
        raise ValueError(f"unknown graph variant {name!r}: expected varlen, dense<k> or dense<k>+varlen")


VARLEN = Variant()  # every row through varlen attention: the seed's one graph per budget


def check_finite_items(pixel_values: torch.Tensor, shapes: list[Shape]) -> None:
    """Raise ``ValueError`` naming every item whose real patch rows hold NaN or Inf.

    Without it a NaN pixel silently becomes NaN embeddings (transformers' own path does the same).
    One reduction per item and a single read-back: on device input that costs one device sync per
    call; on host input (checked before staging) only a host pass over the real rows.
    """
    flags = torch.stack([torch.isfinite(pixel_values[i, : h * w]).all() for i, (h, w) in enumerate(shapes)]).tolist()
    bad = [i for i, ok in enumerate(flags) if not ok]
    if bad:
        raise ValueError(f"pixel_values of item(s) {bad} hold NaN or Inf (patch grids {[shapes[i] for i in bad]}); "
                         "encode() refused them (check_finite=True)")


def check_staged(items: PixelItems, patch_dim: int, device) -> PixelItems:
    """Items ``GraphedEncoder.stage`` made, checked for this encoder: rows of ``patch_dim`` values,
    on its device (``ValueError`` naming what differs)."""
    if items.pixel_values.shape[-1] != patch_dim or items.pixel_values.device != device:
        raise ValueError(f"staged items hold rows of {items.pixel_values.shape[-1]} values on "
                         f"{items.pixel_values.device}; this encoder takes rows of {patch_dim} on {device}")
    return items


class Lfm2VlGraphModel(EncoderGraphModel):
    """The packed LFM2-VL encoder behind the manager's protocol: one ``varlen`` graph per budget.

    ``body`` is the callable captured per budget (default: ``encoder`` itself; the benchmark's fused
    mode passes an inductor-compiled copy). Items are a :class:`~.staging.PixelItems` on the device.
    From ``options``: ``stage_rows`` (None: when the encoder is on CUDA) stages pixel values on the
    host through a :class:`~.staging.RowStager` (only the real rows, in the model's dtype, through
    pinned memory, without a sync) instead of uploading the processor's padded float32 tensor;
    ``check_finite``; ``layout_cache_size``.
    """

    def __init__(self, encoder: PackedVisionEncoder, config: EncoderGraphConfig, options: GraphOptions | None = None,
                 body=None):
        options = options if options is not None else GraphOptions()
        self.encoder, self.config = encoder, config
        self.body = body if body is not None else encoder
        self.stage_rows, self.check_finite, self.stager = options.stage_rows, options.check_finite, None
        self.layouts = LayoutCache(options.layout_cache_size)
        # Per budget, the patch grids whose position rows and layout are in its buffers now, and their
        # variant: a replay of the same grids (the common case: 512 px tiles) skips re-uploading both
        # and choosing the variant again.
        self.resident: dict[int, tuple] = {}

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.dtype

    def counters(self) -> dict:
        staging = {f"staging_{k}": v for k, v in self.stager.info().items()} if self.stager is not None else {}
        return {**{f"pos_cache_{k}": v for k, v in self.encoder.pos_cache.info().items()}, **staging,
                "layout_cache_hits": self.layouts.hits, "layout_cache_misses": self.layouts.misses}

    def weights(self) -> dict:
        """What the graphs read but do not own, as the model holds it now: the vision tower (the
        fused q/k/v weights the graphs read are what its q/k/v parameters view, so moving those moves
        these) and the projector."""
        vision, projector, _ = lfm2vl_parts(self.encoder.root)
        return {"vision_tower": vision, "projector": projector}

    def weight_stamp(self) -> WeightStamp:
        """:meth:`weights` stamped (re-read on the slow path), with the modules that hold them watched
        too: assigning a new vision tower or projector to them is a change as well."""
        root = self.encoder.root
        return WeightStamp(self.weights, [root] + ([root.model] if hasattr(root, "model") else []))

    def refresh(self) -> None:
        """Before every capture: the encoder's parts and what it derived from them, from the model as
        it is now (:meth:`~.encoder.PackedVisionEncoder.rebind`), and no grids held in old buffers."""
        self.encoder.rebind()
        self.resident.clear()

    # -- inputs ------------------------------------------------------------------------------------
    def _stager(self) -> RowStager | None:
        """The stager for host pixel values, or None when they are uploaded padded, as they are."""
        dev = self.device
        if not (self.stage_rows if self.stage_rows is not None else dev.type == "cuda"):
            return None
        if self.stager is None or self.stager.device != dev:
            self.stager = RowStager(dev)
        return self.stager

    def read_items(self, inputs) -> tuple[PixelItems, list[int]]:
        """Checked inputs (:func:`~.packing.lfm2vl_read_inputs`) as a :class:`~.staging.PixelItems`
        on the model's device, and each item's output tokens. Pixel values on the host are staged; on
        any other device they are copied to the model's (from a GPU to a CPU model that copy waits)."""
        if isinstance(inputs, PixelItems):  # already read and uploaded (GraphedEncoder.stage)
            items = check_staged(inputs, self.encoder.patch_dim, self.device)
        else:
            pv, shapes, _ = lfm2vl_read_inputs(inputs, self.encoder.patch_dim)
            lfm2vl_check_shapes(shapes, self.encoder.max_num_patches, self.config.factor)
            if self.check_finite:  # on the values as given: host input then costs no device sync
                check_finite_items(pv, shapes)
            stager = self._stager() if pv.device.type == "cpu" else None
            if stager is not None:
                items = PixelItems(stager.upload(pv, shapes, self.encoder.dtype), shapes, row_offsets(shapes))
            else:  # device-resident input stays as it is (views); the dtype is cast while filling the buffers
                items = PixelItems(move_to(pv, self.device), shapes)
        return items, [tokens_for(s, self.config.factor) for s in items.shapes]

    def forward_eager(self, items: PixelItems, batch: list[int]) -> torch.Tensor:
        rows = items.rows(batch)
        packed = packed_batch(rows[0] if len(rows) == 1 else torch.cat(rows), [items.shapes[i] for i in batch],
                              factor=self.config.factor, pos_cache=self.encoder.pos_cache, device=self.device)
        return self.encoder.forward_packed(packed)

    # -- capture -----------------------------------------------------------------------------------
    def capture_inputs(self, budget: int) -> dict[str, torch.Tensor]:
        """The budget's buffers, holding random (never zero) data and a layout valid for every
        variant captured on them: ``cu_seqlens`` covers only as many rows as the smallest varlen
        part gets, since FlashAttention reads every row ``cu_seqlens`` names, unchecked."""
        cfg, enc, dev = self.config, self.encoder, self.device
        rows, max_seqlen, cu_size = cfg.rows(budget), cfg.max_seqlen(budget), cfg.cu_size(budget)
        self.resident.pop(budget, None)
        gen = torch.Generator(device=dev).manual_seed(budget)
        varlen = self.dummy_varlen_rows(budget)
        offsets = list(range(0, varlen, max_seqlen)) + [varlen]
        cu = offsets[:cu_size] + [varlen] * (cu_size - len(offsets))
        pixel_values = torch.zeros(rows, enc.patch_dim, device=dev, dtype=enc.dtype)
        pos_embeds = torch.zeros(rows, enc.embed_dim, device=dev, dtype=enc.dtype)
        return {
            "pixel_values": pixel_values.uniform_(-1, 1, generator=gen),
            "pos_embeds": pos_embeds.normal_(0, 0.02, generator=gen),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=dev),
            "gather_idx": torch.arange(rows, dtype=torch.int32, device=dev),
        }

    def dummy_varlen_rows(self, budget: int) -> int:
        return self.config.rows(budget)

    def graph_variants(self, budget: int) -> tuple[Variant, ...]:
        return (VARLEN,)

    def forward_on_buffers(self, buffers: dict[str, torch.Tensor], budget: int, variant: Variant) -> torch.Tensor:
        return self.body(buffers["pixel_values"], buffers["pos_embeds"], buffers["cu_seqlens"],
                         self.config.max_seqlen(budget), buffers["gather_idx"])

    # -- replay ------------------------------------------------------------------------------------
    def fits(self, budget: int, shapes: tuple[Shape, ...]) -> bool:
        """The guard: a batch larger than the captured buffers must never reach a kernel."""
        cfg = self.config
        return (sum(tokens_for(s, cfg.factor) for s in shapes) <= budget
                and sum(h * w for h, w in shapes) <= cfg.rows(budget) and len(shapes) <= cfg.slots(budget)
                and max(h * w for h, w in shapes) <= cfg.max_seqlen(budget))

    def variant_for(self, budget: int, shapes: tuple[Shape, ...]) -> Variant:
        return VARLEN

    def computed_tokens(self, budget: int, variant: Variant) -> int:
        """Output rows one replay of ``variant`` computes: the whole budget for ``varlen``."""
        return budget

    def layout(self, budget: int, variant: Variant, shapes: tuple[Shape, ...]) -> dict[str, torch.Tensor]:
        """The host sources of ``cu_seqlens`` (with the safe rule's dummy sequences) and ``gather_idx``."""
        cfg = self.config
        return {"cu_seqlens": cfg.cu_seqlens_source(budget, lfm2vl_cu_seqlens(list(shapes))),
                "gather_idx": lfm2vl_gather_idx(list(shapes), cfg.factor).int()}

    def replay_buffers(self, items: PixelItems, batch: list[int], budget: int) -> Replay | None:
        """What the manager writes into the budget's buffers for items ``batch`` (None: they do not
        fit, and run eagerly): the pixel rows, and unless the buffers hold these grids already, the
        position rows and the layout."""
        shapes = tuple(items.shapes[i] for i in batch)
        if not self.fits(budget, shapes):
            return None
        sources = {"pixel_values": items.rows(batch)}
        key = (shapes, self.encoder.pos_cache.stamp())
        held = self.resident.get(budget)
        if held is not None and held[0] == key:  # the same grids again: their variant too
            variant = held[1]
        else:
            variant = self.variant_for(budget, shapes)
            sources["pos_embeds"] = [self.encoder.pos_cache.get(h, w) for h, w in shapes]
            sources.update(self.layouts.get((budget, variant, shapes), lambda: self.layout(budget, variant, shapes)))
            self.resident[budget] = (key, variant)
        return Replay(sources, variant, self.computed_tokens(budget, variant))
