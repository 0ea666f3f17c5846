"""The manager is generic: a toy encoder that is not LFM2-VL gets graphs through the same protocol.

The toy: items are variable-length sequences of feature vectors; the encoder is a per-row MLP, so
one item's output rows are the MLP of its input rows. Its buffers, padding and guard are its own
(nothing from the LFM2-VL side), its config the generic ``GraphConfig``: all the manager may rely on
is the protocol, which the toy implements structurally (it never names ``EncoderGraphModel``).
"""

from __future__ import annotations

import pytest
import torch

from lfm2vl_lab import GraphedEncoder
from lfm2vl_lab.core.capture import capture_graph, eager_stand_in
from lfm2vl_lab.core.guard import WeightStamp
from lfm2vl_lab.core.lfm2vl import Lfm2VlGraphModel
from lfm2vl_lab.core.manager import EncoderGraphManager, EncoderGraphModel, Replay, pad_default
from lfm2vl_lab.core.plan import plan_batches
from lfm2vl_lab.core.protocol import GraphConfig, GraphModelDefaults, protocol_members

DIM = 8


class ToyEncoder(GraphModelDefaults):
    """A per-row MLP over variable-length items, behind the manager's protocol: one buffer, ``x``."""

    def __init__(self, budgets, max_items, device="cpu"):
        gen = torch.Generator().manual_seed(0)
        self.config = GraphConfig(budgets, max_items, out_hidden_size=DIM, buffer_keys=("x",))
        self.w1 = torch.randn(DIM, 16, generator=gen).to(device)
        self.w2 = torch.randn(16, DIM, generator=gen).to(device)
        self.device, self.dtype = torch.device(device), torch.float32
        self.refuse: set[int] = set()  # budgets whose guard says no (to test the fallback)

    def mlp(self, x):
        return torch.tanh(x @ self.w1) @ self.w2

    def read_items(self, inputs):
        if not inputs or any(t.dim() != 2 or t.shape[1] != DIM for t in inputs):
            raise ValueError(f"toy items must be (n, {DIM}) tensors, got {[tuple(t.shape) for t in inputs]}")
        return [t.to(self.device) for t in inputs], [t.shape[0] for t in inputs]

    def capture_inputs(self, budget):
        return {"x": torch.randn(budget, DIM, device=self.device)}

    def graph_variants(self, budget):
        return ("mlp",)

    def forward_on_buffers(self, buffers, budget, variant):
        return self.mlp(buffers["x"])

    def replay_buffers(self, items, batch, budget):
        if budget in self.refuse:
            return None
        return Replay({"x": [items[i] for i in batch]}, "mlp", budget)

    def forward_eager(self, items, batch):
        return self.mlp(torch.cat([items[i] for i in batch]))

    def weight_stamp(self):
        return WeightStamp({})  # plain tensors, no modules: nothing for the stamp to watch


def _items(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, DIM, generator=gen) for n in lengths]


def _run(manager, items):
    refs = [manager.adapter.mlp(t.to(manager.adapter.device)) for t in items]
    outs = manager.encode(items)
    assert [o.shape for o in outs] == [r.shape for r in refs]
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    return outs


def test_the_protocol_is_checked_at_runtime_and_names_what_is_missing(tiny_model):
    """The toy (structurally) and LFM2-VL's side (declared) implement the protocol; a model without
    one of its members is refused, and the error names the member."""
    assert isinstance(ToyEncoder([4], max_items=1), EncoderGraphModel)
    lfm2vl = GraphedEncoder(tiny_model, record=eager_stand_in).adapter
    assert isinstance(lfm2vl, EncoderGraphModel) and EncoderGraphModel in Lfm2VlGraphModel.__mro__  # declared
    assert len(protocol_members()) <= 12

    class Forgetful(ToyEncoder):
        replay_buffers = None  # not the protocol's method

    no_stamp = type("NoStamp", (GraphModelDefaults,), {k: v for k, v in vars(ToyEncoder).items()
                                                      if k not in ("weight_stamp", "__dict__", "__weakref__")})
    for model, missing in ((Forgetful([4], max_items=1), "replay_buffers"), (no_stamp([4], 1), "weight_stamp")):
        assert not isinstance(model, EncoderGraphModel)
        with pytest.raises(TypeError, match=rf"{type(model).__name__} does not implement EncoderGraphModel: "
                                            rf"it lacks \['{missing}'\]"):
            EncoderGraphManager(model, record=eager_stand_in)


def test_toy_encoder_replays_through_the_generic_manager():
    toy = ToyEncoder([4, 8, 16], max_items=3)
    manager = EncoderGraphManager(toy, record=eager_stand_in)
    assert [r["budget"] for r in manager.capture()] == [16, 8, 4]
    lengths = [5, 1, 7, 3, 2, 6]  # unsorted: the answer must come back in this order
    _run(manager, _items(lengths))
    batches, eager = plan_batches(lengths, 16, 3)
    s = manager.stats
    assert eager == [] and s.hits == len(lengths) and s.misses == 0
    assert sum(s.replays.values()) == len(batches)
    assert s.real_tokens == sum(lengths)
    used = [toy.config.budget_for(sum(lengths[i] for i in b)) for b in batches]
    assert s.padded_tokens == sum(used) - sum(lengths)


