"""The generic encoder CUDA-graph manager, and the protocol a model implements to use it.

vLLM splits encoder graphs in two (PR #35963 and, for LFM2-VL, PR #44930): a model-side
``SupportsEncoderCudaGraph`` that knows the model, and an ``EncoderCudaGraphManager`` that only
captures and replays. This module is the second half plus the contract between them,
:class:`EncoderGraphModel`; :mod:`lfm2vl_lab.core.lfm2vl` is LFM2-VL's side. Nothing here knows
LFM2-VL: a test runs a toy encoder through the same manager.

Capture (once): for each budget, largest first, the model gives its persistent buffers by name
(``config.buffer_keys``), holding valid dummy inputs; the manager adds an output buffer of
``config.out_hidden_size`` columns. Each graph variant of the body is recorded (warm-up on a side
stream, then capture into one shared memory pool) with its output copied into the output buffer
*inside* the graph. All or nothing: if one budget fails, no graph is kept.

Replay (every call): plan the items into batches (largest first, under the largest budget and the
item limit), pick the smallest budget that fits each batch, ask the model for the batch's source
per buffer (:meth:`EncoderGraphModel.replay_buffers`), fill each buffer through
``config.padding_logics.get(key, pad_default)``, replay, then clone the batch's rows out of the
output buffer (the next replay overwrites it) and hand them back in the caller's order. Items too
large for any graph, and batches the model's guard refuses, run eagerly and are counted.

The model under the graphs (every call): the graphs read the model's weights at the addresses they
had at capture. The manager stamps them (:class:`~.guard.WeightStamp`) and checks the stamp before
each ``encode``. When the weights moved (``model.half()``, ``.cpu().cuda()``,
``load_state_dict(..., assign=True)``) it never replays: it warns once, says what moved, and
captures again where the model now is (``stats.recaptures``); off the GPU it runs eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .capture import WARMUP_ITERS, capture_failed, capture_graph, encoder_capture_failure, prepare_capture
from .guard import WeightStamp, change_summary, change_warning
from .plan import plan_config
from .serial import Serial

# What a capture that ran out of memory tells the user to do.
OOM_ADVICE = ("Capture fewer or smaller budgets (budgets=, max_budget=), fewer run items (max_run_items=), "
              "or free GPU memory first (del what you no longer need, then torch.cuda.empty_cache()).")


class EncoderGraphModel(Protocol):
    """What a model provides to get encoder CUDA graphs (vLLM: ``SupportsEncoderCudaGraph``).

    ``config`` (an :class:`~.config.EncoderGraphConfig`, or anything with its ``budgets``,
    ``graph_budgets``, ``max_items``, ``budget_for``, ``out_hidden_size``, ``buffer_keys`` and
    ``padding_logics``). Optional: ``describe(budget) -> dict``, ``counters() -> dict``,
    ``holders() -> list`` (the modules above :meth:`weights`' parts, which can put another module in
    a part's place) and ``refresh()`` (rebuild what the model side derived from the model, before
    every capture, so a recapture reads nothing of modules the model no longer holds).
    """

    config: Any

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def read_items(self, inputs) -> tuple[Any, list[int]]:
        """Validate ``inputs``; return the items (opaque to the manager) and each one's output tokens."""

    def capture_inputs(self, budget: int) -> dict[str, torch.Tensor]:
        """One budget's persistent buffers, one per ``config.buffer_keys``, holding valid inputs to
        capture with (random data, a legal layout). The manager keeps them and refills them per replay."""

    def graph_variants(self, budget: int) -> tuple[str, ...]:
        """The graphs to capture on these buffers, by name (one, unless the model has variants)."""

    def forward_on_buffers(self, buffers: dict[str, torch.Tensor], budget: int, variant: str) -> torch.Tensor:
        """The graph body: reads only ``buffers``, no host synchronisation; returns the output rows
        (the manager copies them into its output buffer, inside the graph)."""

    def replay_buffers(self, items, batch: list[int], budget: int) -> Replay | None:
        """What to write into the buffers for items ``batch``: a source per buffer key, and which
        graph to replay. None when the batch does not fit this budget's buffers (the guard: those
        items run eagerly instead)."""

    def forward_eager(self, items, batch: list[int]) -> torch.Tensor:
        """Items ``batch`` without a graph: their output rows, concatenated in ``batch`` order."""

    def weights(self) -> dict[str, torch.nn.Module]:
        """The modules whose parameters and buffers the graphs read but do not own, by name, as the
        model holds them now: the manager stamps them at capture (:class:`~.guard.WeightStamp`), checks
        the stamp on every call and recaptures when one moved."""


