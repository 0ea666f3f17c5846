"""LFM2-VL's graph config: token budgets, the item limit, the named buffers and the padding logics
that fill them; and :class:`GraphOptions`, every setting of a graphed encoder with its one default
and its one check (:data:`SETTING_CHECKS`). The config is derived from the options once
(:meth:`EncoderGraphConfig.from_options`).

A CUDA graph replays fixed shapes, so the manager captures one graph per *budget* (output tokens
it can hold) and pads each replay's data up to the chosen budget's buffers. The model side names
its buffers (``buffer_keys``) and may give a buffer its own *padding logic* ``fn(dst, src)``: write
``src`` into the persistent ``dst`` and make the rest harmless. The manager fills each buffer
through ``padding_logics.get(key, pad_default)``, as vLLM's ``EncoderCudaGraphManager`` does
(:func:`~.manager.pad_default` is the manager's).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from ..kernels.attention import ATTENTION_BACKENDS
from .packing import MAX_NUM_PATCHES, MIN_ITEM_TOKENS
from .protocol import GraphConfig, PaddingLogic, _is_int, check_budgets, check_max_items

CU_SEQLENS_RULES = ("safe", "repeat_last")
MAX_SEQLEN_MODES = ("tight", "loose")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _check_positive(name: str):
    def check(value) -> None:
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return check


def _check_max_run_items(value) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"max_run_items must be an int >= 0 (0: no run batches), got {value!r}")


# The one check of each setting that has one, wherever a value enters (GraphOptions, or a config
# built directly); ``budgets`` and ``max_items`` are the generic config's own (:mod:`~.protocol`).
SETTING_CHECKS = {
    "cu_seqlens_rule": lambda v: check_choice("cu_seqlens_rule", v, CU_SEQLENS_RULES),
    "max_seqlen_mode": lambda v: check_choice("max_seqlen_mode", v, MAX_SEQLEN_MODES),
    "attention": lambda v: check_choice("attention", v, ("auto", *ATTENTION_BACKENDS)),
    "max_budget": _check_positive("max_budget"),
    "layout_cache_size": _check_positive("layout_cache_size"),
    "max_run_items": _check_max_run_items,
}


# --------------------------------------------------------------------------------------------
# The settings
# --------------------------------------------------------------------------------------------

# Named graph configs: the GraphOptions fields each one sets (the rest keep their defaults).
# "kit": the kit's own defaults. "pr": the encoder-graph settings vLLM PR #44930 measured LFM2-VL-3B
# with (vLLM's encoder_cudagraph_token_budgets and encoder_cudagraph_max_vision_items_per_batch).
GRAPH_CONFIGS: dict[str, dict] = {
    "kit": {},
    "pr": {"budgets": (64, 256, 512, 1024, 2048, 4096), "max_items": 16},
}


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
    on device input) and ``layout_cache_size`` (host layouts kept per batch shape: :mod:`~.staging`).
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
    # parity (data/results/nvidia-h200/archive/single-item-*.json.gz).
    dense_graphs: bool = True
    # The most 512 px images or tiles one replay carries: 8 (a 2048-token run budget), so 8 tiles run
    # as one replay with large GEMMs and 16 as two, instead of 2 or 4 replays of the largest regular
    # budget. Why not 16: on the H200 a 16-item run budget took the graphs past the memory and capture
    # time the kit allows itself (docs/goals.md) for a few percent at 16x512; the measurements are in
    # data/results/nvidia-h200/archive/floor-*-20261201-*.json.gz.
    max_run_items: int = 8
    stage_rows: bool | None = None
    check_finite: bool = False
    layout_cache_size: int = 256

    def __post_init__(self):
        if self.budgets is not None:
            object.__setattr__(self, "budgets", tuple(check_budgets(self.budgets)))
        if self.max_items is not None:
            check_max_items(self.max_items)
        for name, check in SETTING_CHECKS.items():
            check(getattr(self, name))

    @classmethod
    def named(cls, name: str, **changes) -> GraphOptions:
        """The named graph config ``name`` of :data:`GRAPH_CONFIGS`, then ``changes`` (as :meth:`with_`).

        ``"kit"`` is ``GraphOptions()``. ``"pr"`` sets only what vLLM PR #44930 set: the budgets
        64, 256, 512, 1024, 2048, 4096 and 16 items per replay; every other setting keeps the kit's
        default (the safe ``cu_seqlens`` rule, tight ``max_seqlen``, fused kernels, dense graphs,
        ``max_run_items=8``). What that captures on LFM2-VL (1024-row full-length items, 64-token
        smallest item; ``tests/test_pr_config.py`` reads it off the CPU stand-in):

        * six budgets and no run budget: 8 full-length items are 2048 tokens, which the 4096 budget
          already holds, so ``max_run_items`` changes nothing here and a pure run of 9 to 16 tiles
          is one replay of the 4096 budget (the kit's defaults carry at most 8 per replay, on their
          2048-token run budget)
        * item slots 1, 4, 8, 16, 16, 16 (``budget // 64``, at most 16; the largest takes 16)
        * variants: ``varlen`` in every budget; ``dense1`` at 64 (one 256 px item) and 256;
          ``dense2`` and ``dense1+varlen`` at 512; ``dense3``-``dense4`` and ``dense1``-``dense3+varlen``
          at 1024; ``dense5``-``dense8`` and ``dense1``-``dense7+varlen`` at 2048; ``dense9``-``dense16``
          and ``dense1``-``dense15+varlen`` at 4096: 49 graphs, against the kit's 19
        """
        if name not in GRAPH_CONFIGS:
            raise ValueError(f"unknown graph config {name!r}; the named configs are: {', '.join(GRAPH_CONFIGS)}")
        return cls().with_(**GRAPH_CONFIGS[name]).with_(**changes)

    def with_(self, **changes) -> GraphOptions:
        """A copy with ``changes``; an unknown name is a ``TypeError`` naming the settings."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown graph setting(s) {sorted(unknown)}; the settings are "
                            f"{[f.name for f in fields(self)]}")
        return replace(self, **changes)


