"""Dense graphs and the run budget: an optimisation on top of LFM2-VL's varlen graphs.

Each budget captures several *variants* of the body on the same buffers (each a
:class:`~.lfm2vl.Variant`); the host picks one per replay from the patch grids it already has (no sync):

* ``varlen``          every row through varlen attention over ``cu_seqlens`` (any batch: the seed)
* ``dense{k}``        a batch of exactly k full-length items (L rows each, L = ``dense_rows``: 1024
                      for 512 px images and tiles): batched dense SDPA on (k, heads, L, d), and the
                      graph runs only those k·L rows, so it pads nothing
* ``dense{k}+varlen`` k full-length items, then a ragged rest: dense SDPA on the first k·L rows,
                      varlen on the rest (``cu_seqlens`` then describes only the rest)

Why: inside a graph, cuDNN's dense attention on equal-length items ran at about half the time of
FlashAttention-2's varlen kernel on the H200 (``python -m lfm2vl_lab attention``), and replay sorts
items largest first, so batches start with their full-length items. Only the variants the config
can route a batch to are captured (:meth:`DenseLfm2VlGraphModel.graph_variants`).

The run budget (:class:`DenseGraphConfig`): with ``max_run_items`` > 0, that many full-length items
may share one replay when the batch holds nothing else. If that is more tokens than the largest
budget, one more graph budget holds them; its graphs run only ``dense{k}`` over exactly the items
given, so 8 tiles make one replay with large GEMMs, not two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.attention import dense_attention
from .config import EncoderGraphConfig, GraphOptions
from .lfm2vl import VARLEN, Lfm2VlGraphModel, Variant
from .packing import Shape, lfm2vl_cu_seqlens, lfm2vl_gather_idx


def leading_full_items(shapes, rows: int) -> int:
    """How many items at the start of a batch have exactly ``rows`` patch rows."""
    n = 0
    for h, w in shapes:
        if h * w != rows:
            break
        n += 1
    return n


@dataclass
class DenseGraphConfig(EncoderGraphConfig):
    """The graph config with runs of full-length items. ``max_run_items``: the most *full-length*
    items (``max_num_patches`` rows each: a 512 px image or tile) one replay may carry when the batch
    holds nothing else (0: no such batches). If that is more tokens than the largest budget, one more
    graph budget, :attr:`run_budget`, holds them."""

    max_run_items: int = GraphOptions.max_run_items

    SETTINGS = (*EncoderGraphConfig.SETTINGS, "max_run_items")

    @property
    def run_items(self) -> int:
        """The planner's run limit: ``max_run_items`` where a run budget holds them, else 0 (a run
        would only grow past ``max_items``, which no graph has the slots for)."""
        return self.max_run_items if self.run_budget is not None else 0

    @property
    def run_budget(self) -> int | None:
        """The extra budget for pure runs longer than the largest budget holds (None if none)."""
        return self._derived()[0]

    @property
    def graph_budgets(self) -> list[int]:
        """Every budget that gets graphs: ``budgets``, then :attr:`run_budget` if there is one."""
        return self._derived()[1]

    def _derived(self) -> tuple:
        """(run_budget, graph_budgets), recomputed only when a field they follow changed: every
        replay asks for them, so they are not rebuilt per call."""
        key = (tuple(self.budgets), self.max_run_items, self.max_num_patches, self.factor)
        cached = self.__dict__.get("_derived_cache")
        if cached is None or cached[0] != key:
            # no run budget where full-length items do not fit the largest budget (they run eagerly)
            b, top = self.max_run_items * self.run_tokens, max(self.budgets)
            run = b if self.max_run_items and b > top and self.run_tokens <= top else None
            cached = (key, (run, list(self.budgets) + ([run] if run else [])))
            self.__dict__["_derived_cache"] = cached
        return cached[1]

    def slots(self, budget: int) -> int:
        return self.max_run_items if budget == self.run_budget else super().slots(budget)

    def dense_rows(self, budget: int) -> int:
        """Rows of the one item length a budget's dense graphs take (``max_seqlen`` of the tight mode,
        whatever the mode): one 256 px item at 64 tokens, 512 px tiles from 256 tokens on."""
        return min(self.rows(budget), self.max_num_patches)

    def dense_blocks(self, budget: int) -> int:
        """The most items of :meth:`dense_rows` rows one replay of this budget can carry."""
        return min(self.slots(budget), self.rows(budget) // self.dense_rows(budget))


class DenseLfm2VlGraphModel(Lfm2VlGraphModel):
    """:class:`~.lfm2vl.Lfm2VlGraphModel` with the dense variants of each budget's graph (and a
    :class:`DenseGraphConfig`). A body other than the packed encoder itself gets only ``varlen``."""

    config: DenseGraphConfig

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._attn: dict = {}

    @property
    def variants(self) -> tuple[Variant, ...]:
        """Every variant some budget captures (``varlen`` first, then by dense items)."""
        return tuple(sorted({v for b in self.config.graph_budgets for v in self.graph_variants(b)}))

    def graph_variants(self, budget: int) -> tuple[Variant, ...]:
        """``varlen`` (not in the run budget, which takes only pure runs), ``dense{k}`` for each k
        whose pure run ``budget_for`` sends here, and ``dense{k}+varlen`` for each k that leaves rows
        for a rest."""
        cfg = self.config
        if self.body is not self.encoder:
            return (VARLEN,)
        rows, item_rows = cfg.rows(budget), cfg.dense_rows(budget)
        item_tokens = item_rows // cfg.factor**2
        ks = range(1, cfg.dense_blocks(budget) + 1)
        pure = [Variant(k, False) for k in ks if cfg.budget_for(k * item_tokens, k) == budget]
        if budget == cfg.run_budget:
            return tuple(pure)
        return (VARLEN, *pure, *(Variant(k, True) for k in ks if k * item_rows < rows))

    def computed_rows(self, budget: int, variant: Variant) -> int:
        """Patch rows one replay of a variant computes: all of the budget's, or only a pure run's items."""
        return self.config.rows(budget) if variant.varlen else variant.dense * self.config.dense_rows(budget)

    def varlen_rows(self, budget: int, variant: Variant) -> int:
        """Rows the varlen kernel of a variant is given (0 for a pure dense run)."""
        if not variant.varlen:
            return 0
        return self.computed_rows(budget, variant) - variant.dense * self.config.dense_rows(budget)

    def computed_tokens(self, budget: int, variant: Variant) -> int:
        return self.computed_rows(budget, variant) // self.config.factor**2

    def dummy_varlen_rows(self, budget: int) -> int:
        return min((self.varlen_rows(budget, v) for v in self.graph_variants(budget) if v.varlen),
                   default=self.config.rows(budget))

    def _attention(self, budget: int, variant: Variant):
        """The attention function of a dense variant (cached per shape, device and dtype)."""
        key = (variant, self.config.dense_rows(budget), self.device, self.dtype)  # a recapture may change both
        if key not in self._attn:
            self._attn[key] = dense_attention(variant.dense, self.config.dense_rows(budget),
                                              self.encoder.attention_fn() if variant.varlen else None)
        return self._attn[key]

    def forward_on_buffers(self, buffers: dict[str, torch.Tensor], budget: int, variant: Variant) -> torch.Tensor:
        if variant == VARLEN:
            return super().forward_on_buffers(buffers, budget, variant)
        rows = self.computed_rows(budget, variant)
        return self.body(buffers["pixel_values"][:rows], buffers["pos_embeds"][:rows], buffers["cu_seqlens"],
                         self.config.max_seqlen(budget), buffers["gather_idx"][:rows],
                         attn=self._attention(budget, variant))

    def fits(self, budget: int, shapes: tuple[Shape, ...]) -> bool:
        """The seed's guard, and the run budget takes only pure runs of full-length items."""
        cfg = self.config
        if budget == cfg.run_budget and leading_full_items(shapes, cfg.dense_rows(budget)) != len(shapes):
            return False
        return super().fits(budget, shapes)

    def variant_for(self, budget: int, shapes: tuple[Shape, ...]) -> Variant:
        """``dense{k}`` for a pure run of k full-length items, ``dense{k}+varlen`` for k of them then a
        rest, else ``varlen``."""
        captured = self.graph_variants(budget)
        k = leading_full_items(shapes, self.config.dense_rows(budget))
        for variant in ((Variant(k, k < len(shapes)) if k else VARLEN), VARLEN):
            if variant in captured:
                return variant
        raise ValueError(f"no {budget}-token graph variant takes patch grids {shapes} "
                         f"(captured: {[v.name for v in captured]})")

    def layout(self, budget: int, variant: Variant, shapes: tuple[Shape, ...]) -> dict[str, torch.Tensor]:
        """``cu_seqlens`` describes the rows the varlen kernel sees: all of them for ``varlen``, the
        rest after the dense items for ``dense{k}+varlen``; a pure ``dense{k}`` reads none (left out)."""
        k, cfg = variant.dense, self.config
        out = {"gather_idx": lfm2vl_gather_idx(list(shapes), cfg.factor).int()}
        if variant.varlen:
            cu = lfm2vl_cu_seqlens(list(shapes[k:])) if k < len(shapes) else torch.zeros(1, dtype=torch.int32)
            out["cu_seqlens"] = cfg.cu_seqlens_source(budget, cu, self.varlen_rows(budget, variant))
        return out