@dataclass
class Replay:
    """One replay, as the model describes it: ``sources`` (per buffer key, what the key's padding
    logic writes into the buffer; a key left out keeps what the buffer holds), the graph ``variant``
    and the output rows it computes (``tokens``: the padding stats count the difference to the
    real tokens)."""

    sources: dict[str, Any]
    variant: str
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


@dataclass
class GraphStats:
    """Counters of the replay path. ``padding_waste`` = padded tokens / real tokens."""

    hits: int = 0  # items served by a graph replay
    misses: int = 0  # items run eagerly: larger than the largest budget, or refused by the guard
    overflow: int = 0  # batches refused by the guard (never reached a kernel)
    recaptures: int = 0  # times the model's weights moved under the graphs and encode() captured again
    eager_calls: int = 0  # encode() calls served eagerly because nothing was captured
    replays: dict[int, int] = field(default_factory=dict)  # per budget, all variants together
    variant_replays: dict[str, int] = field(default_factory=dict)  # replays per graph variant
    real_tokens: int = 0
    padded_tokens: int = 0
    model_counters: Callable[[], dict] | None = field(default=None, repr=False, compare=False)

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
            "recaptures": self.recaptures, "replays": dict(sorted(self.replays.items())),
            "variant_replays": dict(sorted(self.variant_replays.items())),
            "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens,
            "padding_waste": self.padding_waste, "hit_rate": self.hit_rate,
            **(self.model_counters() if self.model_counters is not None else {}),
        }


@dataclass
class BudgetGraph:
    """One budget's persistent buffers, its output buffer and the graphs (one per variant) that
    read the first and write the second."""

    budget: int
    buffers: dict[str, torch.Tensor]
    out: torch.Tensor | None = None
    graphs: dict[str, Any] = field(default_factory=dict)

    @property
    def buffer_bytes(self) -> int:
        """The persistent buffers (outside the graph pool: they live as long as the manager)."""
        return sum(t.numel() * t.element_size() for t in [*self.buffers.values(), self.out] if t is not None)


