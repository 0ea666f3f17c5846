"""What crosses from the host to the device per replay, and how little of it: optimisations of the
seed's input path, which the LFM2-VL side uses (:mod:`~.lfm2vl`).

* :class:`RowStager`: the real patch rows of a call's items, in the model's dtype, through pinned
  host memory (below);
* :class:`LayoutCache`: each batch shape's ``cu_seqlens`` and ``gather_idx``, built once on the
  host and kept pinned, so a repeated shape builds nothing and uploads without a sync.

Staging rows.

The processor pads every item to ``max_num_patches`` rows of float32: 3 MiB per item for the 450M
preset, even for an item with 256 real rows. Copied as is from pageable memory, that upload is
synchronous and, on the H200, a large part of a graphed ``encode()`` (``tools.image_path`` measures
it: the reference set's ``ttft`` file). Staged, a call
uploads only what the encoder reads:

1. :func:`gather_rows`: one pass on the host, each item's first ``h·w`` rows cast to the model's
   dtype straight into a reused pinned buffer (bf16 halves the bytes; the padding never moves);
2. one ``non_blocking`` copy of those packed rows into a device tensor, queued on the current
   stream: the host does not wait for it, and the graphs' buffer fills that follow are ordered
   after it on the same stream.

The cast is exact with respect to the encoder: its first step casts pixel values to the weights'
dtype anyway (``PackedVisionEncoder.embed``), and a float → bf16/fp16 conversion rounds the same
wherever it runs, so staged and device-resident inputs give bit-identical embeddings.

The result is a :class:`PixelItems` in the *packed* layout (rows + per-item row offsets): a run of
consecutive items is one contiguous slice whatever their lengths. Input already on the device keeps
its padded layout (views, no copy), as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .packing import Shape


def row_offsets(shapes: list[Shape]) -> tuple[int, ...]:
    """Where each item's rows start in the packed layout, then the total (items + 1 values)."""
    out, o = [0], 0
    for h, w in shapes:
        o += h * w
        out.append(o)
    return tuple(out)


def _consecutive_runs(batch: list[int]) -> list[tuple[int, int]]:
    """``[3, 4, 5, 0, 1]`` → ``[(3, 6), (0, 2)]``: maximal runs of consecutive item indices."""
    runs: list[tuple[int, int]] = []
    for i in batch:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def padded_rows(pixel_values: torch.Tensor, shapes: list[Shape], batch: list[int]) -> list[torch.Tensor]:
    """The real rows of items ``batch`` of a padded ``[items, P, D]`` tensor, in order, as few views
    as possible: consecutive items whose rows fill their ``P`` (tiles) share one view with the item
    after them, so a run of tiles and its thumbnail is one piece (one copy, not one per item)."""
    per_item = pixel_values.shape[1]
    mergeable = pixel_values.is_contiguous()  # else flatten() would copy
    pieces: list[torch.Tensor] = []
    for a, b in _consecutive_runs(batch):
        start = a
        for i in range(a, b):
            h, w = shapes[i]
            if not mergeable or h * w != per_item or i == b - 1:  # this item closes the piece
                if start == i:
                    pieces.append(pixel_values[i, : h * w])
                else:
                    pieces.append(pixel_values[start : i + 1].flatten(0, 1)[: (i - start) * per_item + h * w])
                start = i + 1
    return pieces


@dataclass(frozen=True)
class PixelItems:
    """A call's pixel rows as the graph model holds them.

    ``offsets is None``: ``pixel_values`` is the processor's padded ``[items, P, D]`` (on the
    device: the caller's own tensor, or its plain upload). Else it is packed ``[Σh·w, D]`` and
    ``offsets`` (from :func:`row_offsets`) says where each item's rows start.
    """

    pixel_values: torch.Tensor
    shapes: list[Shape]
    offsets: tuple[int, ...] | None = None

    def rows(self, batch: list[int]) -> list[torch.Tensor]:
        """The real rows of items ``batch``, in ``batch`` order, as views: one per run of consecutive
        items in the packed layout (any lengths), per :func:`padded_rows` in the padded one."""
        if self.offsets is None:
            return padded_rows(self.pixel_values, self.shapes, batch)
        off = self.offsets
        return [self.pixel_values[off[a] : off[b]] for a, b in _consecutive_runs(batch)]


def gather_rows(pixel_values: torch.Tensor, shapes: list[Shape], out: torch.Tensor) -> torch.Tensor:
    """Write every item's real rows of a padded ``[items, P, D]`` tensor, cast to ``out``'s dtype,
    into ``out[:Σh·w]`` and return that view: one pass, one ``copy_`` per run of items
    (:func:`padded_rows`), no temporary. (``torch.cat(..., out=)`` with a dtype change took 3x as
    long as these copies on the CPU.)"""
    total = sum(h * w for h, w in shapes)
    if out.shape[0] < total or out.shape[1:] != pixel_values.shape[2:]:
        raise ValueError(f"gather_rows: {total} rows of {tuple(pixel_values.shape[2:])} do not fit "
                         f"a buffer of shape {tuple(out.shape)}")
    o = 0
    for piece in padded_rows(pixel_values, shapes, list(range(len(shapes)))):
        out[o : o + piece.shape[0]].copy_(piece)
        o += piece.shape[0]
    return out[:total]


