"""Graphs that notice when the model changes under them (core/guard.py): the stamp itself, and the
encoder's and the text engine's answer to a moved model, on a CPU (``eager_stand_in`` graphs)."""

import copy
import gc
import io
import pickle
import warnings
import weakref

import pytest
import torch
from torch import nn

from lfm2vl_lab.core import ptrcheck
from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.guard import WeightStamp, change_summary
from lfm2vl_lab.measure.workloads import random_processor_output
from lfm2vl_lab.model.parity import max_rel_error
from lfm2vl_lab.model.presets import build_model
from lfm2vl_lab.serving.engine import TextEngine


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


@pytest.fixture(params=[ptrcheck.TORCH, ptrcheck.EXTENSION])
def check_path(request, monkeypatch):
    """Each stamp the test makes uses this pointer check: torch's, or the C++ one."""
    module = request.getfixturevalue("built_pointer_check")[0] if request.param == ptrcheck.EXTENSION else None
    monkeypatch.setitem(ptrcheck._CHOSEN, "ext", module)
    return request.param


def test_the_pointer_check_catches_a_swap_no_hook_sees(check_path):
    net = _net()
    stamp = WeightStamp({"net": net})
    assert stamp.pointer_check == check_path and stamp.current()
    net[0].weight.data = torch.zeros_like(net[0].weight)  # bypasses nn.Module: only the pointer check sees it
    assert not stamp.current()
    assert stamp.changes() == ["net.0.weight was replaced by new storage (cpu float32)"]


def test_the_pointer_check_follows_swap_tensors_and_a_resized_storage(check_path):
    net = _net()
    stamp = WeightStamp({"net": net})
    torch.utils.swap_tensors(net[2].bias, nn.Parameter(torch.zeros(4)))  # another TensorImpl under the same object
    assert not stamp.current() and stamp.changes() == ["net.2.bias was replaced by new storage (cpu float32)"]
    stamp = WeightStamp({"net": net})
    with torch.no_grad():
        net[1].weight.untyped_storage().resize_(64)  # same tensor, same storage object, new memory
    assert not stamp.current() and stamp.changes() == ["net.1.weight was replaced by new storage (cpu float32)"]


def test_a_dropped_stamp_lets_go_of_the_tensors(check_path):
    net = _net()
    stamp = WeightStamp({"net": net})
    weight = weakref.ref(net[0].weight)
    net[0].weight = nn.Parameter(torch.zeros(8, 4))  # a registration: the stamp is dropped at once
    gc.collect()
    assert stamp.dirty and weight() is None
    assert stamp.changes() == ["net.0.weight was replaced by new storage (cpu float32)"]


def test_stamps_use_the_cpp_check_only_once_built_and_never_build_unasked(monkeypatch, tmp_path, recwarn):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv(ptrcheck.ENV, raising=False)
    monkeypatch.delitem(ptrcheck._CHOSEN, "ext", raising=False)
    assert WeightStamp({"net": _net()}).pointer_check == ptrcheck.TORCH  # not built here: torch's, no compile
    assert list(tmp_path.iterdir()) == [] and not recwarn.list
    for bad in ("yes", "Build"):
        monkeypatch.setenv(ptrcheck.ENV, bad)
        monkeypatch.delitem(ptrcheck._CHOSEN, "ext", raising=False)
        with pytest.raises(ValueError, match=f"LFM2VL_PTRCHECK='{bad}': set it to 'build'"):
            WeightStamp({"net": _net()})
    monkeypatch.setenv(ptrcheck.ENV, "build")
    monkeypatch.setenv("CXX", "no-such-compiler")
    no_compiler = "cannot be built here: no C\\+\\+ compiler .'no-such-compiler'.*torch's pointer check"
    with pytest.warns(UserWarning, match=no_compiler):
        assert WeightStamp({"net": _net()}).pointer_check == ptrcheck.TORCH
    with pytest.raises(ValueError, match="pointer check 'c'"):
        ptrcheck.use_pointer_check("c")


def test_a_built_cpp_check_is_used_unless_torch_is_asked_for(built_pointer_check, monkeypatch):
    module, folder = built_pointer_check
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", folder)
    for env, want in (("", ptrcheck.EXTENSION), ("build", ptrcheck.EXTENSION), ("torch", ptrcheck.TORCH)):
        monkeypatch.setenv(ptrcheck.ENV, env)
        monkeypatch.delitem(ptrcheck._CHOSEN, "ext", raising=False)
        assert WeightStamp({"net": _net()}).pointer_check == want, env
    monkeypatch.setitem(ptrcheck._CHOSEN, "ext", module)
    with pytest.raises(TypeError, match="item 1 is a str, not a tensor"):
        module.PointerCheck([torch.zeros(1), "w"], [0, 0])
    with pytest.raises(ValueError, match="2 tensors but 1 pointers"):
        module.PointerCheck([torch.zeros(1), torch.zeros(1)], [0])


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
    assert eng.stats.recaptures == 1 and set(eng.graphs) == {"prefill 1x64", "sample 1", "decode 1x128"}
    assert eng.stats.replays["decode 1x128"] == 4 and not eng.stats.eager  # the recaptured stand-ins ran