class EncoderGraphManager:
    """Captures one set of graphs per budget of ``model.config`` and replays them in ``encode``.

    ``record(fn, pool, warmup) -> graph`` records one graph: :func:`~.capture.capture_graph` on a
    GPU; :func:`~.capture.eager_stand_in` runs the same replay path on a CPU without graphs.
    """

    def __init__(self, model: EncoderGraphModel, record: Callable = capture_graph):
        self.adapter, self.record = model, record
        self.config = model.config
        self.graphs: dict[int, BudgetGraph] = {}
        self.pool = None
        self.capture_extra: dict[int, dict] = {}
        self.stamp: WeightStamp | None = None  # what the graphs read, as it was at capture
        self.capture_args: tuple = (None, WARMUP_ITERS)  # capture()'s (hook, warmup_iters), for a recapture
        self.last_change: str | None = None  # what moved, the last time the stamp said so
        self.warned_change = False
        self.serial = Serial()  # one caller at a time: the buffers and the output rows are shared
        self.graph_device: torch.device | None = None  # where the graphs run (the streams handed over)
        self.reset_stats()
        if record is capture_graph and model.device.type == "cuda" and torch.cuda.is_available():
            prepare_capture(model.device)

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def reset_stats(self) -> None:
        self.stats = GraphStats(model_counters=getattr(self.adapter, "counters", None))

    def capture_info(self) -> list[dict]:
        """One row per captured budget (largest first, the capture order): what the model reports,
        the buffer memory, and whatever the capture hook measured."""
        describe = getattr(self.adapter, "describe", lambda b: {})
        return [{"budget": b, **describe(b), "buffers_mb": self.graphs[b].buffer_bytes / 2**20,
                 **self.capture_extra.get(b, {})} for b in sorted(self.graphs, reverse=True)]

    # -- capture -----------------------------------------------------------------------------------
    def capture(self, hook=None, warmup_iters: int = WARMUP_ITERS) -> list[dict]:
        """Capture every budget, largest first (smaller graphs reuse its pool blocks); all or nothing.

        A failure keeps no graph and releases the pool: a ``KeyboardInterrupt`` is raised again as
        it is, memory running out raises ``torch.OutOfMemoryError`` naming the budget and what to do,
        anything else a ``RuntimeError`` naming the budget. The stream and the random generator are
        put back first (:func:`~.capture.capture_failed`), so eager ``encode`` works at once.

        ``hook(budget, pool, run) -> dict | None``, if given, wraps each budget's capture: it must
        call ``run()`` once and may return measurements, which join that budget's ``capture_info``
        row. The instrument's ``lfm2vl_lab.tools.meter.CaptureMeter`` times each capture and reads
        the pool's memory through it; the manager itself measures nothing.
        """
        with self.serial.hold(self.graph_device):  # one caller at a time: encode() meanwhile waits
            return self._capture(hook, warmup_iters)

    @torch.no_grad()
    def _capture(self, hook=None, warmup_iters: int = WARMUP_ITERS) -> list[dict]:
        real = self.record is capture_graph
        self.capture_args, self.stamp = (hook, warmup_iters), None
        if real and (self.adapter.device.type != "cuda" or not torch.cuda.is_available()):
            raise RuntimeError(f"capture() needs the model on a CUDA device (it is on {self.adapter.device}); "
                               "encode() works without capture and runs the packed eager path")
        getattr(self.adapter, "refresh", lambda: None)()  # nothing derived from modules the model dropped
        self.graphs, self.capture_extra = {}, {}
        self.pool = torch.cuda.graph_pool_handle() if real else None
        self.graph_device = self.adapter.device if real else None
        for budget in sorted(self.config.graph_budgets, reverse=True):
            caller_stream, g = torch.cuda.current_stream() if real else None, BudgetGraph(budget, {})
            try:
                g.buffers.update(self._capture_inputs(budget))
                g.out = torch.zeros(budget, self.config.out_hidden_size, device=self.adapter.device,
                                    dtype=self.adapter.dtype)
                extra = hook(budget, self.pool, lambda g=g: self._record(g, warmup_iters)) if hook is not None \
                    else self._record(g, warmup_iters)
            except BaseException as exc:  # KeyboardInterrupt too: a stopped cell leaves no half capture
                # all or nothing: a half-captured manager would replay some budgets and not others
                self.graphs, self.capture_extra, self.pool = {}, {}, None
                g.graphs.clear(), g.buffers.clear()  # the failed body, kept by the traceback, still reaches g
                g.out = None
                err = capture_failed(exc, f"the {budget}-token encoder graph", caller_stream, cuda=real,
                                     message=lambda e, b=budget: encoder_capture_failure(b, e), advice=OOM_ADVICE)
                if err is exc:
                    raise
                raise err from exc
            self.graphs[budget], self.capture_extra[budget] = g, dict(extra or {})
        # after the warm-ups, which may re-derive weights; re-read from the model on the slow path
        self.stamp = WeightStamp(self.adapter.weights, getattr(self.adapter, "holders", list)())
        return self.capture_info()

    def follow_model(self) -> None:
        """Called before a replay when the stamp says the weights may have moved: if they did, drop
        every graph (they read the old addresses) and capture again where the model is now; warn the
        first time. A model that left the GPU keeps no graphs (``encode`` then runs eagerly)."""
        changes = self.stamp.changes()
        if not changes:
            self.stamp.rearm()  # e.g. .to() to where the model already was: nothing to do
            return
        self.last_change = change_summary(changes)
        self.graphs, self.stamp, self.pool, self.graph_device = {}, None, None, None
        on_gpu = self.adapter.device.type == "cuda" or self.record is not capture_graph
        said = change_warning(self, "encoder graphs: the model's", changes, on_gpu, "encode() runs eagerly")
        if said:
            warnings.warn(said, stacklevel=4)
        if on_gpu:
            try:
                self.capture(*self.capture_args)
            except RuntimeError as exc:  # e.g. no memory for the new dtype's graphs: this call runs eagerly
                warnings.warn(str(exc), stacklevel=4)
                return
            self.stats.recaptures += 1

    def _capture_inputs(self, budget: int) -> dict[str, torch.Tensor]:
        buffers = self.adapter.capture_inputs(budget)
        if set(buffers) != set(self.config.buffer_keys):
            raise ValueError(f"capture_inputs({budget}) gave buffers {sorted(buffers)}; the config names "
                             f"{sorted(self.config.buffer_keys)}")
        return buffers

    def _record(self, g: BudgetGraph, warmup_iters: int) -> None:
        for variant in self.adapter.graph_variants(g.budget):
            def body(v=variant):  # the output is copied into the persistent buffer inside the graph
                res = self.adapter.forward_on_buffers(g.buffers, g.budget, v)
                g.out[: res.shape[0]].copy_(res)  # through g only: see capture's except

            g.graphs[variant] = self.record(body, self.pool, warmup_iters)

    # -- replay ------------------------------------------------------------------------------------
    def _replay(self, items, tokens: list[int], batch: list[int]) -> torch.Tensor | None:
        total = sum(tokens[i] for i in batch)
        budget = self.config.budget_for(total, len(batch))
        g = self.graphs.get(budget) if budget is not None else None
        replay = self.adapter.replay_buffers(items, batch, budget) if g is not None else None
        if replay is None:
            self.stats.overflow += 1
            return None
        logics = self.config.padding_logics
        for key, src in replay.sources.items():  # vLLM's rule: the key's own padding logic, else the default
            logics.get(key, pad_default)(g.buffers[key], src)
        g.graphs[replay.variant].replay()
        self.stats.variant_replays[replay.variant] = self.stats.variant_replays.get(replay.variant, 0) + 1
        self.stats.replays[budget] = self.stats.replays.get(budget, 0) + 1
        self.stats.real_tokens += total
        self.stats.padded_tokens += replay.tokens - total
        self.stats.hits += len(batch)
        return g.out[:total].clone()  # the buffer belongs to the graph: the next replay overwrites it

    def encode(self, inputs) -> list[torch.Tensor]:
        """Inputs → one output tensor per item, in input order: replays where a graph fits, eager
        elsewhere. One caller at a time: a second thread waits for the first's call to end."""
        with self.serial.hold(self.graph_device):  # read once per capture: the model's device costs µs
            return self._encode(inputs)

    @torch.no_grad()
    def _encode(self, inputs) -> list[torch.Tensor]:
        if self.stamp is not None and not self.stamp.current():
            self.follow_model()  # before reading the inputs: they are staged for where the model is now
        items, tokens = self.adapter.read_items(inputs)
        if not self.graphs:
            self.stats.eager_calls += 1
            return list(self.adapter.forward_eager(items, list(range(len(tokens)))).split(tokens))
        batches, eager = plan_config(tokens, self.config)
        results: list[torch.Tensor | None] = [None] * len(tokens)
        for batch in batches:
            out = self._replay(items, tokens, batch)
            if out is None:  # refused by the guard: those items run eagerly instead
                out = self.adapter.forward_eager(items, batch)
                self.stats.misses += len(batch)
            for i, piece in zip(batch, out.split([tokens[i] for i in batch])):
                results[i] = piece
        for i in eager:
            results[i] = self.adapter.forward_eager(items, [i])
            self.stats.misses += 1
        return results
