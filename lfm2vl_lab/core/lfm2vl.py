"""LFM2-VL's side of encoder graphs: the :class:`~.manager.EncoderGraphModel` protocol implemented
for the packed vision encoder (what vLLM PR #44930 added to LFM2-VL as ``SupportsEncoderCudaGraph``).

Per budget B (output tokens), the graphs read four persistent buffers:

* ``pixel_values`` [4B, 3·p·p]  the real patch rows of the batch, then zero rows
* ``pos_embeds``   [4B, C]      each item's resized position grid (computed eagerly, cached per shape)
* ``meta``         int32        ``cu_seqlens`` (padded by the config's rule) then ``gather_idx``,
                                built on the host and uploaded in one copy
* ``out``          [B, text hidden]  the projector's output rows

and the body is ``PackedVisionEncoder.forward`` on them. A second graph variant, ``single_item``,
runs dense SDPA instead of varlen attention; it is captured where one item can fill every row and
replayed when exactly that happens (one sequence, no padding: no mask needed, faster kernels).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .config import EncoderGraphConfig
from .encoder import PackedVisionEncoder, attention_one_sequence
from .packing import (
    Shape,
    lfm2vl_check_shapes,
    lfm2vl_cu_seqlens,
    lfm2vl_gather_idx,
    lfm2vl_read_inputs,
    pack_items,
    tokens_for,
)


def check_finite_items(pixel_values: torch.Tensor, shapes: list[Shape]) -> None:
    """Raise ``ValueError`` naming every item whose real patch rows hold NaN or Inf.

    Without it a NaN pixel silently becomes NaN embeddings (transformers' own path does the same).
    One reduction per item and a single read-back, so it costs one device sync per call.
    """
    flags = torch.stack([torch.isfinite(pixel_values[i, : h * w]).all() for i, (h, w) in enumerate(shapes)]).tolist()
    bad = [i for i, ok in enumerate(flags) if not ok]
    if bad:
        raise ValueError(f"pixel_values of item(s) {bad} hold NaN or Inf (patch grids {[shapes[i] for i in bad]}); "
                         "encode() refused them (check_finite=True)")


def fills_one_sequence(shapes: list[Shape], rows: int) -> bool:
    """True when a replay batch is one item whose patch rows fill a ``rows``-row buffer exactly: the
    whole buffer is then one sequence with no padding rows, so dense attention without a mask is
    exact (the condition for a single-item graph)."""
    return len(shapes) == 1 and shapes[0][0] * shapes[0][1] == rows


class Lfm2VlGraphModel:
    """The packed LFM2-VL encoder behind the manager's protocol.

    ``body`` is the callable captured per budget (default: ``encoder`` itself; the benchmark's fused
    mode passes an inductor-compiled copy, whose attention is baked in, so it gets no single-item
    variant). Items are ``(pixel_values on the device, patch grids)``.
    """

    variants = ("varlen", "single_item")

    def __init__(self, encoder: PackedVisionEncoder, config: EncoderGraphConfig, body=None,
                 single_item_graphs: bool = True, check_finite: bool = False, meta_cache_size: int = 256):
        self.encoder, self.config = encoder, config
        self.body = body if body is not None else encoder
        self.single_item_graphs, self.check_finite = single_item_graphs, check_finite
        self.meta_cache: OrderedDict = OrderedDict()
        self.meta_cache_size = meta_cache_size

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def counters(self) -> dict:
        return {f"pos_cache_{k}": v for k, v in self.encoder.pos_cache.info().items()}

    # -- inputs ------------------------------------------------------------------------------------
    def read_items(self, inputs: dict):
        pv, shapes, _ = lfm2vl_read_inputs(inputs)
        lfm2vl_check_shapes(shapes, self.encoder.max_num_patches, self.config.factor)
        pv = pv.to(self.device, non_blocking=True)  # the dtype is cast while packing into the buffers
        if self.check_finite:
            check_finite_items(pv, shapes)
        return (pv, shapes), [tokens_for(s, self.config.factor) for s in shapes]

    def forward_eager(self, items, batch: list[int]) -> torch.Tensor:
        pv, shapes = items
        packed = pack_items(pv, shapes, batch, factor=self.config.factor, pos_cache=self.encoder.pos_cache,
                            device=self.device)
        return self.encoder.forward_packed(packed)

    # -- capture -----------------------------------------------------------------------------------
    def allocate(self, budget: int) -> dict[str, torch.Tensor]:
        cfg, enc = self.config, self.encoder
        rows, dev, dt = cfg.rows(budget), self.device, enc.dtype
        return {
            "pixel_values": torch.zeros(rows, enc.patch_dim, device=dev, dtype=dt),
            "pos_embeds": torch.zeros(rows, enc.embed_dim, device=dev, dtype=dt),
            "meta": torch.zeros(cfg.cu_size(budget) + rows, device=dev, dtype=torch.int32),
            "out": torch.zeros(budget, cfg.out_hidden_size, device=dev, dtype=dt),
        }

    def describe(self, budget: int) -> dict:
        return {"rows": self.config.rows(budget), "max_seqlen": self.config.max_seqlen(budget),
                "single_item_graph": "single_item" in self.graph_variants(budget)}

    def fill_dummy(self, buffers: dict[str, torch.Tensor], budget: int) -> None:
        """Random (never zero) data and a valid layout: items of max_seqlen rows fill the buffer."""
        cfg = self.config
        rows, max_seqlen, cu_size = cfg.rows(budget), cfg.max_seqlen(budget), cfg.cu_size(budget)
        gen = torch.Generator(device=buffers["pixel_values"].device).manual_seed(budget)
        buffers["pixel_values"].uniform_(-1, 1, generator=gen)
        buffers["pos_embeds"].normal_(0, 0.02, generator=gen)
        offsets = list(range(0, rows, max_seqlen)) + [rows]
        cu = offsets[:cu_size] + [rows] * (cu_size - len(offsets))
        buffers["meta"].copy_(torch.tensor(cu + list(range(rows)), dtype=torch.int32))

    def graph_variants(self, budget: int) -> tuple[str, ...]:
        """``single_item`` too where one item can fill the budget's rows, if the body is the packed
        encoder itself (a compiled body has its attention baked in)."""
        single = (self.single_item_graphs and self.body is self.encoder
                  and self.config.rows(budget) <= self.encoder.max_num_patches)
        return ("varlen", "single_item") if single else ("varlen",)

    def forward_on_buffers(self, buffers: dict[str, torch.Tensor], budget: int, variant: str) -> torch.Tensor:
        cu_size = self.config.cu_size(budget)
        meta = buffers["meta"]
        kw = {"attn": attention_one_sequence} if variant == "single_item" else {}
        return self.body(buffers["pixel_values"], buffers["pos_embeds"], meta[:cu_size],
                         self.config.max_seqlen(budget), meta[cu_size:], **kw)

    # -- replay ------------------------------------------------------------------------------------
    def fits(self, buffers: dict[str, torch.Tensor], budget: int, items, batch: list[int]) -> bool:
        """The guard: a batch larger than the captured buffers must never reach a kernel."""
        shapes = [items[1][i] for i in batch]
        cfg = self.config
        return (sum(tokens_for(s, cfg.factor) for s in shapes) <= budget
                and sum(h * w for h, w in shapes) <= cfg.rows(budget) and len(shapes) <= cfg.slots(budget)
                and max(h * w for h, w in shapes) <= cfg.max_seqlen(budget))

    def fill_buffers(self, buffers: dict[str, torch.Tensor], budget: int, items, batch: list[int]) -> str:
        pv, shapes = items
        bshapes = [shapes[i] for i in batch]
        cfg = self.config
        cfg.padding_for("pixel_values", budget)(buffers["pixel_values"],
                                                 [pv[i, : h * w] for i, (h, w) in zip(batch, bshapes)])
        cfg.padding_for("pos_embeds", budget)(buffers["pos_embeds"],
                                               [self.encoder.pos_cache.get(h, w) for h, w in bshapes])
        buffers["meta"].copy_(self.host_meta(budget, bshapes), non_blocking=True)
        single = "single_item" in self.graph_variants(budget) and fills_one_sequence(bshapes, cfg.rows(budget))
        return "single_item" if single else "varlen"

    def host_meta(self, budget: int, shapes: list[Shape]) -> torch.Tensor:
        """``cu_seqlens`` then ``gather_idx`` of a batch, padded by the config's padding logics, as one
        (pinned, on CUDA) int32 host tensor; cached per (budget, shapes), so a repeat builds nothing."""
        key = (budget, tuple(shapes))
        hit = self.meta_cache.get(key)
        if hit is not None:
            self.meta_cache.move_to_end(key)
            return hit
        cfg = self.config
        cu_size = cfg.cu_size(budget)
        meta = torch.empty(cu_size + cfg.rows(budget), dtype=torch.int32)
        cfg.padding_for("cu_seqlens", budget)(meta[:cu_size], lfm2vl_cu_seqlens(shapes))
        cfg.padding_for("gather_idx", budget)(meta[cu_size:], lfm2vl_gather_idx(shapes, cfg.factor).int())
        if torch.cuda.is_available():
            meta = meta.pin_memory()  # read-only from here on, so async uploads of it are safe
        self.meta_cache[key] = meta
        if len(self.meta_cache) > self.meta_cache_size:
            self.meta_cache.popitem(last=False)
        return meta