# -- what bypasses nn.Module, and parts swapped after capture ------------------------------------------


def test_stamp_sees_data_swaps_list_rekeying_and_parts_replaced_above_it():
    outer = nn.Sequential(_net(), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))
    stamp = WeightStamp(lambda: {"net": outer[0], "list": outer[1]}, holders=[outer])
    for change in (lambda: setattr(outer[0][2].bias, "data", torch.zeros(4)),   # no hook fires
                   lambda: outer[1].insert(0, nn.Linear(4, 4)),                   # re-keys in place
                   lambda: outer[1].__delitem__(0),                               # a new dict, no hook
                   lambda: outer.__setitem__(0, _net())):                         # a part replaced above it
        assert stamp.current()
        change()
        assert not stamp.current() and stamp.changes()
        stamp = WeightStamp(lambda: {"net": outer[0], "list": outer[1]}, holders=[outer])


def _vision_data_swap(m):
    fc1 = m.model.vision_tower.encoder.layers[1].mlp.fc1
    fc1.weight.data = fc1.weight.detach().clone() * 2


def _projector_data_swap(m):
    lin = m.model.multi_modal_projector.linear_1
    lin.weight.data = lin.weight.detach().clone().flip(0)


def _vision_layer_swapped(m):
    new = build_model("tiny", seed=11).model.vision_tower.encoder.layers[1]
    m.model.vision_tower.encoder.layers[1] = new


def _projector_replaced(m):
    m.model.multi_modal_projector = build_model("tiny", seed=12).model.multi_modal_projector


@pytest.mark.parametrize("change", [_vision_data_swap, _projector_data_swap, _vision_layer_swapped,
                                    _projector_replaced])
def test_graphed_encoder_follows_what_bypasses_or_replaces_modules(fresh_tiny, change):
    """Each change ends in the changed model's output (the packed eager encoder on it, and
    transformers'), from graphs captured again, never from what the graphs read before."""
    from lfm2vl_lab.model.hf import hf_image_features

    genc = GraphedEncoder(fresh_tiny, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    inputs = random_processor_output([(16, 16), (8, 12)], fresh_tiny, seed=3)
    before = genc.encode(inputs)
    change(fresh_tiny)
    with pytest.warns(UserWarning, match="weights changed since capture"):
        after = genc.encode(inputs)
    assert genc.stats.recaptures == 1
    assert max_rel_error(after, hf_image_features(fresh_tiny, inputs)) <= 1e-4
    assert max_rel_error(after, before) > 1e-2  # the change reached the output
    assert max_rel_error(genc.encode(inputs), after) == 0 and genc.stats.recaptures == 1


def _conv_data_swap(m):
    conv = m.model.language_model.layers[0].conv.conv
    conv.weight.data = torch.randn(conv.weight.shape, generator=torch.Generator().manual_seed(2)) * 5


def _head_data_swap(m):
    m.lm_head.weight.data = m.lm_head.weight.detach().clone().roll(1, 0)


def _text_layer_swapped(m):
    m.model.language_model.layers[1] = build_model("tiny", text_layers="full", seed=13).model.language_model.layers[1]


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("change", [_conv_data_swap, _head_data_swap, _text_layer_swapped])
def test_text_engine_follows_what_bypasses_or_replaces_modules(change, fuse):
    if fuse and not torch.cuda.is_available():
        pytest.skip("the fused engine compiles with inductor: on the GPU (tests/test_guard_gpu.py)")
    model = build_model("tiny", text_layers="full", seed=3)
    if model.lm_head.weight is model.model.language_model.embed_tokens.weight and change is _head_data_swap:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())  # untie: the head alone
    eng = TextEngine(model, max_batch=1, max_len=64, fuse=fuse)
    eng.capture([(1, 20)], record=eager_stand_in)
    emb = torch.randn(1, 20, model.config.text_config.hidden_size, generator=torch.Generator().manual_seed(1))
    eng.prefill([20], emb)
    eng.sample()
    before = eng.logits[:1].clone()
    change(model)
    with pytest.warns(UserWarning, match="text model's weights changed"):
        eng.prefill([20], emb)
    got = torch.cat([eng.sample()[:, None], eng.decode(6)], 1)
    fresh = TextEngine(model, max_batch=1, max_len=64)  # built on the changed model
    fresh.prefill([20], emb)
    want = torch.cat([fresh.sample()[:, None], fresh.decode(6)], 1)
    eng.prefill([20], emb), fresh.prefill([20], emb), eng.sample(), fresh.sample()
    assert eng.stats.recaptures == 1 and torch.equal(got, want)
    assert max_rel_error(eng.logits[:1], fresh.logits[:1]) <= 1e-4  # the changed model's logits ...
    assert max_rel_error(eng.logits[:1], before) > 1e-3  # ... not the ones from before the change


