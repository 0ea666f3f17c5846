"""Graph config: token budgets, the item limit, and the padding logics that fill graph buffers.

A CUDA graph replays fixed shapes, so the manager captures one graph per *budget* (output tokens
it can hold) and pads each replay's data up to the chosen budget's buffers. How a buffer is padded
is a *padding logic* ``fn(dst, src)``: it writes ``src`` into the persistent ``dst`` and makes the
rest harmless. This module holds those rules and the config object that names them per buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import torch

from ..kernels.attention import ATTENTION_BACKENDS
from .packing import MAX_NUM_PATCHES, MIN_IMAGE_TOKENS

PaddingLogic = Callable[[torch.Tensor, torch.Tensor], None]


# --------------------------------------------------------------------------------------------
# Padding logics
# --------------------------------------------------------------------------------------------


def pad_default(dst: torch.Tensor, src) -> None:
    """Write ``src`` into the prefix of ``dst`` and zero the rest; 0-dim buffers are copied directly.

    ``src`` may be a tensor or a list of tensors (concatenated into the prefix in one kernel, so
    per-item pieces need no temporary). Zeroing only the tail is equivalent to vLLM's "zero the
    buffer, then copy" and writes fewer bytes.
    """
    if dst.dim() == 0:
        dst.copy_(src)
        return
    n = sum(t.shape[0] for t in src) if isinstance(src, (list, tuple)) else src.shape[0]
    if n > dst.shape[0]:
        raise ValueError(f"padding: {n} rows do not fit a buffer of {dst.shape[0]} rows (shape {tuple(dst.shape)})")
    if isinstance(src, (list, tuple)) and len(src) > 1:
        torch.cat(list(src), out=dst[:n])
    else:  # one piece: a plain (casting) copy, no cat
        dst[:n].copy_(src[0] if isinstance(src, (list, tuple)) else src, non_blocking=True)
    if n < dst.shape[0]:  # a full buffer has no tail: skip the launch
        dst[n:].zero_()


def pad_cu_seqlens_repeat_last(dst: torch.Tensor, src: torch.Tensor) -> None:
    """vLLM's rule: trailing entries repeat the last offset (zero-length trailing sequences).

    ``cu_seqlens[-1]`` then counts only the real rows, not the rows the buffers pass to the
    kernel: the padded rows belong to no sequence. That is the pattern behind vLLM issue #57136
    (NaN embeddings with FlashAttention 3/4).
    """
    n = src.shape[0]
    if n > dst.shape[0]:
        raise ValueError(f"cu_seqlens: {n} entries do not fit a buffer of {dst.shape[0]}")
    dst[:n].copy_(src)
    dst[n:].fill_(int(src[-1]))


def make_pad_cu_seqlens_safe(total_rows: int, max_seqlen: int) -> PaddingLogic:
    """The safe rule: trailing dummy sequences, each at most ``max_seqlen`` rows, cover the padded
    rows, so ``cu_seqlens[-1]`` equals the rows actually passed (``total_rows``) and every row is
    computed by the kernel (no row is left unwritten; vLLM issue #57136). Remaining slots repeat
    ``total_rows`` (zero-length sequences after the end)."""

    def pad_cu_seqlens_safe(dst: torch.Tensor, src: torch.Tensor) -> None:
        n, end = src.shape[0], int(src[-1])
        dummies = list(range(end + max_seqlen, total_rows, max_seqlen)) + ([total_rows] if end < total_rows else [])
        if n + len(dummies) > dst.shape[0]:
            raise ValueError(
                f"cu_seqlens: {n} entries plus {len(dummies)} dummy sequences do not fit a buffer of {dst.shape[0]}"
            )
        dst[:n].copy_(src)
        dst[n : n + len(dummies)] = torch.tensor(dummies, dtype=dst.dtype)
        dst[n + len(dummies) :].fill_(total_rows)

    return pad_cu_seqlens_safe


CU_SEQLENS_RULES = ("safe", "repeat_last")
MAX_SEQLEN_MODES = ("tight", "loose")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


# --------------------------------------------------------------------------------------------
# The settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphOptions:
    """Every setting of a graphed encoder, each with its one name and its one default. The command
    line builds one, the benchmark records it per row, ``GraphedEncoder(model, options)`` reads it.

    Graph config (:class:`EncoderGraphConfig` explains each): ``budgets`` (None: doubling from the
    processor's smallest item up to ``max_budget``), ``max_items`` (None: vLLM's automatic limit),
    ``cu_seqlens_rule``, ``max_seqlen_mode``. Encoder (:class:`~.encoder.PackedVisionEncoder`):
    the ``attention`` backend, ``fuse_qkv``, ``fuse_elementwise``. Beyond the seed: ``dense_graphs``
    and ``max_run_items`` (:mod:`~.dense`), ``stage_rows`` (:mod:`~.staging`; None: on when the
    model is on CUDA), ``check_finite`` (refuse NaN/Inf pixel values, at one device sync per call
    on device input) and ``meta_cache_size`` (the host layouts kept per batch shape).
    """

    budgets: tuple[int, ...] | None = None
    # The largest automatic budget: four 512 px images (4 × 256 tokens) in one replay.
    max_budget: int = 1024
    max_items: int | None = None
    cu_seqlens_rule: str = "safe"
    max_seqlen_mode: str = "tight"
    attention: str = "auto"
    # One q/k/v GEMM per layer, and the residual add + LayerNorm and bias + GELU fused: each changes
    # only rounding, and each was faster on the H200 (docs/results.md, the kernel-options table).
    fuse_qkv: bool = True
    fuse_elementwise: bool = True
    # Dense graphs: their one-item case made one 512 px or 256 px image faster on the H200 at the same
    # parity (data/results/nvidia-h200/single-item-*.json).
    dense_graphs: bool = True
    # The most 512 px images or tiles one replay carries: 8 (a 2048-token run budget), so 8 tiles run
    # as one replay with large GEMMs and 16 as two, instead of 2 or 4 replays of the largest regular
    # budget. Why not 16: on the H200 a 16-item run budget made the 450M graphs hold 1005 MiB and the
    # 1.6B ones 1663 MiB, captured in 3.03 s (floor-*-20261201-*.json), against the 1 GiB and 3 s the
    # kit allows itself, for 3% at 16x512 (7.03 ms in one replay; 8x512 took 3.64).
    max_run_items: int = 8
    stage_rows: bool | None = None
    check_finite: bool = False
    meta_cache_size: int = 256

    def __post_init__(self):
        if self.budgets is not None:
            object.__setattr__(self, "budgets", tuple(check_budgets(self.budgets)))
        check_choice("cu_seqlens_rule", self.cu_seqlens_rule, CU_SEQLENS_RULES)
        check_choice("max_seqlen_mode", self.max_seqlen_mode, MAX_SEQLEN_MODES)
        check_choice("attention", self.attention, ("auto", *ATTENTION_BACKENDS))
        for name in ("max_budget", "meta_cache_size"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not _is_int(self.max_run_items) or self.max_run_items < 0:
            raise ValueError(f"max_run_items must be an int >= 0 (0: no run batches), got {self.max_run_items!r}")

    def with_(self, **changes) -> GraphOptions:
        """A copy with ``changes``; an unknown name is a ``TypeError`` naming the settings."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown graph setting(s) {sorted(unknown)}; the settings are "
                            f"{[f.name for f in fields(self)]}")
        return replace(self, **changes)

    def config(self, out_hidden_size: int, min_tokens: int, max_num_patches: int, factor: int,
               runs: bool = True) -> EncoderGraphConfig:
        """The graph config these settings give a model with these limits. ``runs=False``: no run
        budget (a body without dense graphs cannot run one)."""
        return EncoderGraphConfig.build(
            out_hidden_size, budgets=self.budgets, max_items=self.max_items, min_tokens=min_tokens,
            max_tokens=self.max_budget, max_num_patches=max_num_patches, factor=factor,
            cu_seqlens_rule=self.cu_seqlens_rule, max_seqlen_mode=self.max_seqlen_mode,
            max_run_items=self.max_run_items if runs and self.dense_graphs else 0)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------------------------
