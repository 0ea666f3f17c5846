"""Graphs that notice when the model changes under them (core/guard.py): the stamp itself, and the
encoder's and the text engine's answer to a moved model, on a CPU (``eager_stand_in`` graphs)."""

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.guard import WeightStamp, change_summary
from lfm2vl_lab.model.parity import max_rel_error
from lfm2vl_lab.model.presets import build_model
from lfm2vl_lab.serving.engine import TextEngine
from lfm2vl_lab.tools.workloads import random_processor_output


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 4))


def test_stamp_stays_current_through_in_place_loading():
    net = _net()
    stamp = WeightStamp({"net": net})
    assert stamp.current()
    net.load_state_dict(_net().state_dict())  # copy_ into the same storage
    with torch.no_grad():
        net[0].weight.mul_(2)
    assert stamp.current() and stamp.changes() == []


@pytest.mark.parametrize("change, expect", [
    (lambda n: n.double(), "net.0.weight moved from cpu float32 to cpu float64"),
    (lambda n: n[2].double(), "net.2.weight moved from cpu float32 to cpu float64"),  # a part only: no sentinel
    (lambda n: n.load_state_dict(_net().state_dict(), assign=True), "net.0.weight was replaced by new storage"),
    (lambda n: setattr(n[1], "bias", nn.Parameter(torch.zeros(8))), "net.1.bias was replaced by new storage"),
    (lambda n: n[1].register_buffer("extra", torch.zeros(2)), "net.1.extra was added"),
])
def test_stamp_names_what_changed(change, expect):
    net = _net()
    stamp = WeightStamp({"net": net})
    change(net)
    assert not stamp.current()
    assert any(line.startswith(expect) for line in stamp.changes()), stamp.changes()


def test_a_move_to_where_the_model_already_is_changes_nothing():
    net = _net()
    stamp = WeightStamp({"net": net})
    net.to("cpu", torch.float32)  # goes through _apply: the flag is raised, the comparison finds nothing
    assert not stamp.current() and stamp.changes() == []
    stamp.rearm()
    assert stamp.current()


def test_sentinel_catches_a_swap_no_hook_sees():
    net = _net()
    stamp = WeightStamp({"net": net})
    net[0].weight.data = torch.zeros_like(net[0].weight)  # bypasses nn.Module: only the sentinel sees it
    assert not stamp.current()
    assert stamp.changes() == ["net.0.weight was replaced by new storage (cpu float32)"]


def test_stamp_with_fake_pointers_reports_each_kind_of_change():
    net = _net()
    stamp = WeightStamp({"net": net})
    name = "net.2.bias"
    ptr, dtype, dev = stamp.recorded[name]
    stamp.recorded[name] = (ptr + 64, dtype, dev)
    stamp.recorded["net.9.weight"] = (1, torch.float32, torch.device("cuda", 0))
    assert stamp.changes() == [f"{name} was replaced by new storage (cpu float32)", "net.9.weight was removed"]
    assert change_summary(["a", "b", "c", "d"]) == "a; b; and 2 more"


def test_watched_modules_still_copy_and_pickle():
    net = _net()
    stamp = WeightStamp({"net": net})
    twin = copy.deepcopy(net)
    twin.double()  # the copy is not watched: its move says nothing about the original
    assert stamp.current()
    buf = io.BytesIO()
    torch.save(net, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert torch.equal(back[0].weight, net[0].weight)
    assert pickle.loads(pickle.dumps(net))[2].bias.shape == (4,)


@pytest.fixture()
def fresh_tiny():
    return build_model("tiny")  # its own: these tests move and retype it


def _encode_checked(genc, inputs):
    out = genc.encode(inputs)
    ref = genc.encoder.encode(inputs)  # the packed eager encoder on the model as it is now
    assert out[0].dtype == genc.encoder.dtype
    assert max_rel_error(out, ref) <= 1e-4
    return out


def test_graphed_encoder_recaptures_after_a_dtype_change(fresh_tiny):
    genc = GraphedEncoder(fresh_tiny, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    inputs = random_processor_output([(16, 16), (8, 12)], fresh_tiny, seed=3)
    _encode_checked(genc, inputs)
    fresh_tiny.to(torch.float64)
    with pytest.warns(UserWarning, match=r"weights changed since capture \(.*moved from cpu float32 to cpu float64"):
        _encode_checked(genc, inputs)
    assert genc.stats.recaptures == 1 and genc.captured
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the next change only counts
        fresh_tiny.to(torch.float32)
        _encode_checked(genc, inputs)
    assert genc.stats.recaptures == 2 and genc.stats.as_dict()["recaptures"] == 2


def test_graphed_encoder_follows_in_place_loading_without_recapture(fresh_tiny):
    genc = GraphedEncoder(fresh_tiny, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    inputs = random_processor_output([(16, 16)], fresh_tiny, seed=4)
    before = genc.encode(inputs)[0]
    fresh_tiny.load_state_dict(build_model("tiny", seed=7).state_dict())
    after = _encode_checked(genc, inputs)[0]
    assert genc.stats.recaptures == 0 and not torch.equal(before, after)


def test_graphed_encoder_recaptures_after_assign_loading(fresh_tiny):
    genc = GraphedEncoder(fresh_tiny, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    fresh_tiny.load_state_dict(build_model("tiny", seed=7).state_dict(), assign=True)
    with pytest.warns(UserWarning, match="replaced by new storage"):
        _encode_checked(genc, random_processor_output([(16, 16)], fresh_tiny, seed=5))
    assert genc.stats.recaptures == 1


def test_a_later_fusing_encoder_makes_an_unfused_one_recapture(fresh_tiny):
    unfused = GraphedEncoder(fresh_tiny, fuse_qkv=False, budgets=[64, 256], record=eager_stand_in)
    unfused.capture()
    sa = fresh_tiny.model.vision_tower.encoder.layers[0].self_attn
    GraphedEncoder(fresh_tiny, budgets=[64, 256], record=eager_stand_in)  # re-points q/k/v into one storage
    assert not hasattr(sa, "_lab_unfused_qkv")  # the separate q/k/v tensors are not kept alive
    with pytest.warns(UserWarning, match=r"[qkv]_proj.weight was replaced"):
        _encode_checked(unfused, random_processor_output([(16, 16)], fresh_tiny, seed=6))
    assert unfused.stats.recaptures == 1


def test_text_engine_follows_a_moved_model_and_keeps_its_state():
    model = build_model("tiny")
    eng = TextEngine(model, max_batch=1, max_len=128)
    ref = TextEngine(model, max_batch=1, max_len=128)
    emb = torch.randn(1, 20, model.config.text_config.hidden_size)
    eng.capture([(1, 20)], record=eager_stand_in)  # a CPU: the graphs are stand-ins, the stamp is real
    eng.prefill([20], emb)
    model.to(torch.float64)
    with pytest.warns(UserWarning, match="TextEngine: the text model's weights changed"):
        first = eng.sample()  # the prompt's cache moved with the engine: the request goes on
    assert eng.embeds.dtype == eng.cache.k[next(iter(eng.cache.k))].dtype == torch.float64
    ref.__init__(model, max_batch=1, max_len=128)
    ref.prefill([20], emb.double())
    assert torch.equal(first, ref.sample())
    assert torch.equal(eng.decode(4), ref.decode(4))
    assert eng.stats.recaptures == 1 and set(eng.graphs) == {"prefill 1x64", "sample 1", "decode 1"}
    assert eng.stats.replays["decode 1"] == 4 and not eng.stats.eager  # the recaptured stand-ins ran