def test_a_capture_call_after_a_data_swap_recaptures_before_it_stamps():
    """chat calls ``capture`` every turn: a call that finds its graphs already there must not take a
    new stamp over graphs that read the storage a ``.data`` swap left behind."""
    model = build_model("tiny", text_layers="full", seed=3)
    eng = TextEngine(model, max_batch=1, max_len=64)
    eng.capture([(1, 20)], record=eager_stand_in)
    _conv_data_swap(model)
    with pytest.warns(UserWarning, match="text model's weights changed"):
        info = eng.capture([(1, 20)], record=eager_stand_in)  # nothing new to capture
    assert eng.stats.recaptures == 1 and info["captured"] == []
    assert eng.stamp.current()


def test_owners_of_graphs_go_with_their_last_reference(fresh_tiny):
    """No reference cycle keeps an encoder's or an engine's graphs alive until a garbage collection,
    which could run in the middle of another capture (core/capture.py, ``gc_paused``)."""
    def record(fn, pool=None, warmup=0):  # like a CUDA graph, what it returns holds nothing of fn
        fn()
        return object()

    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        genc = GraphedEncoder(fresh_tiny, budgets=[64], record=record)
        genc.capture()
        eng = TextEngine(fresh_tiny, max_batch=1, max_len=64)
        eng.capture([(1, 20)], record=record)
        refs = [weakref.ref(genc.manager), weakref.ref(genc.manager.life), weakref.ref(eng), weakref.ref(eng.life)]
        del genc, eng
        assert [r() is None for r in refs] == [True] * 4
    finally:
        if was:
            gc.enable()


def test_gc_paused_keeps_the_collector_off_and_restores_it():
    from lfm2vl_lab.core.capture import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not turn it back on early
    assert gc.isenabled()
    with pytest.raises(KeyboardInterrupt), gc_paused():
        raise KeyboardInterrupt  # a stopped cell
    assert gc.isenabled()


def test_capturing_a_shorter_prompt_after_a_longer_request():
    """The capture's warm-ups read the engine's index buffers: a longer request's last position must
    not index past a shorter bucket's prefill (on the H200 it was a device-side assert)."""
    model = build_model("tiny", text_layers="full", seed=3)
    eng = TextEngine(model, max_batch=1, max_len=512)
    H = model.config.text_config.hidden_size
    eng.capture([(1, 300)], record=eager_stand_in)
    with eng.request():  # a whole request, as chat and VlmPipeline.run make
        eng.prefill([300], torch.randn(1, 300, H, generator=torch.Generator().manual_seed(1)))
        eng.sample()
    last = eng.last.clone()
    eng.capture([(1, 20)], record=eager_stand_in)  # then a shorter bucket (chat: the next, shorter turn)
    assert torch.equal(eng.last, last) and "prefill 1x64" in eng.graphs  # the buffers are put back


def test_capturing_a_shorter_bucket_inside_a_request_keeps_the_request():
    """A request made of bare calls (no ``request()`` block) is still held when a shorter bucket is
    captured: its tokens go on as if no capture had run."""
    model = build_model("tiny", text_layers="full", seed=3)
    H = model.config.text_config.hidden_size
    emb = torch.randn(1, 300, H, generator=torch.Generator().manual_seed(1))

    def run(capture_between: bool) -> torch.Tensor:
        eng = TextEngine(model, max_batch=1, max_len=512)
        eng.capture([(1, 300)], record=eager_stand_in)
        eng.prefill([300], emb)
        first = eng.sample()
        if capture_between:
            eng.capture([(1, 20)], record=eager_stand_in)
        tokens = torch.cat([first[:, None], eng.decode(6)], 1)
        return tokens, eng.logits[:1].clone()

    (tokens, logits), (want_tokens, want_logits) = run(True), run(False)
    assert torch.equal(tokens, want_tokens) and torch.equal(logits, want_logits)  # the cache was kept