# --------------------------------------------------------------------------------------------
# Padding logics
# --------------------------------------------------------------------------------------------


def pad_cu_seqlens_repeat_last(dst: torch.Tensor, src: torch.Tensor) -> None:
    """vLLM's padding of ``cu_seqlens``: trailing entries repeat the last offset (zero-length
    trailing sequences). ``src`` is a host tensor (its last value is read on the host)."""
    n = src.shape[0]
    if n > dst.shape[0]:
        raise ValueError(f"cu_seqlens: {n} entries do not fit a buffer of {dst.shape[0]}")
    dst[:n].copy_(src, non_blocking=True)
    if n < dst.shape[0]:
        dst[n:].fill_(int(src[-1]))


def safe_cu_seqlens(cu: torch.Tensor, total_rows: int, max_seqlen: int) -> torch.Tensor:
    """The ``"safe"`` rule: ``cu`` (host offsets) followed by dummy sequences, each at most
    ``max_seqlen`` rows, that cover the padded rows up to ``total_rows``.

    With vLLM's rule alone, ``cu_seqlens[-1]`` counts only the real rows, and the padded rows the
    buffers pass to the kernel belong to no sequence: FlashAttention 3/4 then left them unwritten
    and NaN reached the embeddings (vLLM issue #57136). Here every row is computed by the kernel;
    repeat-last padding after it adds only zero-length sequences past the end.
    """
    end = int(cu[-1])
    dummies = list(range(end + max_seqlen, total_rows, max_seqlen)) + ([total_rows] if end < total_rows else [])
    return torch.cat([cu, torch.tensor(dummies, dtype=cu.dtype)]) if dummies else cu


# --------------------------------------------------------------------------------------------
# Budgets
# --------------------------------------------------------------------------------------------


def auto_budgets(min_item_tokens: int, max_tokens: int) -> list[int]:
    """Double from ``min_item_tokens`` up to ``max_tokens``, always ending at ``max_tokens``.

    >>> auto_budgets(64, 1024)
    [64, 128, 256, 512, 1024]
    >>> auto_budgets(64, 800)
    [64, 128, 256, 512, 800]
    """
    if min_item_tokens <= 0 or max_tokens <= 0:
        raise ValueError(f"budget bounds must be positive, got min={min_item_tokens}, max={max_tokens}")
    if min_item_tokens > max_tokens:
        raise ValueError(f"min budget {min_item_tokens} exceeds max budget {max_tokens}")
    out, b = [], min_item_tokens
    while b < max_tokens:
        out.append(b)
        b *= 2
    out.append(max_tokens)
    return out


