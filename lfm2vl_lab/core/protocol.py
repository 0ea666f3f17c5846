"""The contract between a model and the generic graph manager: what a model provides, and the small
config the manager reads (vLLM: ``SupportsEncoderCudaGraph`` and ``EncoderCudaGraphConfig``).

* :class:`GraphConfig` — the budgets, the item limit, the output width, the named buffers and their
  padding logics, and the limits the planner reads (:meth:`GraphConfig.plan`)
* :class:`EncoderGraphModel` — the protocol (``typing.runtime_checkable``: ``isinstance`` checks it,
  and the manager refuses a model that lacks a member, naming it)
* :class:`GraphModelDefaults` — the protocol's two trivial members, for a model that needs nothing there
* :class:`Replay` — what the model hands over per replay; :func:`pad_default` — the default padding logic

Nothing here knows LFM2-VL: :mod:`~.lfm2vl` is its side, and ``tests/test_manager.py`` has a toy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from .plan import plan_batches

PaddingLogic = Callable[[torch.Tensor, Any], None]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_budgets(budgets) -> list[int]:
    """``budgets`` sorted, or a ``ValueError`` naming what is wrong with them."""
    budgets = list(budgets)
    if not budgets:
        raise ValueError("budgets must not be empty")
    for b in budgets:
        if not _is_int(b) or b <= 0:
            raise ValueError(f"every budget must be a positive int, got {b!r} in {budgets}")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets contain duplicates: {budgets}")
    return sorted(budgets)


def check_max_items(max_items) -> None:
    if not _is_int(max_items) or max_items < 1:
        raise ValueError(f"max_items must be a positive int, got {max_items!r}")


@dataclass
class GraphConfig:
    """What the manager reads of a model's graphs (vLLM's ``EncoderCudaGraphConfig``, with the budgets).

    * ``budgets``: output tokens per captured graph (sorted ascending)
    * ``max_items``: the most items one replay packs; must be ≤ min(budgets) (None:
      :meth:`auto_max_items`)
    * ``out_hidden_size``: the width of the rows the graphs write (the manager's output buffer)
    * ``buffer_keys``: the persistent input buffers every graph reads, by name
    * ``padding_logics``: per buffer key, the padding logic ``fn(dst, src)`` that replaces
      :func:`pad_default`

    A model with more geometry subclasses it (LFM2-VL: :class:`~.config.EncoderGraphConfig`) and
    overrides :meth:`auto_max_items`, :attr:`graph_budgets`, :meth:`slots`, :attr:`run_tokens`,
    :attr:`run_items` and :meth:`describe`; the defaults describe one graph set with ``max_items``
    slots each and no runs.
    """

    budgets: list[int]
    max_items: int | None
    out_hidden_size: int
    buffer_keys: tuple[str, ...] = ()
    padding_logics: dict[str, PaddingLogic] = field(default_factory=dict)

    def __post_init__(self):
        self.budgets = check_budgets(self.budgets)
        if self.max_items is None:
            self.max_items = self.auto_max_items()
        check_max_items(self.max_items)
        if self.max_items > min(self.budgets):
            raise ValueError(
                f"max_items={self.max_items} breaks the invariant max_items <= min(budgets)={min(self.budgets)}: "
                "the smallest graph could be asked to hold more items than it has tokens"
            )
        unknown = set(self.padding_logics) - set(self.buffer_keys)
        if unknown:
            raise ValueError(f"padding_logics name buffers {sorted(unknown)} that are not in buffer_keys "
                             f"{list(self.buffer_keys)}")

    def auto_max_items(self) -> int:
        """The item limit when none is given: ``min(budgets)``, the most the invariant allows."""
        return min(self.budgets)

    @property
    def graph_budgets(self) -> list[int]:
        """Every budget that gets graphs (ascending)."""
        return self.budgets

    def slots(self, budget: int) -> int:
        """Items a budget's graph can take."""
        return self.max_items

    @property
    def run_tokens(self) -> int | None:
        """The tokens of the items that may form a *run* (a batch past ``max_items``; None: no runs)."""
        return None

    @property
    def run_items(self) -> int:
        """The most items a run may hold (0: no runs)."""
        return 0

    def describe(self, budget: int) -> dict:
        """What ``capture_info`` reports of a budget's geometry."""
        return {}

    def budget_for(self, tokens: int, items: int = 1) -> int | None:
        """The smallest graph budget that holds ``tokens`` in ``items`` items, or None if none does."""
        for b in self.graph_budgets:
            if tokens <= b and items <= self.slots(b):
                return b
        return None

    def plan(self, tokens: list[int]) -> tuple[list[list[int]], list[int]]:
        """:func:`~.plan.plan_batches` under this config's limits: (replay batches, items left to eager)."""
        return plan_batches(tokens, max(self.budgets), self.max_items, self.run_tokens, self.run_items)


@dataclass
class Replay:
    """One replay, as the model describes it: ``sources`` (per buffer key, what the key's padding
    logic writes into the buffer; a key left out keeps what the buffer holds), the graph ``variant``
    and the output rows it computes (``tokens``: the padding stats count the difference to the
    real tokens)."""

    sources: dict[str, Any]
    variant: Hashable
    tokens: int


def pad_default(dst: torch.Tensor, src) -> None:
    """The default padding logic (vLLM's ``_copy_padded_buffer``): write ``src`` into the prefix of
    ``dst`` and zero the rest; 0-dim buffers are copied directly.

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


@runtime_checkable
class EncoderGraphModel(Protocol):
    """What a model provides to get encoder CUDA graphs (vLLM: ``SupportsEncoderCudaGraph``): twelve
    members, every one the manager uses. A graph *variant* is any hashable value whose ``str()``
    names it (in ``stats.variant_replays`` and each ``capture_info`` row)."""

    config: GraphConfig

    @property
    def device(self) -> torch.device:
        """Where the model is now (the graphs, the buffers and the output buffer live there)."""

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype now (the output buffer's)."""

    def read_items(self, inputs) -> tuple[Any, list[int]]:
        """Validate ``inputs``; return the items (opaque to the manager) and each one's output tokens."""

    def capture_inputs(self, budget: int) -> dict[str, torch.Tensor]:
        """One budget's persistent buffers, one per ``config.buffer_keys``, holding valid inputs to
        capture with (random data, a legal layout). The manager keeps them and refills them per replay."""

    def graph_variants(self, budget: int) -> tuple[Hashable, ...]:
        """The graphs to capture on these buffers (one, unless the model has variants)."""

    def forward_on_buffers(self, buffers: dict[str, torch.Tensor], budget: int, variant) -> torch.Tensor:
        """The graph body: reads only ``buffers``, no host synchronisation; returns the output rows
        (the manager copies them into its output buffer, inside the graph)."""

    def replay_buffers(self, items, batch: list[int], budget: int) -> Replay | None:
        """What to write into the buffers for items ``batch``: a source per buffer key, and which
        graph to replay. None when the batch does not fit this budget's buffers (the guard: those
        items run eagerly instead)."""

    def forward_eager(self, items, batch: list[int]) -> torch.Tensor:
        """Items ``batch`` without a graph: their output rows, concatenated in ``batch`` order."""

    def weight_stamp(self):
        """A :class:`~.guard.WeightStamp` of what the graphs read but do not own, as the model holds it
        now: taken after each capture, checked on every call; the manager recaptures when it moved."""

    def refresh(self) -> None:
        """Before every capture: rebuild what the model side derived from the model, so a recapture
        reads nothing of modules the model no longer holds."""

    def counters(self) -> dict:
        """The model side's own counters, joined to the manager's stats."""


class GraphModelDefaults:
    """The trivial :class:`EncoderGraphModel` members, for a model side that needs nothing there."""

    def refresh(self) -> None:
        return None

    def counters(self) -> dict:
        return {}


def protocol_members() -> list[str]:
    """The protocol's members, in declaration order."""
    return [*EncoderGraphModel.__annotations__, *(m for m in vars(EncoderGraphModel) if not m.startswith("_"))]


def check_model(model) -> None:
    """A ``TypeError`` naming the members ``model`` lacks, if it does not implement the protocol."""
    if not isinstance(model, EncoderGraphModel):
        missing = [m for m in protocol_members() if getattr(model, m, None) is None]
        raise TypeError(f"{type(model).__name__} does not implement EncoderGraphModel: it lacks {missing}")
