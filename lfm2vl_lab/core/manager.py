"""The generic encoder CUDA-graph manager.

vLLM splits encoder graphs in two (PR #35963 and, for LFM2-VL, PR #44930): a model-side
``SupportsEncoderCudaGraph`` that knows the model, and an ``EncoderCudaGraphManager`` that only
captures and replays. This module is the second half; the contract between them is
:mod:`~.protocol` (:class:`~.protocol.EncoderGraphModel` and its :class:`~.protocol.GraphConfig`),
and :mod:`lfm2vl_lab.core.lfm2vl` is LFM2-VL's side. Nothing here knows LFM2-VL: a test runs a toy
encoder through the same manager.

Capture (once): for each budget, largest first, the model gives its persistent buffers by name
(``config.buffer_keys``), holding valid dummy inputs; the manager adds an output buffer of
``config.out_hidden_size`` columns. Each graph variant of the body is recorded (warm-up on a side
stream, then capture into one shared memory pool) with its output copied into the output buffer
*inside* the graph. All or nothing: if one budget fails, no graph is kept.

Replay (every call): plan the items into batches (:meth:`~.protocol.GraphConfig.plan`: largest
first, under the largest budget and the item limit), pick the smallest budget that fits each
batch, ask the model for the batch's source per buffer
(:meth:`~.protocol.EncoderGraphModel.replay_buffers`), fill each buffer through
``config.padding_logics.get(key, pad_default)``, replay, then clone the batch's rows out of the
output buffer (the next replay overwrites it) and hand them back in the caller's order. Items too
large for any graph, and batches the model's guard refuses, run eagerly and are counted.

The model under the graphs (every call): the graphs read the model's weights at the addresses they
had at capture. The model stamps them (:class:`~.guard.WeightStamp`) after each capture and the
manager checks the stamp before each ``encode`` (:class:`~.lifecycle.GraphLifecycle`, which the
text engine's graphs live by too). When the weights moved (``model.half()``, ``.cpu().cuda()``,
``load_state_dict(..., assign=True)``) it never replays: it warns once, says what moved, and
captures again where the model now is (``stats.recaptures``); off the GPU it runs eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .capture import WARMUP_ITERS, capture_graph, encoder_capture_failure, prepare_capture
from .lifecycle import GraphLifecycle
from .plan import plan_config  # noqa: F401  (the planner, as the notebooks import it from here)
from .protocol import EncoderGraphModel, Replay, check_model, pad_default  # noqa: F401  (the contract)
from .serial import Serial

# What a capture that ran out of memory tells the user to do.
OOM_ADVICE = ("Capture fewer or smaller budgets (budgets=, max_budget=), fewer run items (max_run_items=), "
              "or free GPU memory first (del what you no longer need, then torch.cuda.empty_cache()).")


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

    ``model`` implements :class:`~.protocol.EncoderGraphModel` (a ``TypeError`` names what it lacks).
    ``record(fn, pool, warmup) -> graph`` records one graph: :func:`~.capture.capture_graph` on a
    GPU; :func:`~.capture.eager_stand_in` runs the same replay path on a CPU without graphs. The
    graphs, their pool and the weight stamp live in :attr:`life` (:class:`~.lifecycle.GraphLifecycle`).
    """

    def __init__(self, model: EncoderGraphModel, record: Callable = capture_graph):
        check_model(model)
        self.adapter, self.record = model, record
        self.config = model.config
        self.capture_extra: dict[int, dict] = {}
        self.capture_args: tuple = (None, WARMUP_ITERS)  # capture()'s (hook, warmup_iters), for a recapture
        self.serial = Serial()  # one caller at a time: the buffers and the output rows are shared
        self.graph_device: torch.device | None = None  # where the graphs run (the streams handed over)
        self.life = GraphLifecycle("encoder graphs: the model's", "encode() runs eagerly", OOM_ADVICE)
        self.reset_stats()
        if record is capture_graph and model.device.type == "cuda" and torch.cuda.is_available():
            prepare_capture(model.device)

    @property
    def graphs(self) -> dict[int, BudgetGraph]:
        """The captured budgets' graphs and buffers, by budget."""
        return self.life.graphs

    @property
    def pool(self):
        return self.life.pool

    @property
    def stamp(self):
        """What the graphs read, as it was at capture (None before a capture)."""
        return self.life.stamp

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def reset_stats(self) -> None:
        self.stats = GraphStats(model_counters=self.adapter.counters)

    def capture_info(self) -> list[dict]:
        """One row per captured budget (largest first, the capture order): what the config says of
        it, its graph variants, the buffer memory, and whatever the capture hook measured."""
        return [{"budget": b, **self.config.describe(b), "variants": [str(v) for v in self.graphs[b].graphs],
                 "buffers_mb": self.graphs[b].buffer_bytes / 2**20, **self.capture_extra.get(b, {})}
                for b in sorted(self.graphs, reverse=True)]

    # -- capture -----------------------------------------------------------------------------------
    def capture(self, hook=None, warmup_iters: int = WARMUP_ITERS) -> list[dict]:
        """Capture every budget, largest first (smaller graphs reuse its pool blocks); all or nothing.

        A failure keeps no graph and releases the pool: a ``KeyboardInterrupt`` is raised again as
        it is, memory running out raises ``torch.OutOfMemoryError`` naming the budget and what to do,
        anything else a ``RuntimeError`` naming the budget. The stream and the random generator are
        put back first (:func:`~.capture.capture_failed`), so eager ``encode`` works at once.

        ``hook(budget, pool, run) -> dict | None``, if given, wraps each budget's capture: it must
        call ``run()`` once and may return measurements, which join that budget's ``capture_info``
        row. The instrument's ``lfm2vl_lab.measure.meter.CaptureMeter`` times each capture and reads
        the pool's memory through it; the manager itself measures nothing.
        """
        with self.serial.hold(self.graph_device):  # one caller at a time: encode() meanwhile waits
            return self._capture(hook, warmup_iters)

    @torch.no_grad()
    def _capture(self, hook=None, warmup_iters: int = WARMUP_ITERS) -> list[dict]:
        real, life = self.record is capture_graph, self.life
        self.capture_args, life.stamp = (hook, warmup_iters), None
        if real and (self.adapter.device.type != "cuda" or not torch.cuda.is_available()):
            raise RuntimeError(f"capture() needs the model on a CUDA device (it is on {self.adapter.device}); "
                               "encode() works without capture and runs the packed eager path")
        self.adapter.refresh()  # nothing derived from modules the model dropped
        life.graphs, self.capture_extra = {}, {}
        life.pool = life.new_pool(real)
        self.graph_device = self.adapter.device if real else None
        for budget in sorted(self.config.graph_budgets, reverse=True):
            g = BudgetGraph(budget, {})

            def undo(g=g):  # all or nothing: a half-captured manager would replay some budgets and not others
                self.life.drop()
                self.capture_extra = {}
                g.graphs.clear(), g.buffers.clear()  # the failed body, kept by the traceback, still reaches g
                g.out = None

            with life.all_or_nothing(real, lambda b=budget: f"the {b}-token encoder graph", undo=undo,
                                     message=lambda e, b=budget: encoder_capture_failure(b, e)):
                g.buffers.update(self._capture_inputs(budget))
                g.out = torch.zeros(budget, self.config.out_hidden_size, device=self.adapter.device,
                                    dtype=self.adapter.dtype)
                extra = hook(budget, life.pool, lambda g=g: self._record(g, warmup_iters)) if hook is not None \
                    else self._record(g, warmup_iters)
            life.graphs[budget], self.capture_extra[budget] = g, dict(extra or {})
        life.stamped(self.adapter.weight_stamp())  # after the warm-ups, which may re-derive weights
        return self.capture_info()

    def follow_model(self) -> None:
        """Called before a replay when the stamp says the weights may have moved: if they did, drop
        every graph (they read the old addresses) and capture again where the model is now; warn the
        first time. A model that left the GPU keeps no graphs (``encode`` then runs eagerly)."""
        self.life.follow(on_gpu=lambda: self.adapter.device.type == "cuda" or self.record is not capture_graph,
                         moved=lambda: setattr(self, "graph_device", None), recapture=self._recapture,
                         stats=self.stats, stacklevel=4)

    def _recapture(self) -> bool:
        try:
            self.capture(*self.capture_args)
        except RuntimeError as exc:  # e.g. no memory for the new dtype's graphs: this call runs eagerly
            warnings.warn(str(exc), stacklevel=6)
            return False
        return True

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
                g.out[: res.shape[0]].copy_(res)  # through g only: see _capture's undo

            g.graphs[variant] = self.record(body, self.life.pool, warmup_iters)

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
        name = str(replay.variant)
        self.stats.variant_replays[name] = self.stats.variant_replays.get(name, 0) + 1
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
        if not self.life.current():
            self.follow_model()  # before reading the inputs: they are staged for where the model is now
        items, tokens = self.adapter.read_items(inputs)
        if not self.graphs:
            self.stats.eager_calls += 1
            return list(self.adapter.forward_eager(items, list(range(len(tokens)))).split(tokens))
        batches, eager = self.config.plan(tokens)
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