def auto_max_items(budgets: list[int], min_item_tokens: int) -> int:
    """vLLM's automatic item limit: min(max_budget // min_item_tokens, min(budgets)), at least 1."""
    return max(1, min(max(budgets) // min_item_tokens, min(budgets)))


# --------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------


@dataclass
class EncoderGraphConfig(GraphConfig):
    """LFM2-VL's graph config: :class:`~.protocol.GraphConfig` (``budgets``, ``max_items``,
    ``out_hidden_size``, ``buffer_keys``, ``padding_logics``) with the packed encoder's geometry.

    * ``buffer_keys``: ``pixel_values``, ``pos_embeds``, ``cu_seqlens``, ``gather_idx``
    * ``padding_logics``: LFM2-VL's, as in vLLM: ``cu_seqlens`` repeats its last offset
    * ``min_item_tokens``: the fewest tokens a real item has (the processor's ``min_image_tokens``);
      it sizes each budget's item slots (see :meth:`slots`) and the automatic item limit
    * ``cu_seqlens_rule``: ``"safe"`` (default: :func:`safe_cu_seqlens`) or vLLM's ``"repeat_last"``
    * ``max_seqlen_mode``: ``"tight"`` (default: the largest item a budget can hold, never above the
      patch limit) or vLLM's ``"loose"`` (4·budget). ``max_seqlen`` is baked into each graph's
      attention kernel at capture: a per-budget constant, not a buffer

    :meth:`from_options` derives it from a :class:`GraphOptions` and the model's limits, as
    ``GraphedEncoder`` does; :meth:`build` fills in the automatic budgets from keywords.
    """

    buffer_keys: tuple[str, ...] = ("pixel_values", "pos_embeds", "cu_seqlens", "gather_idx")
    padding_logics: dict[str, PaddingLogic] = field(default_factory=lambda: {"cu_seqlens": pad_cu_seqlens_repeat_last})
    max_num_patches: int = MAX_NUM_PATCHES
    factor: int = 2
    min_item_tokens: int = MIN_ITEM_TOKENS
    cu_seqlens_rule: str = GraphOptions.cu_seqlens_rule
    max_seqlen_mode: str = GraphOptions.max_seqlen_mode

    # the settings this config carries beyond the generic ones (each checked by SETTING_CHECKS)
    SETTINGS = ("cu_seqlens_rule", "max_seqlen_mode")

    def __post_init__(self):
        super().__post_init__()
        for name in self.SETTINGS:
            SETTING_CHECKS[name](getattr(self, name))

    @classmethod
    def build(cls, out_hidden_size: int, budgets=None, max_items=None, min_item_tokens: int = MIN_ITEM_TOKENS,
              max_tokens: int | None = None, **kw):
        """Automatic budgets (doubling from ``min_item_tokens`` up to ``max_tokens``) where ``budgets``
        is None; the automatic item limit where ``max_items`` is None (:meth:`auto_max_items`)."""
        if budgets is None:
            budgets = auto_budgets(min_item_tokens, max_tokens if max_tokens is not None else GraphOptions.max_budget)
        return cls(budgets=budgets, max_items=max_items, out_hidden_size=out_hidden_size,
                   min_item_tokens=min_item_tokens, **kw)

    @classmethod
    def from_options(cls, options: GraphOptions, out_hidden_size: int, *, min_item_tokens: int,
                     max_num_patches: int, factor: int):
        """The config ``options`` give a model whose items have at least ``min_item_tokens`` tokens and
        ``max_num_patches`` rows: the one derivation of the config from the options."""
        return cls.build(out_hidden_size, budgets=options.budgets, max_items=options.max_items,
                         min_item_tokens=min_item_tokens, max_tokens=options.max_budget,
                         max_num_patches=max_num_patches, factor=factor,
                         **{name: getattr(options, name) for name in cls.SETTINGS})

    def auto_max_items(self) -> int:
        """vLLM's automatic item limit: min(max_budget // min_item_tokens, min(budgets)), at least 1."""
        return auto_max_items(self.budgets, self.min_item_tokens)

    @property
    def run_tokens(self) -> int:
        """Output tokens of a full-length item (``max_num_patches`` rows: a 512 px image or tile):
        256 for LFM2-VL. A pure run of them replays a dense graph that pads nothing (:mod:`~.dense`),
        which ``plan_stats`` counts; runs past ``max_items`` need a run budget (:mod:`~.dense`)."""
        return self.max_num_patches // self.factor**2

    def describe(self, budget: int) -> dict:
        return {"rows": self.rows(budget), "max_seqlen": self.max_seqlen(budget)}

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
        profiles before and after, ``data/results/nvidia-h200/archive/slots-*.json.gz``).
        """
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

    def cu_seqlens_source(self, budget: int, cu: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """Host offsets ``cu`` as the ``cu_seqlens`` source under the config's rule: the safe rule
        appends dummy sequences up to the rows the varlen kernel is given (``rows``, default the
        budget's); then the buffer's padding logic repeats the last offset."""
        if self.cu_seqlens_rule == "safe":
            return safe_cu_seqlens(cu, self.rows(budget) if rows is None else rows, self.max_seqlen(budget))
        return cu
