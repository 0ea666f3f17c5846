"""Input packing: from the processor's padded batch to the packed (varlen) layout.

The processor pads every encoder item to ``max_num_patches`` rows. A packed batch drops that
padding and stacks the items' real rows one after another:

* ``pixel_values``  [Σh·w, 3·p·p]  the real patch rows of every item, in order
* ``cu_seqlens``    int32 [items+1] row offsets of the items (0, h0·w0, h0·w0+h1·w1, ...)
* ``max_seqlen``    int             the longest item (rows), which the attention kernel needs
* ``gather_idx``    int64 [Σh·w]    pixel-unshuffle ×2 written as an index into the packed rows
* ``pos_embeds``    [Σh·w, C]       the learned 16×16 position grid resized per item

Everything that depends only on an item's (h, w) — its gather index and its resized position
embeddings — is cached per shape, so a repeated shape costs no interpolation and no index build
(the position cache is an LRU bounded in bytes: it holds device memory).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F

Shape = tuple[int, int]

# LFM2-VL's image-processor defaults, shared by every preset: each item is padded to this many patch
# rows, and the smallest item has this many output tokens (the processor's ``min_image_tokens``).
# A loaded checkpoint's own may differ: code that has a model reads ``inputs.image_limits(model)``.
MAX_NUM_PATCHES = 1024
MIN_ITEM_TOKENS = 64


@dataclass(frozen=True)
class ImageLimits:
    """What the encoder must know of the image processor: patch size, downsample factor, the token
    limits of one item (the processor's ``min_image_tokens`` and ``max_image_tokens``) and the rows
    every item is padded to."""

    patch_size: int
    downsample_factor: int
    min_item_tokens: int
    max_item_tokens: int
    max_num_patches: int

    @classmethod
    def of(cls, p) -> ImageLimits:
        """The limits an ``Lfm2VlImageProcessor`` applies."""
        return cls(p.encoder_patch_size, p.downsample_factor, p.min_image_tokens, p.max_image_tokens, p.max_num_patches)


def model_limits(model) -> ImageLimits:
    """The limits of the image processor a model carries (``model.lab_processor``: ``build_model``
    and ``load_model`` set it), else the defaults of transformers' ``Lfm2VlImageProcessor``."""
    proc = getattr(model, "lab_processor", None)
    if proc is None:
        from transformers import Lfm2VlImageProcessor

        proc = Lfm2VlImageProcessor()
    return ImageLimits.of(proc)


def tokens_for(shape: Shape, factor: int = 2) -> int:
    """Output tokens of one item with patch grid ``shape = (h, w)``: pixel-unshuffle by ``factor``
    turns each factor×factor block of patch rows into one token."""
    h, w = shape
    return (int(h) // factor) * (int(w) // factor)


@dataclass
class PackedBatch:
    """A batch of encoder items in the packed layout (see module docstring)."""

    shapes: list[Shape]
    pixel_values: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    gather_idx: torch.Tensor
    pos_embeds: torch.Tensor | None = None
    factor: int = 2
    out_tokens: list[int] = field(default_factory=list)

    @property
    def n_items(self) -> int:
        return len(self.shapes)

    @property
    def total_rows(self) -> int:
        return sum(h * w for h, w in self.shapes)

    @property
    def total_tokens(self) -> int:
        return sum(self.out_tokens)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def lfm2vl_check_shapes(shapes: list[Shape], max_num_patches: int, factor: int = 2) -> None:
    """Raise ``ValueError`` naming the first item whose patch grid the encoder cannot take."""
    if len(shapes) == 0:
        raise ValueError("empty batch: no encoder items to pack")
    for i, (h, w) in enumerate(shapes):
        if h <= 0 or w <= 0:
            raise ValueError(f"item {i}: patch grid {h}x{w} has a non-positive side")
        if h % factor or w % factor:
            raise ValueError(
                f"item {i}: patch grid {h}x{w} has a side not divisible by the downsample factor {factor}; "
                "pixel-unshuffle needs even sides (the LFM2-VL processor always produces them)"
            )
        if h * w > max_num_patches:
            raise ValueError(f"item {i}: patch grid {h}x{w} = {h * w} rows exceeds max_num_patches={max_num_patches}")


def check_tensor(name: str, t) -> torch.Tensor:
    """``t`` if it is a tensor with data (``TypeError`` naming its type, ``ValueError`` on the meta device)."""
    if not isinstance(t, torch.Tensor):
        hint = " (a numpy array? torch.from_numpy(a); the processor gives tensors with return_tensors='pt')" \
            if type(t).__module__ == "numpy" else ""
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}{hint}")
    if t.device.type == "meta":
        raise ValueError(f"{name} of shape {tuple(t.shape)} is on the meta device: it has no data")
    return t


def move_to(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device``. Onto a GPU the copy is queued (``non_blocking``); off a GPU it waits for
    the data, because the host would read a ``non_blocking`` device-to-host copy before it lands."""
    device = torch.device(device)
    return t.to(device, non_blocking=device.type == "cuda")


def check_pixel_values(pv, patch_dim: int | None = None) -> torch.Tensor:
    """The processor's ``pixel_values``: a float ``(items, patches, 3·p·p)`` tensor with items, and
    rows of ``patch_dim`` values when given. Any float dtype is taken (the encoder casts to its own)
    and any device (they are copied to the model's); integer or bool values are refused, not
    converted: they are pixels that never went through the processor's rescale and normalisation."""
    pv = check_tensor("pixel_values", pv)
    if not pv.dtype.is_floating_point:
        raw = " (0..255 pixels? those are not normalised: run process_images or the model's image processor)" \
            if pv.dtype in (torch.uint8, torch.int16, torch.int32, torch.int64) else ""
        raise TypeError(f"pixel_values has dtype {pv.dtype}; the encoder takes the processor's normalised "
                        f"float pixel values{raw}")
    if pv.dim() != 3:
        raise ValueError(f"pixel_values must be (items, patches, 3*p*p), got shape {tuple(pv.shape)}")
    if pv.shape[0] == 0:
        raise ValueError(f"empty batch: pixel_values of shape {tuple(pv.shape)} holds no encoder items")
    if patch_dim is not None and pv.shape[-1] != patch_dim:
        raise ValueError(f"pixel_values rows have {pv.shape[-1]} values, the patch embedding takes {patch_dim} "
                         f"(pixel_values of shape {tuple(pv.shape)}: processor and model disagree on the patch size)")
    return pv


def read_spatial_shapes(ss, items: int) -> list[Shape]:
    """``spatial_shapes`` (integer ``(items, 2)``, one (h, w) patch grid per item) as host ints. Read
    on the host: keep it on the CPU (the processor does); on a device the read costs a sync."""
    ss = check_tensor("spatial_shapes", ss)
    if ss.dtype.is_floating_point or ss.dtype.is_complex or ss.dtype == torch.bool:
        raise TypeError(f"spatial_shapes must hold integer patch counts, got dtype {ss.dtype}")
    if ss.dim() != 2 or ss.shape[-1] != 2:
        raise ValueError(f"spatial_shapes must be (items, 2), got shape {tuple(ss.shape)}")
    if ss.shape[0] != items:
        raise ValueError(f"pixel_values has {items} items but spatial_shapes has {ss.shape[0]}")
    shapes = [(int(h), int(w)) for h, w in ss.tolist()]
    for i, (h, w) in enumerate(shapes):
        if h <= 0 or w <= 0:
            raise ValueError(f"item {i}: patch grid {h}x{w} has a non-positive side")
    return shapes


def check_attention_mask(mask, pv: torch.Tensor, shapes: list[Shape]) -> torch.Tensor:
    """``pixel_attention_mask``: ``(items, patches)`` like ``pixel_values``; on the host, each item's
    count of real rows must be its ``h·w`` (a host reduction over the mask; a device mask is not read)."""
    mask = check_tensor("pixel_attention_mask", mask)
    if tuple(mask.shape) != tuple(pv.shape[:2]):
        raise ValueError(f"pixel_attention_mask shape {tuple(mask.shape)} != pixel_values' {tuple(pv.shape[:2])}")
    if mask.device.type == "cpu":
        # The processor marks exactly the first h*w rows real; anything else means the tensors
        # were mixed up, and packing by spatial_shapes would silently read the wrong rows.
        counts = mask.sum(dim=1).tolist()
        for i, ((h, w), c) in enumerate(zip(shapes, counts)):
            if int(c) != h * w:
                raise ValueError(f"item {i}: pixel_attention_mask marks {int(c)} rows real "
                                 f"but spatial_shapes says {h}x{w} = {h * w}")
    return mask


def lfm2vl_read_inputs(inputs, patch_dim: int | None = None) -> tuple[torch.Tensor, list[Shape], torch.Tensor | None]:
    """Check the processor-output mapping and return (pixel_values, shapes, mask).

    Every problem is a one-line ``TypeError`` (a type or dtype) or ``ValueError`` (a shape or value)
    naming it: :func:`check_pixel_values`, :func:`read_spatial_shapes` (patch grids; each must fit the
    padded rows), :func:`check_attention_mask` (optional). Host-side checks only: no device sync,
    except reading ``spatial_shapes`` when a caller put it on a device.
    """
    if not isinstance(inputs, Mapping):
        raise TypeError("inputs must be the LFM2-VL processor's output (a dict with pixel_values, spatial_shapes "
                        f"and pixel_attention_mask), got {type(inputs).__name__}")
    for key in ("pixel_values", "spatial_shapes"):
        if key not in inputs:
            raise ValueError(f"inputs lack {key!r}; expected the LFM2-VL processor's output")
    pv = check_pixel_values(inputs["pixel_values"], patch_dim)
    shapes = read_spatial_shapes(inputs["spatial_shapes"], pv.shape[0])
    for i, (h, w) in enumerate(shapes):
        if h * w > pv.shape[1]:
            raise ValueError(f"item {i}: patch grid {h}x{w} = {h * w} rows "
                             f"but pixel_values holds {pv.shape[1]} per item")
    mask = inputs.get("pixel_attention_mask")
    if mask is not None:
        check_attention_mask(mask, pv, shapes)
    return pv, shapes, mask


# --------------------------------------------------------------------------------------------
# Per-shape pieces (cached)
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def lfm2vl_local_gather_idx(h: int, w: int, factor: int = 2) -> torch.Tensor:
    """Pixel-unshuffle of one (h, w) item as row indices into its own rows (CPU, int64).

    Output token (r, c) of the unshuffled grid takes rows (factor·r + dh)·w + (factor·c + dw)
    for dh, dw in row-major order, which is the channel order of transformers'
    ``Lfm2VlMultiModalProjector.pixel_unshuffle``.
    """
    r = torch.arange(h // factor).view(-1, 1, 1, 1)
    c = torch.arange(w // factor).view(1, -1, 1, 1)
    dh = torch.arange(factor).view(1, 1, -1, 1)
    dw = torch.arange(factor).view(1, 1, 1, -1)
    idx = (factor * r + dh) * w + (factor * c + dw)
    out = idx.reshape(-1)
    out.requires_grad_(False)
    return out


def lfm2vl_gather_idx(shapes: list[Shape], factor: int = 2, offset: int = 0) -> torch.Tensor:
    """The packed gather index of a batch: each item's local index shifted by its row offset."""
    parts, o = [], offset
    for h, w in shapes:
        parts.append(lfm2vl_local_gather_idx(h, w, factor) + o)
        o += h * w
    return torch.cat(parts)


def lfm2vl_cu_seqlens(shapes: list[Shape]) -> torch.Tensor:
    """int32 cumulative row offsets (items+1) on the CPU."""
    lens = torch.tensor([h * w for h, w in shapes], dtype=torch.int32)
    return F.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))


# The position cache's default byte budget. One entry is h·w rows of C values: at most 1.5 MiB
# for the 450M preset in bf16 (1024 rows × 768), 2.25 MiB for the 1.6B ones (× 1152). 64 MiB keeps
# a few dozen of the largest grids, more of the small ones; without a bound the cache kept one
# entry per new patch grid and grew for as long as a stream brought new grids.
DEFAULT_POS_CACHE_BYTES = 64 * 2**20


class PositionEmbeddingCache:
    """Resized position embeddings per item shape, computed the way transformers does.

    SigLIP2 NaFlex learns a g×g grid (g = 16) and resizes it to each item's (h, w) with bilinear,
    ``align_corners=False``, ``antialias=True``. transformers redoes that for every item of every
    call (a Python loop with a host read). Here each shape is resized once and kept on the device.
    Like transformers, the CPU path interpolates in float32 (antialias has no bf16 CPU kernel) and
    the result is cast back to the weight's dtype.

    The cache is an LRU bounded by ``max_bytes`` of device memory: the least recently used shapes
    are evicted first, and an entry larger than the whole budget is computed and returned but not
    kept. A tensor handed out stays valid after its entry is evicted (eviction only drops the
    cache's reference); callers copy it into their buffers right away anyway.
    """

    def __init__(self, position_embedding: torch.nn.Embedding, max_bytes: int = DEFAULT_POS_CACHE_BYTES):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.embedding = position_embedding
        self.grid = int(round(position_embedding.num_embeddings**0.5))
        self.max_bytes = max_bytes
        self._cache: OrderedDict[Shape, torch.Tensor] = OrderedDict()
        self._stamp = None
        self.nbytes = 0  # device bytes held by the entries
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._cache)

    def info(self) -> dict:
        """Size and counters: entries, bytes, max_bytes, hits, misses, evictions."""
        return {"entries": len(self), "bytes": self.nbytes, "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}

    def clear(self) -> None:
        """Drop every entry (the counters keep counting)."""
        self._cache.clear()
        self.nbytes = 0

    def stamp(self) -> tuple:
        """Identifies the position weights the entries were computed from (pointer, version, dtype,
        device): when it changes, every entry, and every copy of one, is stale."""
        wt = self.embedding.weight
        return (wt.data_ptr(), wt._version, wt.dtype, wt.device)

    def _keep(self, key: Shape, t: torch.Tensor) -> None:
        size = t.numel() * t.element_size()
        if size > self.max_bytes:
            return  # could never fit: evicting everything else for it would only thrash
        while self.nbytes + size > self.max_bytes:
            _, old = self._cache.popitem(last=False)
            self.nbytes -= old.numel() * old.element_size()
            self.evictions += 1
        self._cache[key] = t
        self.nbytes += size

    def get(self, h: int, w: int) -> torch.Tensor:
        stamp = self.stamp()
        if stamp != self._stamp:  # weights moved, changed dtype or were loaded: start over
            self.clear()
            self._stamp = stamp
        key = (h, w)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return hit
        self.misses += 1
        with torch.no_grad():
            wt = self.embedding.weight
            grid = wt.reshape(self.grid, self.grid, -1).permute(2, 0, 1).unsqueeze(0)
            if grid.device.type == "cpu":
                grid = grid.float()
            out = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
            out = out.reshape(wt.shape[-1], h * w).transpose(0, 1).to(wt.dtype).contiguous()
        self._keep(key, out)
        return out

    def pack(self, shapes: list[Shape]) -> torch.Tensor:
        """Concatenate the cached embeddings of a batch (one device kernel)."""
        return torch.cat([self.get(h, w) for h, w in shapes])


# --------------------------------------------------------------------------------------------
# The packer
# --------------------------------------------------------------------------------------------


def lfm2vl_pack_pixels(pixel_values: torch.Tensor, shapes: list[Shape]) -> torch.Tensor:
    """Stack every item's real rows (its patch grid's ``h·w`` of the padded ``pixel_values``): one
    cat kernel, no host sync (vLLM's ``_pack_pixels``)."""
    return torch.cat([pixel_values[i, : h * w] for i, (h, w) in enumerate(shapes)])


def pack_items(pixel_values: torch.Tensor, shapes: list[Shape], *, factor: int = 2,
               pos_cache: PositionEmbeddingCache | None = None, device=None) -> PackedBatch:
    """Already checked inputs → :class:`PackedBatch`."""
    return packed_batch(lfm2vl_pack_pixels(pixel_values, shapes), list(shapes), factor=factor, pos_cache=pos_cache,
                        device=device)


def packed_batch(rows: torch.Tensor, chosen: list[Shape], *, factor: int = 2,
                 pos_cache: PositionEmbeddingCache | None = None, device=None) -> PackedBatch:
    """Already packed real rows ``[Σh·w, D]`` of items with patch grids ``chosen`` → :class:`PackedBatch`
    on ``device`` (default: where the rows are)."""
    device = torch.device(device) if device is not None else rows.device
    return PackedBatch(
        shapes=chosen,
        pixel_values=move_to(rows, device),  # may come from another device (a GPU input, a CPU model)
        cu_seqlens=lfm2vl_cu_seqlens(chosen).to(device, non_blocking=True),
        max_seqlen=max(h * w for h, w in chosen),
        gather_idx=lfm2vl_gather_idx(chosen, factor).to(device, non_blocking=True),
        pos_embeds=pos_cache.pack(chosen) if pos_cache is not None else None,
        factor=factor,
        out_tokens=[tokens_for(s, factor) for s in chosen],
    )


def pack_inputs(
    inputs: dict,
    *,
    max_num_patches: int = MAX_NUM_PATCHES,
    factor: int = 2,
    pos_cache: PositionEmbeddingCache | None = None,
    device: torch.device | str | None = None,
    patch_dim: int | None = None,
) -> PackedBatch:
    """Processor output → :class:`PackedBatch` on ``device`` (default: where pixel_values live).
    ``patch_dim``: the values per patch row the model takes (checked when given)."""
    pv, shapes, _ = lfm2vl_read_inputs(inputs, patch_dim)
    lfm2vl_check_shapes(shapes, max_num_patches, factor)
    return pack_items(pv, shapes, factor=factor, pos_cache=pos_cache, device=device)