# Budgets
# --------------------------------------------------------------------------------------------


def auto_budgets(min_tokens: int, max_tokens: int) -> list[int]:
    """Double from ``min_tokens`` up to ``max_tokens``, always ending at ``max_tokens``.

    >>> auto_budgets(64, 1024)
    [64, 128, 256, 512, 1024]
    >>> auto_budgets(64, 800)
    [64, 128, 256, 512, 800]
    """
    if min_tokens <= 0 or max_tokens <= 0:
        raise ValueError(f"budget bounds must be positive, got min={min_tokens}, max={max_tokens}")
    if min_tokens > max_tokens:
        raise ValueError(f"min budget {min_tokens} exceeds max budget {max_tokens}")
    out, b = [], min_tokens
    while b < max_tokens:
        out.append(b)
        b *= 2
    out.append(max_tokens)
    return out


def check_budgets(budgets) -> list[int]:
    budgets = list(budgets)
    if not budgets:
        raise ValueError("budgets must not be empty")
    for b in budgets:
        if not isinstance(b, int) or isinstance(b, bool) or b <= 0:
            raise ValueError(f"every budget must be a positive int, got {b!r} in {budgets}")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets contain duplicates: {budgets}")
    return sorted(budgets)


def auto_max_items(budgets: list[int], min_tokens: int) -> int:
    """vLLM's automatic item limit: min(max_budget // min_tokens, min(budgets)), at least 1."""
    return max(1, min(max(budgets) // min_tokens, min(budgets)))


@dataclass
class EncoderGraphConfig:
    """What the model side tells the graph manager (vLLM's ``EncoderCudaGraphConfig`` in spirit).

    * ``budgets``: output tokens per captured graph (sorted ascending)
    * ``max_items``: the most encoder items one replay packs; must be ≤ min(budgets)
    * ``min_item_tokens``: the fewest tokens a real item has (the processor's ``min_image_tokens``);
      it sizes each budget's item slots (see :meth:`slots`)
    * ``cu_seqlens_rule``: ``"safe"`` (default) or vLLM's ``"repeat_last"``
    * ``max_seqlen_mode``: ``"tight"`` (default: the largest item a budget can hold, never above the
      patch limit) or vLLM's ``"loose"`` (4·budget)
    * ``out_hidden_size``: the width of the rows the graphs write
    * ``padding_logics``: per buffer key, a padding logic that replaces the default for that buffer
    * ``max_run_items``: the most *full-length* items (``max_num_patches`` rows each: a 512 px image
      or tile) one replay may carry when the batch holds nothing else (0: no such batches). If that
      is more tokens than the largest budget, one more graph budget, :attr:`run_budget`, holds them:
      its graphs run only dense attention over exactly the items given, so it pads nothing
    """

    budgets: list[int]
    max_items: int
    out_hidden_size: int
    max_num_patches: int = MAX_NUM_PATCHES
    factor: int = 2
    min_item_tokens: int = MIN_IMAGE_TOKENS
    cu_seqlens_rule: str = GraphOptions.cu_seqlens_rule
    max_seqlen_mode: str = GraphOptions.max_seqlen_mode
    padding_logics: dict[str, PaddingLogic] = field(default_factory=dict)
    max_run_items: int = 0

    def __post_init__(self):
        self.budgets = check_budgets(self.budgets)
        if not isinstance(self.max_items, int) or self.max_items < 1:
            raise ValueError(f"max_items must be a positive int, got {self.max_items!r}")
        if self.max_items > min(self.budgets):
            raise ValueError(
                f"max_items={self.max_items} breaks the invariant max_items <= min(budgets)={min(self.budgets)}: "
                "the smallest graph could be asked to hold more items than it has tokens"
            )
        check_choice("cu_seqlens_rule", self.cu_seqlens_rule, CU_SEQLENS_RULES)
        check_choice("max_seqlen_mode", self.max_seqlen_mode, MAX_SEQLEN_MODES)
        if not _is_int(self.max_run_items) or self.max_run_items < 0:
            raise ValueError(f"max_run_items must be an int >= 0 (0: no run batches), got {self.max_run_items!r}")

    @classmethod
    def build(cls, out_hidden_size: int, budgets=None, max_items=None, min_tokens: int = MIN_IMAGE_TOKENS,
              max_tokens: int | None = None, **kw) -> EncoderGraphConfig:
        """Fill in automatic budgets (doubling from ``min_tokens``) and the automatic item limit."""
        if budgets is None:
            budgets = auto_budgets(min_tokens, max_tokens if max_tokens is not None else GraphOptions.max_budget)
        budgets = check_budgets(budgets)
        if max_items is None:
            max_items = auto_max_items(budgets, min_tokens)
        return cls(budgets=budgets, max_items=max_items, out_hidden_size=out_hidden_size,
                   min_item_tokens=min_tokens, **kw)

    # -- runs of full-length items ----------------------------------------------------------------
    @property
    def run_tokens(self) -> int:
        """Output tokens of a full-length item (``max_num_patches`` rows): 256 for LFM2-VL."""
        return self.max_num_patches // self.factor**2

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

    # -- per-budget geometry ---------------------------------------------------------------------
    def rows(self, budget: int) -> int:
        """Patch rows a budget's buffers hold (each output token is factor² rows)."""
        return budget * self.factor**2

    def slots(self, budget: int) -> int:
        """Items a budget's graph can take: ``budget // min_item_tokens`` (at least 1, at most
        ``max_items``); the largest budget always takes ``max_items``, so every planned batch fits it.

        Why not ``max_items`` everywhere: the varlen attention kernel launches thread blocks for
        every sequence slot in ``cu_seqlens``, empty or not, so a one-image replay of a graph with
        16 slots ran its attention slower than eager on the H200 (docs/results.md compares the
        profiles before and after, ``data/results/nvidia-h200/slots-*.json``).
        """
        if budget == self.run_budget:
            return self.max_run_items
        if budget == max(self.budgets):
            return self.max_items
        return max(1, min(self.max_items, budget // self.min_item_tokens))

    def cu_size(self, budget: int) -> int:
        """slots+1 offsets, plus room for the safe rule's dummy sequences (each ≤ max_seqlen rows)."""
        return self.slots(budget) + 1 + -(-self.rows(budget) // self.max_seqlen(budget))

    def max_seqlen(self, budget: int) -> int:
        if self.max_seqlen_mode == "loose":
            return self.rows(budget)
        return min(self.rows(budget), self.max_num_patches)

    def dense_rows(self, budget: int) -> int:
        """Rows of the one item length a budget's dense graphs take (``max_seqlen`` of the tight mode,
        whatever the mode): one 256 px item at 64 tokens, 512 px tiles from 256 tokens on."""
        return min(self.rows(budget), self.max_num_patches)

    def dense_blocks(self, budget: int) -> int:
        """The most items of :meth:`dense_rows` rows one replay of this budget can carry."""
        return min(self.slots(budget), self.rows(budget) // self.dense_rows(budget))

    def padding_for(self, key: str, budget: int, rows: int | None = None) -> PaddingLogic:
        """The padding logic of buffer ``key``. ``rows``: for ``cu_seqlens``, the rows the varlen
        kernel is given when that is fewer than the budget's (the ragged rest after dense items)."""
        if key in self.padding_logics:
            return self.padding_logics[key]
        if key == "cu_seqlens":
            if self.cu_seqlens_rule == "safe":
                return make_pad_cu_seqlens_safe(self.rows(budget) if rows is None else rows, self.max_seqlen(budget))
            return pad_cu_seqlens_repeat_last
        return pad_default

    def budget_for(self, tokens: int, items: int = 1) -> int | None:
        """The smallest budget that holds ``tokens`` in ``items`` items, or None if none does (the run
        budget holds only pure runs of full-length items: its model refuses anything else)."""
        for b in self.graph_budgets:
            if tokens <= b and items <= self.slots(b):
                return b
        return None
