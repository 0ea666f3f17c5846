"""LFM2-VL's side of encoder graphs: the :class:`~.manager.EncoderGraphModel` protocol implemented
for the packed vision encoder (what vLLM PR #44930 added to LFM2-VL as ``SupportsEncoderCudaGraph``).

Per budget B (output tokens), the graphs read four persistent buffers:

* ``pixel_values`` [4B, 3·p·p]  the real patch rows of the batch, then zero rows
* ``pos_embeds``   [4B, C]      each item's resized position grid (computed eagerly, cached per shape)
* ``meta``         int32        ``cu_seqlens`` (padded by the config's rule) then ``gather_idx``,
                                built on the host and uploaded in one copy
* ``out``          [B, text hidden]  the projector's output rows

and the body is ``PackedVisionEncoder.forward`` on them. Each budget captures several *variants*
of that body on the same buffers; the host picks one per replay from the patch grids it already
has (no sync):

* ``varlen``         every row through varlen attention over ``cu_seqlens`` (any batch)
* ``dense{k}``       a batch of exactly k full-length items (L rows each, L = ``dense_rows``: 1024
                     for 512 px images and tiles): batched dense SDPA on (k, heads, L, d), and the
                     graph runs only those k·L rows, so it pads nothing
* ``dense{k}+varlen`` k full-length items, then a ragged rest: dense SDPA on the first k·L rows,
                     varlen on the rest (``cu_seqlens`` then describes only the rest)

Why: inside a graph, cuDNN's dense attention on equal-length items ran at about half the time of
FlashAttention-2's varlen kernel on the H200 (``python -m lfm2vl_lab attention``), and replay
sorts items largest first, so batches start with their full-length items. Only the variants the
config can route a batch to are captured (:meth:`Lfm2VlGraphModel.graph_variants`).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..kernels.attention import dense_attention
from .config import EncoderGraphConfig
from .encoder import PackedVisionEncoder
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
from .staging import PixelItems, RowStager, row_offsets


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


def check_staged(items, patch_dim: int, device) -> PixelItems:
    """Items ``GraphedEncoder.stage`` made, checked for this encoder: rows of ``patch_dim`` values,
    on its device (``ValueError`` naming what differs)."""
    if items.pixel_values.shape[-1] != patch_dim or items.pixel_values.device != device:
        raise ValueError(f"staged items hold rows of {items.pixel_values.shape[-1]} values on "
                         f"{items.pixel_values.device}; this encoder takes rows of {patch_dim} on {device}")
    return items


def parse_variant(name: str) -> tuple[int, bool]:
    """``"varlen"`` → (0, True); ``"dense3"`` → (3, False); ``"dense3+varlen"`` → (3, True):
    (full-length items through dense attention, whether a varlen rest follows)."""
    if name == "varlen":
        return 0, True
    if name.startswith("dense"):
        k, _, rest = name[5:].partition("+")
        if k.isdigit() and int(k) > 0 and rest in ("", "varlen"):
            return int(k), rest == "varlen"
    raise ValueError(f"unknown graph variant {name!r}: expected varlen, dense<k> or dense<k>+varlen")


def variant_name(k: int, rest: bool) -> str:
    return "varlen" if k == 0 else f"dense{k}" + ("+varlen" if rest else "")


def leading_full_items(shapes: list[Shape], rows: int) -> int:
    """How many items at the start of a batch have exactly ``rows`` patch rows."""
    n = 0
    for h, w in shapes:
        if h * w != rows:
            break
        n += 1
    return n


class Lfm2VlGraphModel:
    """The packed LFM2-VL encoder behind the manager's protocol.

    ``body`` is the callable captured per budget (default: ``encoder`` itself; the benchmark's fused
    mode passes an inductor-compiled copy, whose attention is baked in, so it gets only ``varlen``
    graphs). ``dense_graphs=False`` captures only ``varlen`` graphs too. Items are a
    :class:`~.staging.PixelItems` on the device.

    ``stage_rows`` (None: when the encoder is on CUDA): pixel values on the host are staged by a
    :class:`~.staging.RowStager` (only the real rows, in the model's dtype, through pinned memory,
    without a sync) instead of uploading the processor's padded float32 tensor.
    """

    def __init__(self, encoder: PackedVisionEncoder, config: EncoderGraphConfig, body=None,
                 dense_graphs: bool = True, check_finite: bool = False, meta_cache_size: int = 256,
                 stage_rows: bool | None = None):
        self.encoder, self.config = encoder, config
        self.stage_rows, self.stager = stage_rows, None
        self.body = body if body is not None else encoder
        self.dense_graphs, self.check_finite = dense_graphs, check_finite
        self.meta_cache: OrderedDict = OrderedDict()
        self.meta_cache_size = meta_cache_size
        self._attn: dict[str, object] = {}
        # Per budget, the patch grids whose position rows and meta are in its buffers now: a replay
        # of the same grids (the common case: 512 px tiles) skips re-uploading both.
        self.resident: dict[int, tuple] = {}

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    @property
    def variants(self) -> tuple[str, ...]:
        """Every variant some budget captures (``varlen`` first)."""
        names = dict.fromkeys(v for b in self.config.graph_budgets for v in self.graph_variants(b))
        return tuple(sorted(names, key=lambda v: (v != "varlen", parse_variant(v))))

    def counters(self) -> dict:
        staging = {f"staging_{k}": v for k, v in self.stager.info().items()} if self.stager is not None else {}
        return {**{f"pos_cache_{k}": v for k, v in self.encoder.pos_cache.info().items()}, **staging}

    def weights(self) -> dict:
        """What the graphs read but do not own: the vision tower (the fused q/k/v weights the graphs
        read are views its q/k/v parameters hold, so moving those moves these) and the projector."""
        return {"vision_tower": self.encoder.vision, "projector": self.encoder.projector.inner}

    # -- inputs ------------------------------------------------------------------------------------
    def _stager(self) -> RowStager | None:
        """The stager for host pixel values, or None when they are uploaded padded, as they are."""
        dev = self.device
        if not (self.stage_rows if self.stage_rows is not None else dev.type == "cuda"):
            return None
        if self.stager is None or self.stager.device != dev:
            self.stager = RowStager(dev)
        return self.stager

    def read_items(self, inputs: dict):
        """Checked inputs (:func:`~.packing.lfm2vl_read_inputs`) as a :class:`~.staging.PixelItems`
        on the model's device. Pixel values on the host are staged; on any other device they are
        copied to the model's (from a GPU to a CPU model that copy waits for the GPU)."""
        if isinstance(inputs, PixelItems):  # already read and uploaded (GraphedEncoder.stage)
            return check_staged(inputs, self.encoder.patch_dim, self.device), \
                [tokens_for(s, self.config.factor) for s in inputs.shapes]
        pv, shapes, _ = lfm2vl_read_inputs(inputs, self.encoder.patch_dim)
        lfm2vl_check_shapes(shapes, self.encoder.max_num_patches, self.config.factor)
        if self.check_finite:  # on the values as given: host input then costs no device sync
            check_finite_items(pv, shapes)
        stager = self._stager() if pv.device.type == "cpu" else None
        if stager is not None:
            items = PixelItems(stager.stage(pv, shapes, self.encoder.dtype), shapes, row_offsets(shapes))
        else:  # device-resident input stays as it is (views); the dtype is cast while filling the buffers
            items = PixelItems(move_to(pv, self.device), shapes)
        return items, [tokens_for(s, self.config.factor) for s in shapes]

    def forward_eager(self, items: PixelItems, batch: list[int]) -> torch.Tensor:
        rows = items.rows(batch)
        packed = packed_batch(rows[0] if len(rows) == 1 else torch.cat(rows), [items.shapes[i] for i in batch],
                              factor=self.config.factor, pos_cache=self.encoder.pos_cache, device=self.device)
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
                "variants": list(self.graph_variants(budget))}

    def computed_rows(self, budget: int, variant: str) -> int:
        """Patch rows one replay of a variant computes: all of the budget's, or only a pure run's items."""
        k, rest = parse_variant(variant)
        return self.config.rows(budget) if rest else k * self.config.dense_rows(budget)

    def varlen_rows(self, budget: int, variant: str) -> int:
        """Rows the varlen kernel of a variant is given (0 for a pure dense run)."""
        k, rest = parse_variant(variant)
        return self.computed_rows(budget, variant) - k * self.config.dense_rows(budget) if rest else 0

    def fill_dummy(self, buffers: dict[str, torch.Tensor], budget: int) -> None:
        """Random (never zero) data and a layout valid for *every* variant captured on these buffers:
        ``cu_seqlens`` covers only as many rows as the smallest varlen part gets (the rest after
        the most dense items), since FlashAttention reads every row ``cu_seqlens`` names, unchecked."""
        cfg = self.config
        rows, max_seqlen, cu_size = cfg.rows(budget), cfg.max_seqlen(budget), cfg.cu_size(budget)
        self.resident.pop(budget, None)
        gen = torch.Generator(device=buffers["pixel_values"].device).manual_seed(budget)
        buffers["pixel_values"].uniform_(-1, 1, generator=gen)
        buffers["pos_embeds"].normal_(0, 0.02, generator=gen)
        varlen = min((self.varlen_rows(budget, v) for v in self.graph_variants(budget) if parse_variant(v)[1]),
                     default=rows)
        offsets = list(range(0, varlen, max_seqlen)) + [varlen]
        cu = offsets[:cu_size] + [varlen] * (cu_size - len(offsets))
        buffers["meta"].copy_(torch.tensor(cu + list(range(rows)), dtype=torch.int32))

    def graph_variants(self, budget: int) -> tuple[str, ...]:
        """The variants worth capturing for ``budget``: ``varlen`` (not in the run budget, which takes
        only pure runs), ``dense{k}`` for each k whose pure run ``budget_for`` sends here, and
        ``dense{k}+varlen`` for each k that leaves rows for a rest. Only ``varlen`` when dense graphs
        are off or the body is not the packed encoder itself (a compiled body bakes its attention in)."""
        cfg = self.config
        if not self.dense_graphs or self.body is not self.encoder:
            return ("varlen",)
        rows, item_rows = cfg.rows(budget), cfg.dense_rows(budget)
        item_tokens = item_rows // cfg.factor**2
        ks = range(1, cfg.dense_blocks(budget) + 1)
        pure = [variant_name(k, False) for k in ks if cfg.budget_for(k * item_tokens, k) == budget]
        if budget == cfg.run_budget:
            return tuple(pure)
        return ("varlen", *pure, *(variant_name(k, True) for k in ks if k * item_rows < rows))

    def computed_tokens(self, budget: int, variant: str) -> int:
        return self.computed_rows(budget, variant) // self.config.factor**2

    def _attention(self, budget: int, variant: str):
        """The attention function of a variant (None: the encoder's own backend)."""
        k, rest = parse_variant(variant)
        if k == 0:
            return None
        key = (variant, self.config.dense_rows(budget), self.device, self.encoder.dtype)  # a recapture may change both
        if key not in self._attn:
            self._attn[key] = dense_attention(k, self.config.dense_rows(budget),
                                              self.encoder.attention_fn() if rest else None)
        return self._attn[key]

    def forward_on_buffers(self, buffers: dict[str, torch.Tensor], budget: int, variant: str) -> torch.Tensor:
        cfg = self.config
        cu_size, meta = cfg.cu_size(budget), buffers["meta"]
        rows = self.computed_rows(budget, variant)
        kw = {"attn": self._attention(budget, variant)} if variant != "varlen" else {}
        return self.body(buffers["pixel_values"][:rows], buffers["pos_embeds"][:rows], meta[:cu_size],
                         cfg.max_seqlen(budget), meta[cu_size : cu_size + rows], **kw)

    # -- replay ------------------------------------------------------------------------------------
    def fits(self, buffers: dict[str, torch.Tensor], budget: int, items, batch: list[int]) -> bool:
        """The guard: a batch larger than the captured buffers must never reach a kernel, and the run
        budget takes only pure runs of full-length items."""
        shapes = [items.shapes[i] for i in batch]
        cfg = self.config
        if budget == cfg.run_budget and leading_full_items(shapes, cfg.dense_rows(budget)) != len(shapes):
            return False
        return (sum(tokens_for(s, cfg.factor) for s in shapes) <= budget
                and sum(h * w for h, w in shapes) <= cfg.rows(budget) and len(shapes) <= cfg.slots(budget)
                and max(h * w for h, w in shapes) <= cfg.max_seqlen(budget))

    def variant_for(self, budget: int, shapes: list[Shape]) -> str:
        """The variant a batch of these patch grids replays: ``dense{k}`` for a pure run of k
        full-length items, ``dense{k}+varlen`` for k of them then a rest, else ``varlen``."""
        captured = self.graph_variants(budget)
        k = leading_full_items(shapes, self.config.dense_rows(budget))
        for name in (variant_name(k, k < len(shapes)), "varlen"):
            if name in captured:
                return name
        raise ValueError(f"no {budget}-token graph variant takes patch grids {shapes} (captured: {captured})")

    def fill_buffers(self, buffers: dict[str, torch.Tensor], budget: int, items, batch: list[int]) -> str:
        bshapes = tuple(items.shapes[i] for i in batch)
        cfg = self.config
        variant, meta = self.host_meta(budget, bshapes)
        rows = self.computed_rows(budget, variant)  # a pure run reads no padding rows
        cfg.padding_for("pixel_values", budget)(buffers["pixel_values"][:rows], items.rows(batch))
        resident = (bshapes, self.encoder.pos_cache.stamp())
        if self.resident.get(budget) != resident:  # else both are in the buffers already
            cfg.padding_for("pos_embeds", budget)(buffers["pos_embeds"][:rows],
                                                   [self.encoder.pos_cache.get(h, w) for h, w in bshapes])
            buffers["meta"][: meta.shape[0]].copy_(meta, non_blocking=True)
            self.resident[budget] = resident
        return variant

    def host_meta(self, budget: int, shapes: list[Shape]) -> tuple[str, torch.Tensor]:
        """The variant of a batch, and its ``cu_seqlens`` then ``gather_idx`` padded by the config's
        padding logics, as one (pinned, on CUDA) int32 host tensor. ``cu_seqlens`` describes the rows
        the varlen kernel sees: all of them for ``varlen``, the rest after the dense items for
        ``dense{k}+varlen`` (a pure ``dense{k}`` ignores it). Cached per (budget, shapes), so a
        repeat builds nothing."""
        key = (budget, tuple(shapes))
        hit = self.meta_cache.get(key)
        if hit is not None:
            self.meta_cache.move_to_end(key)
            return hit
        cfg = self.config
        variant = self.variant_for(budget, shapes)
        k, rest = parse_variant(variant)
        cu_size, rows = cfg.cu_size(budget), self.computed_rows(budget, variant)
        meta = torch.empty(cu_size + rows, dtype=torch.int32)
        if rest:
            cu = lfm2vl_cu_seqlens(shapes[k:]) if k < len(shapes) else torch.zeros(1, dtype=torch.int32)
            cfg.padding_for("cu_seqlens", budget, self.varlen_rows(budget, variant))(meta[:cu_size], cu)
        else:
            meta[:cu_size] = 0  # unread: a pure dense graph has no varlen kernel
        cfg.padding_for("gather_idx", budget)(meta[cu_size:], lfm2vl_gather_idx(shapes, cfg.factor).int())
        if torch.cuda.is_available():
            meta = meta.pin_memory()  # read-only from here on, so async uploads of it are safe
        self.meta_cache[key] = (variant, meta)
        if len(self.meta_cache) > self.meta_cache_size:
            self.meta_cache.popitem(last=False)
        return variant, meta