class RowStager:
    """Uploads host pixel values to ``device``: :func:`gather_rows` into a reused pinned buffer,
    then one ``non_blocking`` copy into a new device tensor (:meth:`upload`).

    Reuse is safe without a device sync: after each upload an event is recorded on the stream, and
    a buffer is written again only once the event of *its* last upload has fired. There are two
    buffers, used in turns (double buffering), so a call never waits for the upload the call
    before it queued, only for the one two calls back, which in practice has long finished: the
    host then gathers call n+1's rows while call n's rows are still on their way. ``host_waits``
    counts the times the host did have to wait.

    On a CPU device nothing is pinned (CPU builds of torch cannot pin) and each call gathers into
    a fresh tensor (the "device" tensor is the host one: nothing may overwrite it later).
    """

    def __init__(self, device, slots: int = 2, chunk_rows: int | None = None):
        self.device = torch.device(device)
        # None: gather every row, then one upload. A number: gather and upload in chunks of at most
        # that many rows, so the DMA of one chunk overlaps the host's gather of the next. Measured
        # slower on the H200 (the image-path rows of ttft-20261201-031107.json: the upload, at
        # 23-28 GB/s, is 2-3x the gather, and each chunk adds a launch), so it is off by default.
        self.chunk_rows = chunk_rows
        self.cuda = self.device.type == "cuda"
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list = [None] * slots
        self._turn = 0
        self.calls = self.host_waits = self.grows = 0

    def info(self) -> dict:
        """Counters: staged calls, host waits on a buffer's last upload, buffer growths, pinned bytes."""
        pinned = sum(b.numel() for b in self._buffers if b is not None)
        return {"calls": self.calls, "host_waits": self.host_waits, "grows": self.grows, "pinned_bytes": pinned}

    def _host_buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        """Slot ``slot``'s pinned bytes, free to overwrite (its last upload has finished), grown to
        at least ``nbytes`` (doubling, so a growing stream reallocates rarely). Dropping an old buffer
        is safe: torch's pinned-memory allocator keeps a block until the copies that read it finish."""
        ev = self._events[slot]
        if ev is not None and not ev.query():
            self.host_waits += 1
            ev.synchronize()  # waits for that one copy only, not for the stream's later work
        buf = self._buffers[slot]
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * buf.numel() if buf is not None else 0)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self._buffers[slot] = buf
            self.grows += 1
        return buf

    def upload(self, pixel_values: torch.Tensor, shapes: list[Shape], dtype: torch.dtype) -> torch.Tensor:
        """The real rows of every item of a host ``[items, P, D]`` tensor, in ``dtype``, packed
        ``[Σh·w, D]`` on the device (see :func:`row_offsets`); the upload is queued, not waited for."""
        self.calls += 1
        total, dim = sum(h * w for h, w in shapes), pixel_values.shape[2]
        if not self.cuda:
            return gather_rows(pixel_values, shapes, torch.empty(total, dim, dtype=dtype))
        slot, self._turn = self._turn, (self._turn + 1) % len(self._buffers)
        nbytes = total * dim * dtype.itemsize
        host = self._host_buffer(slot, nbytes)[:nbytes].view(dtype).view(total, dim)
        out = torch.empty(total, dim, dtype=dtype, device=self.device)
        if self.chunk_rows is None:
            gather_rows(pixel_values, shapes, host)
            out.copy_(host, non_blocking=True)
        else:
            o = 0
            for piece in padded_rows(pixel_values, shapes, list(range(len(shapes)))):
                for chunk in piece.split(self.chunk_rows):
                    n = chunk.shape[0]
                    host[o : o + n].copy_(chunk)
                    out[o : o + n].copy_(host[o : o + n], non_blocking=True)
                    o += n
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        self._events[slot] = ev
        return out


class LayoutCache:
    """Host tensors per batch layout: ``get(key, build)`` returns what ``build()`` made the first
    time ``key`` (e.g. budget, variant and patch grids) was asked for, pinned on a CUDA machine.

    An entry is never written again once made, so a ``non_blocking`` upload from it is safe without
    a sync (the pinned allocator keeps a dropped block until the copies that read it have run).
    The least recently used of more than ``size`` entries is dropped.
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key, build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        entry = self._entries.pop(key, None)  # put back last: the most recently used
        if entry is None:
            self.misses += 1
            entry = build()
            if torch.cuda.is_available():
                entry = {k: v.pin_memory() for k, v in entry.items()}
        else:
            self.hits += 1
        self._entries[key] = entry
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return entry
