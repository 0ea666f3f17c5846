"""Capture and replay: the encoder CUDA-graph manager and its public face, ``GraphedEncoder``.

Capture (once): for each budget, largest first, allocate persistent input buffers, run the packed
encoder on dummy data on a side stream (warm-up: lazy kernel loading, cuBLAS handles), then
capture it into one shared memory pool and copy its output into a persistent output buffer
*inside* the graph.

Replay (every call): sort items by output tokens, pack greedily under the largest budget and the
item limit, pick the smallest budget that fits, fill the buffers through the padding logics, replay,
then clone each item's rows out of the output buffer (the next replay overwrites it) and hand them
back in the caller's order. Items too large for any graph run eagerly and are counted.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .capture import capture_graph, recover_from_failed_capture
from .config import EncoderGraphConfig
from .encoder import PackedVisionEncoder, warn_once
from .inputs import image_limits, process_images
from .packing import PositionEmbeddingCache, Shape, lfm2vl_check_shapes, lfm2vl_cu_seqlens, lfm2vl_gather_idx, lfm2vl_read_inputs, pack_items, tokens_for


# Single-item graphs (see GraphedEncoder) are on unless a caller turns them off: on the H200 they
# made one 512 px or 256 px image faster at the same parity (data/results/nvidia-h200/single-item-*.json).
SINGLE_ITEM_GRAPHS = True

# --------------------------------------------------------------------------------------------
# Planning (pure host logic, testable without a GPU)
# --------------------------------------------------------------------------------------------


def plan_batches(tokens: list[int], max_budget: int, max_items: int) -> tuple[list[list[int]], list[int]]:
    """Greedy packing of item indices into replay batches.

    Items are taken largest first; a batch grows while its tokens stay ≤ ``max_budget`` and its
    items < ``max_items``. Items larger than ``max_budget`` are returned separately (eager).
    """
    order = sorted(range(len(tokens)), key=lambda i: -tokens[i])
    eager = [i for i in order if tokens[i] > max_budget]
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_tokens = 0
    for i in order:
        if tokens[i] > max_budget:
            continue
        if cur and (cur_tokens + tokens[i] > max_budget or len(cur) >= max_items):
            batches.append(cur)
            cur, cur_tokens = [], 0
        cur.append(i)
        cur_tokens += tokens[i]
    if cur:
        batches.append(cur)
    return batches, eager


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


def plan_stats(calls: list[list[int]], config: EncoderGraphConfig) -> dict:
    """Host-only preview of what a config does to a stream of calls (each a list of item tokens):
    replays, real and padded tokens, items left to eager, and the padding waste (padded / real)."""
    replays = real = padded = eager_items = 0
    for toks in calls:
        batches, eager = plan_batches(toks, max(config.budgets), config.max_items)
        eager_items += len(eager)
        for b in batches:
            t = sum(toks[i] for i in b)
            replays, real, padded = replays + 1, real + t, padded + config.budget_for(t, len(b)) - t
    return {"replays": replays, "real": real, "padded": padded, "eager_items": eager_items,
            "waste": padded / real if real else 0.0}


@dataclass
class GraphStats:
    """Counters of the replay path. ``padding_waste`` = padded tokens / real tokens."""

    hits: int = 0  # items served by a graph replay
    misses: int = 0  # items run eagerly because they exceed the largest budget
    overflow: int = 0  # batches refused by the buffer guard (never reached a kernel)
    eager_calls: int = 0  # encode() calls served eagerly because nothing was captured
    replays: dict[int, int] = field(default_factory=dict)
    single_item_replays: int = 0  # replays (counted in ``replays`` too) that used a single-item graph
    real_tokens: int = 0
    padded_tokens: int = 0
    # The encoder's position-embedding cache, reported by as_dict (its size now; its counters since
    # it was made, since reset_stats keeps the cache).
    pos_cache: "PositionEmbeddingCache | None" = field(default=None, repr=False, compare=False)

    @property
    def padding_waste(self) -> float:
        return self.padded_tokens / self.real_tokens if self.real_tokens else 0.0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict:
        return {
            "hits": self.hits, "misses": self.misses, "overflow": self.overflow, "eager_calls": self.eager_calls,
            "replays": dict(sorted(self.replays.items())), "single_item_replays": self.single_item_replays,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens, "padding_waste": self.padding_waste, "hit_rate": self.hit_rate,
            **({f"pos_cache_{k}": v for k, v in self.pos_cache.info().items()} if self.pos_cache is not None else {}),
        }


@dataclass
class BudgetGraph:
    """One captured graph and the persistent buffers it reads and writes."""

    budget: int
    rows: int
    max_seqlen: int
    cu_size: int
    pixel_values: torch.Tensor  # [rows, 3·p·p]
    pos_embeds: torch.Tensor  # [rows, C]
    meta: torch.Tensor  # int32 [cu_size + rows]: cu_seqlens then gather_idx, one upload per replay
    out: torch.Tensor  # [budget, text hidden]
    graph: "torch.cuda.CUDAGraph | None" = None
    # Same buffers, dense attention: replayed for one item that fills every row (see GraphedEncoder)
    single: "torch.cuda.CUDAGraph | None" = None

    @property
    def buffer_bytes(self) -> int:
        """The persistent buffers this budget owns (outside the pool: they live as long as the manager)."""
        return sum(t.numel() * t.element_size() for t in (self.pixel_values, self.pos_embeds, self.meta, self.out))

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return self.meta[: self.cu_size]

    @property
    def gather_idx(self) -> torch.Tensor:
        return self.meta[self.cu_size :]

    def info(self) -> dict:
        return {
            "budget": self.budget, "rows": self.rows, "max_seqlen": self.max_seqlen,
            "single_item_graph": self.single is not None, "buffers_mb": self.buffer_bytes / 2**20,
        }


# --------------------------------------------------------------------------------------------
# The manager / facade
# --------------------------------------------------------------------------------------------


class GraphedEncoder:
    """LFM2-VL's vision encoder with CUDA-graph capture and replay.

    >>> genc = GraphedEncoder(model)            # budgets from the preset: [64, 128, 256, 512, 1024]
    >>> genc.capture()                          # one graph per budget, one shared memory pool
    >>> feats = genc.encode(processor_output)   # or genc.encode_images([pil, ...])

    ``encode`` returns per-item embeddings in input order, like transformers' ``get_image_features``.
    Without CUDA, ``encode`` runs the packed eager path (and says so once); ``capture`` raises.

    ``single_item_graphs`` (on by default): for each budget whose rows one item can fill
    (4·B ≤ max_num_patches: 64, 128 and 256 tokens by default) a second graph is captured on the
    same buffers with dense SDPA instead of ``varlen_attn``. A replay of exactly one item whose
    tokens equal the budget (a 512 px or 256 px image alone) uses it: one sequence, no padding, so
    no mask is needed and the faster dense kernels apply. ``data/results/nvidia-h200/single-item-*.json``
    holds the H200 comparison of off and on.

    ``check_finite=True`` makes ``encode`` refuse pixel values holding NaN or Inf with an error that
    names the items (off by default: the check reads a flag back from the device, one sync per call).
    """

    def __init__(self, model, budgets=None, max_items=None, cu_seqlens_rule: str = "safe",
                 max_seqlen_mode: str = "tight", attention: str = "auto", max_budget: int | None = None,
                 body=None, meta_cache_size: int = 256, fuse_qkv: bool = False, single_item_graphs: bool = SINGLE_ITEM_GRAPHS,
                 check_finite: bool = False):
        self.model = model
        self.single_item_graphs = single_item_graphs
        self.check_finite = check_finite
        self.encoder = PackedVisionEncoder(model, attention=attention, fuse_qkv=fuse_qkv)
        # The smallest budget is the processor's smallest item: a preset's, or a loaded checkpoint's own.
        min_tokens = image_limits(model).min_image_tokens
        self.config = EncoderGraphConfig.build(
            out_hidden_size=self.encoder.out_hidden_size, budgets=budgets, max_items=max_items,
            min_tokens=min_tokens, max_tokens=max_budget if max_budget is not None else 1024,
            max_num_patches=self.encoder.max_num_patches, factor=self.encoder.factor,
            cu_seqlens_rule=cu_seqlens_rule, max_seqlen_mode=max_seqlen_mode,
        )
        # The callable captured per budget; defaults to the packed encoder's forward. The benchmark's
        # fused mode passes an inductor-compiled version of it here.
        self.body = body if body is not None else self.encoder
        self.graphs: dict[int, BudgetGraph] = {}
        self.pool = None
        self.capture_extra: dict[int, dict] = {}
        self.stats = GraphStats(pos_cache=self.encoder.pos_cache)
        self._meta_cache: OrderedDict = OrderedDict()
        self._meta_cache_size = meta_cache_size

    # -- state -------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.encoder.device

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def reset_stats(self) -> None:
        self.stats = GraphStats(pos_cache=self.encoder.pos_cache)

    def capture_info(self) -> list[dict]:
        """One row per captured budget (largest first, the capture order): its geometry and buffer
        memory, plus whatever the capture hook measured."""
        return [{**self.graphs[b].info(), **self.capture_extra.get(b, {})} for b in sorted(self.graphs, reverse=True)]

    # -- capture -----------------------------------------------------------------------------------
    def _allocate(self, budget: int) -> BudgetGraph:
        cfg, enc = self.config, self.encoder
        rows, cu_size = cfg.rows(budget), cfg.cu_size(budget)
        dev, dt = self.device, enc.dtype
        return BudgetGraph(
            budget=budget, rows=rows, max_seqlen=cfg.max_seqlen(budget), cu_size=cu_size,
            pixel_values=torch.zeros(rows, enc.patch_dim, device=dev, dtype=dt),
            pos_embeds=torch.zeros(rows, enc.embed_dim, device=dev, dtype=dt),
            meta=torch.zeros(cu_size + rows, device=dev, dtype=torch.int32),
            out=torch.zeros(budget, cfg.out_hidden_size, device=dev, dtype=dt),
        )

    def _fill_dummy(self, g: BudgetGraph, seed: int) -> None:
        """Random (never zero) data and a valid layout: items of max_seqlen rows fill the buffer."""
        gen = torch.Generator(device=g.pixel_values.device).manual_seed(seed)
        g.pixel_values.uniform_(-1, 1, generator=gen)
        g.pos_embeds.normal_(0, 0.02, generator=gen)
        offsets = list(range(0, g.rows, g.max_seqlen)) + [g.rows]
        cu = offsets[: g.cu_size] + [g.rows] * (g.cu_size - len(offsets))
        meta = torch.tensor(cu + list(range(g.rows)), dtype=torch.int32)
        g.meta.copy_(meta)

    def _run_body(self, g: BudgetGraph) -> torch.Tensor:
        return self.body(g.pixel_values, g.pos_embeds, g.cu_seqlens, g.max_seqlen, g.gather_idx)

    def _has_single(self, budget: int) -> bool:
        """Whether this budget gets a single-item graph: one item can fill its rows, and the body is
        the packed encoder itself (a compiled body has its attention baked in)."""
        return self.single_item_graphs and self.body is self.encoder and self.config.rows(budget) <= self.encoder.max_num_patches

    def _record(self, g: BudgetGraph, attn=None, warmup_iters: int = 2) -> "torch.cuda.CUDAGraph":
        """One graph that reads g's input buffers and writes g.out, into the shared pool."""
        kw = {} if attn is None else {"attn": attn}
        return capture_graph(lambda: g.out.copy_(self.body(g.pixel_values, g.pos_embeds, g.cu_seqlens, g.max_seqlen,
                                                            g.gather_idx, **kw)), self.pool, warmup_iters)

    @torch.no_grad()
    def capture(self, hook=None, warmup_iters: int = 2) -> list[dict]:
        """Capture one graph per budget, largest first, into one shared memory pool; all or nothing.

        ``hook(budget, pool, run) -> dict | None``, if given, wraps each budget's capture: it must
        call ``run()`` once and may return measurements, which join that budget's ``capture_info``
        row. The instrument's :class:`lfm2vl_lab.tools.meter.CaptureMeter` times each capture, reads
        the pool's memory and draws a progress bar through it; the technique itself measures nothing.
        """
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(
                f"capture() needs the model on a CUDA device (it is on {self.device}); "
                "encode() works without capture and runs the packed eager path"
            )
        self.graphs.clear()
        self.capture_extra = {}
        self.pool = torch.cuda.graph_pool_handle()
        for budget in sorted(self.config.budgets, reverse=True):  # largest first: smaller graphs reuse its blocks
            caller_stream = torch.cuda.current_stream()
            try:
                g = self._allocate(budget)
                extra = self._capture_budget(g, warmup_iters, hook)
            except Exception as exc:
                # All or nothing: a half-captured manager would replay some budgets and not others.
                self.graphs.clear()
                recover_from_failed_capture(caller_stream)
                # When the body raised, capture_end() raises too; the body's error is its context.
                cause = exc.__context__ if exc.__context__ is not None else exc
                first_line = (str(cause).strip().splitlines() or [""])[0][:200]
                raise RuntimeError(
                    f"capturing the {budget}-token encoder graph failed ({type(cause).__name__}: {first_line}). "
                    "No graphs are installed; encode() runs the packed eager path. Usually something in the "
                    "encoder body needs the host during capture (a .item(), .tolist() or a CPU tensor)."
                ) from exc
            self.graphs[budget] = g
            self.capture_extra[budget] = dict(extra or {})
        return self.capture_info()

    def _capture_budget(self, g: BudgetGraph, warmup_iters: int, hook) -> dict | None:
        from .encoder import attention_one_sequence

        def run() -> None:
            self._fill_dummy(g, seed=g.budget)
            g.graph = self._record(g, warmup_iters=warmup_iters)
            if self._has_single(g.budget):
                g.single = self._record(g, attention_one_sequence, warmup_iters)

        return hook(g.budget, self.pool, run) if hook is not None else run()

    # -- replay ------------------------------------------------------------------------------------
    def _host_meta(self, g: BudgetGraph, shapes: list[Shape]) -> torch.Tensor:
        """cu_seqlens and gather_idx of a batch, padded by the config's padding logics, as one
        pinned int32 host tensor; cached per (budget, shapes) so repeats build nothing."""
        key = (g.budget, tuple(shapes))
        hit = self._meta_cache.get(key)
        if hit is not None:
            self._meta_cache.move_to_end(key)
            return hit
        meta = torch.empty(g.cu_size + g.rows, dtype=torch.int32)
        self.config.padding_for("cu_seqlens", g.budget)(meta[: g.cu_size], lfm2vl_cu_seqlens(shapes))
        self.config.padding_for("gather_idx", g.budget)(meta[g.cu_size :], lfm2vl_gather_idx(shapes, self.config.factor).int())
        if torch.cuda.is_available():
            meta = meta.pin_memory()  # read-only from here on, so async uploads of it are safe
        self._meta_cache[key] = meta
        if len(self._meta_cache) > self._meta_cache_size:
            self._meta_cache.popitem(last=False)
        return meta

    def _fits(self, g: BudgetGraph, shapes: list[Shape], tokens: int) -> bool:
        """The guard: a batch larger than any captured buffer must never reach a kernel."""
        rows = sum(h * w for h, w in shapes)
        return (
            tokens <= g.budget and rows <= g.rows and len(shapes) <= self.config.slots(g.budget)
            and max(h * w for h, w in shapes) <= g.max_seqlen
        )

    def _replay(self, pixel_values: torch.Tensor, shapes: list[Shape], batch: list[int]) -> torch.Tensor | None:
        cfg = self.config
        bshapes = [shapes[i] for i in batch]
        tokens = sum(tokens_for(s, cfg.factor) for s in bshapes)
        budget = cfg.budget_for(tokens, len(batch))
        g = self.graphs.get(budget) if budget is not None else None
        if g is None or not self._fits(g, bshapes, tokens):
            self.stats.overflow += 1
            return None
        pad_pix = cfg.padding_for("pixel_values", budget)
        pad_pos = cfg.padding_for("pos_embeds", budget)
        pad_pix(g.pixel_values, [pixel_values[i, : h * w] for i, (h, w) in zip(batch, bshapes)])
        pad_pos(g.pos_embeds, [self.encoder.pos_cache.get(h, w) for h, w in bshapes])
        g.meta.copy_(self._host_meta(g, bshapes), non_blocking=True)
        single = g.single is not None and fills_one_sequence(bshapes, g.rows)
        (g.single if single else g.graph).replay()
        self.stats.single_item_replays += single
        self.stats.replays[budget] = self.stats.replays.get(budget, 0) + 1
        self.stats.real_tokens += tokens
        self.stats.padded_tokens += budget - tokens
        self.stats.hits += len(batch)
        # Clone: the buffer belongs to the graph and the next replay overwrites it.
        return g.out[:tokens].clone()

    def _eager(self, pixel_values: torch.Tensor, shapes: list[Shape], batch: list[int]) -> torch.Tensor:
        packed = pack_items(pixel_values, shapes, batch, factor=self.config.factor, pos_cache=self.encoder.pos_cache,
                            device=self.device)
        return self.encoder.forward_packed(packed)

    @torch.no_grad()
    def encode(self, inputs) -> list[torch.Tensor]:
        """Processor output (or a list of images) → per-item embeddings in input order."""
        if not isinstance(inputs, dict):
            return self.encode_images(inputs)
        pv, shapes, _ = lfm2vl_read_inputs(inputs)
        lfm2vl_check_shapes(shapes, self.encoder.max_num_patches, self.config.factor)
        pv = pv.to(self.device, non_blocking=True)  # dtype is cast while packing into the buffers
        if self.check_finite:
            check_finite_items(pv, shapes)
        f = self.config.factor
        tokens = [tokens_for(s, f) for s in shapes]
        if not self.captured:
            if self.device.type != "cuda":
                warn_once("GraphedEncoder: no CUDA device, so encode() runs the packed eager encoder (no graphs)")
            self.stats.eager_calls += 1
            out = self._eager(pv, shapes, list(range(len(shapes))))
            return list(out.split(tokens))

        batches, eager = plan_batches(tokens, max(self.config.budgets), self.config.max_items)
        results: list[torch.Tensor | None] = [None] * len(shapes)
        for batch in batches:
            out = self._replay(pv, shapes, batch)
            if out is None:  # refused by the guard: run those items eagerly instead
                out = self._eager(pv, shapes, batch)
                self.stats.misses += len(batch)
            for i, piece in zip(batch, out.split([tokens[i] for i in batch])):
                results[i] = piece
        for i in eager:
            results[i] = self._eager(pv, shapes, [i])
            self.stats.misses += 1
        return results

    def encode_images(self, images) -> list[torch.Tensor]:
        """Images (anything ``process_images`` takes) → per-item embeddings, through the processor
        the model carries (its preset's, or a loaded checkpoint's own)."""
        return self.encode(process_images(images, self.model))

    # -- plugging into transformers ----------------------------------------------------------------
    def image_features_fn(self):
        """A drop-in for ``Lfm2VlModel.get_image_features`` that uses this graphed encoder."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        def get_image_features(pixel_values, spatial_shapes, pixel_attention_mask=None, **kwargs):
            feats = self.encode({"pixel_values": pixel_values, "spatial_shapes": spatial_shapes.cpu(),
                                 "pixel_attention_mask": pixel_attention_mask})
            return BaseModelOutputWithPooling(last_hidden_state=None, pooler_output=feats)

        return get_image_features

    @contextmanager
    def installed(self, model=None):
        """Within the block, ``model`` (default: the one this encoder wraps) computes its image
        features — in ``forward`` and so in ``generate`` — with this graphed encoder."""
        model = model if model is not None else self.model
        inner = getattr(model, "model", model)
        prev = inner.__dict__.get("get_image_features")  # an earlier override, if any (nesting)
        inner.get_image_features = self.image_features_fn()
        try:
            yield model
        finally:
            if prev is None:
                del inner.get_image_features  # back to the class's own method
            else:
                inner.get_image_features = prev