def test_toy_oversize_items_and_refused_batches_run_eagerly():
    toy = ToyEncoder([4, 8], max_items=2)
    manager = EncoderGraphManager(toy, record=eager_stand_in)
    manager.capture()
    _run(manager, _items([12, 3, 2]))  # 12 rows > the largest budget: eager
    assert (manager.stats.hits, manager.stats.misses) == (2, 1)
    toy.refuse.add(4)
    manager.reset_stats()
    _run(manager, _items([3]))  # budget 4 chosen, the guard refuses: eager, counted
    assert (manager.stats.overflow, manager.stats.misses, manager.stats.hits) == (1, 1, 0)


def test_toy_results_are_not_views_of_the_graph_buffers():
    manager = EncoderGraphManager(ToyEncoder([8], max_items=2), record=eager_stand_in)
    manager.capture()
    first = manager.encode(_items([3, 4], seed=1))
    kept = [t.clone() for t in first]
    manager.encode(_items([3, 4], seed=2))
    assert all(torch.equal(a, b) for a, b in zip(first, kept)), "a later replay changed an earlier result"


def test_capture_is_all_or_nothing():
    class Broken(ToyEncoder):
        def forward_on_buffers(self, buffers, budget, variant):
            if budget == 4:
                raise RuntimeError("boom at 4")
            return super().forward_on_buffers(buffers, budget, variant)

    manager = EncoderGraphManager(Broken([4, 8], max_items=2), record=eager_stand_in)
    with pytest.raises(RuntimeError, match="4-token encoder graph failed .*boom at 4"):
        manager.capture()
    assert not manager.captured and manager.graphs == {}
    _run(manager, _items([3, 2]))  # still usable: eager
    assert manager.stats.eager_calls == 1


def test_capture_hook_sees_every_budget_and_its_numbers_join_capture_info():
    manager = EncoderGraphManager(ToyEncoder([4, 8, 16], max_items=2), record=eager_stand_in)
    seen = []

    def hook(budget, pool, run):
        seen.append(budget)
        run()
        return {"note": f"b{budget}"}

    rows = manager.capture(hook=hook)
    assert seen == [16, 8, 4]
    assert [(r["budget"], r["note"]) for r in rows] == [(16, "b16"), (8, "b8"), (4, "b4")]
    assert rows[0]["buffers_mb"] == pytest.approx(2 * 16 * DIM * 4 / 2**20)


def test_the_manager_fills_each_buffer_through_its_padding_logic():
    """vLLM's rule: ``padding_logics.get(key, default)``. A custom logic for ``x`` is what the
    replay reads: it doubles the rows, so the output is the MLP of twice the input."""
    seen = []

    def doubled(dst, src):
        seen.append(sum(t.shape[0] for t in src))
        pad_default(dst, [2 * t for t in src])

    toy = ToyEncoder([4, 8], max_items=2)
    toy.config.padding_logics["x"] = doubled
    manager = EncoderGraphManager(toy, record=eager_stand_in)
    manager.capture()
    items = _items([3, 2])
    outs = manager.encode(items)
    assert seen == [5]
    for o, t in zip(outs, items):
        torch.testing.assert_close(o, toy.mlp(2 * t), rtol=1e-5, atol=1e-5)
    toy.config.padding_logics.clear()  # back to the default: the padded rows are zero
    manager.encode(_items([3]))
    assert torch.equal(manager.graphs[4].buffers["x"][3:], torch.zeros(1, DIM))


def test_capture_inputs_must_be_the_named_buffers():
    class Misnamed(ToyEncoder):
        def capture_inputs(self, budget):
            return {"y": torch.zeros(budget, DIM)}

    manager = EncoderGraphManager(Misnamed([4], max_items=1), record=eager_stand_in)
    with pytest.raises(RuntimeError, match=r"gave buffers \['y'\]; the config names \['x'\]"):
        manager.capture()


def test_real_capture_needs_cuda_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    manager = EncoderGraphManager(ToyEncoder([4], max_items=1))
    assert manager.record is capture_graph
    with pytest.raises(RuntimeError, match="needs the model on a CUDA device"):
        manager.capture()


@pytest.mark.gpu
def test_toy_encoder_with_real_cuda_graphs():
    toy = ToyEncoder([4, 8, 16], max_items=3, device="cuda")
    manager = EncoderGraphManager(toy)
    manager.capture()
    _run(manager, _items([5, 1, 7, 3, 2, 6]))
    assert manager.stats.hits == 6 and manager.stats.misses == 0
