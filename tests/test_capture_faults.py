"""Faults during capture: a KeyboardInterrupt (a user stopping a notebook cell) and memory running out.

Either way the capture is all or nothing (no graph kept, not even through the traceback a notebook
keeps), the interrupt stays an interrupt, an out-of-memory ends in one line that names the graph and
what to do, and the eager path works at once. On a CPU the manager and the text engine run with
``eager_stand_in`` graphs and bodies that raise; on a GPU (``gpu`` marker) real captures are stopped
by a real memory limit and by an interrupt raised inside ``torch.cuda.graph``.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from lfm2vl_lab import GraphedEncoder, build_model, hf_image_features, random_processor_output, rel_error
from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.encoder import PackedVisionEncoder
from lfm2vl_lab.serving.engine import TextEngine

# What torch's caching allocator says when it runs out (the numbers the error must carry over).
TORCH_OOM = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.72 GiB of which "
             "1.50 GiB is free. 2.00 GiB allowed; Of the allocated memory 1.90 GiB is allocated by PyTorch, and "
             "12.00 MiB is reserved by PyTorch but unallocated.")
NUMBERS = r"\(tried to allocate 20\.00 MiB; 1\.50 GiB free on the device; 2\.00 GiB allowed to this process\)"
INPUTS = [(12, 16), (16, 16)]  # 48 + 64 tokens: one 128-token replay


def _failing_at(genc, budget, variant, exc, made=None):
    """Make the adapter's body raise ``exc`` (a factory) when it runs ``variant`` of ``budget``; with
    ``made``, a weak reference to an activation alive in the body when it raises joins it."""
    real = genc.adapter.forward_on_buffers
    armed = [True]

    def body(buffers, b, v):
        if armed[0] and (b, str(v)) == (budget, variant):
            activation = real(buffers, b, v)  # what the frames of a failing forward hold
            if made is not None:
                made.append(weakref.ref(activation))
            raise exc()
        return real(buffers, b, v)

    genc.adapter.forward_on_buffers = body
    return armed


def _eager_still_works(genc, model):
    inputs = random_processor_output(INPUTS, "tiny", seed=1)
    outs = genc.encode(inputs)
    assert genc.stats.eager_calls == 1 and genc.stats.replays == {}
    for o, r in zip(outs, hf_image_features(model, inputs)):
        assert rel_error(o, r) <= 1e-4


@pytest.mark.parametrize("budget", [128, 64])  # the first budget captured, or one after another succeeded
def test_keyboard_interrupt_keeps_no_graph_and_stays_an_interrupt(tiny_model, budget):
    genc = GraphedEncoder(tiny_model, budgets=[64, 128], record=eager_stand_in)
    armed = _failing_at(genc, budget, "varlen", KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        genc.capture()
    assert not genc.captured and genc.graphs == {} and genc.pool is None and genc.capture_info() == []
    _eager_still_works(genc, tiny_model)
    armed[0] = False  # the cell run again: the same encoder captures every budget
    genc.capture()
    assert sorted(genc.graphs) == [64, 128]


def test_the_traceback_a_notebook_keeps_holds_no_graph_or_buffer(tiny_model):
    """The budget that fails had captured a variant already: neither it, the budget's buffers nor the
    failing body's activations may stay alive through the kept exception (its frames' locals), or
    their memory (on a GPU: the graph pool's) never comes back."""
    genc = GraphedEncoder(tiny_model, budgets=[64, 128], record=eager_stand_in)
    assert [v.name for v in genc.adapter.graph_variants(64)[:2]] == ["varlen", "dense1"]
    made, allocate = [], genc.adapter.capture_inputs

    def recording(fn, pool=None, warmup=0):
        g = eager_stand_in(fn, pool, warmup)
        made.append(weakref.ref(g))
        return g

    def allocating(budget):
        buffers = allocate(budget)
        made.extend(weakref.ref(t) for t in buffers.values())
        return buffers

    genc.record, genc.adapter.capture_inputs = recording, allocating
    _failing_at(genc, 64, "dense1", KeyboardInterrupt, made)
    with pytest.raises(KeyboardInterrupt) as kept:  # kept alive here, as sys.last_value is in a notebook
        genc.capture()
    gc.collect()
    assert kept.value is not None and len(made) > 4
    assert [r for r in made if r() is not None] == [], "a failed capture's graphs or buffers are still alive"


@pytest.mark.parametrize("budget", [128, 64])
def test_out_of_memory_names_the_budget_the_numbers_and_what_to_do(tiny_model, budget):
    genc = GraphedEncoder(tiny_model, budgets=[64, 128], record=eager_stand_in)
    _failing_at(genc, budget, "varlen", lambda: torch.OutOfMemoryError(TORCH_OOM))
    with pytest.raises(torch.OutOfMemoryError, match=rf"capturing the {budget}-token encoder graph ran out of GPU "
                                                     rf"memory {NUMBERS}") as err:
        genc.capture()
    msg = str(err.value)
    assert "\n" not in msg and "max_run_items" in msg and "empty_cache" in msg and "eager path still works" in msg
    assert isinstance(err.value, RuntimeError) and isinstance(err.value.__cause__, torch.OutOfMemoryError)
    assert genc.graphs == {} and genc.pool is None
    _eager_still_works(genc, tiny_model)


def test_out_of_memory_is_named_when_capture_end_raises_after_it(tiny_model):
    """In a real capture the body's error is often followed by capture_end's own ("operation failed
    due to a previous error during capture"): the message must still say memory ran out."""
    def record(fn, pool=None, warmup=0):
        try:
            return eager_stand_in(fn, pool, warmup)
        except torch.OutOfMemoryError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from None

    genc = GraphedEncoder(tiny_model, budgets=[64, 128], record=record)
    _failing_at(genc, 64, "varlen", lambda: torch.OutOfMemoryError(TORCH_OOM))
    with pytest.raises(torch.OutOfMemoryError, match=rf"64-token encoder graph ran out of GPU memory {NUMBERS}"):
        genc.capture()
    assert genc.graphs == {}


def test_an_ordinary_error_still_names_the_budget(tiny_model):
    genc = GraphedEncoder(tiny_model, budgets=[64, 128], record=eager_stand_in)
    _failing_at(genc, 64, "varlen", lambda: ValueError("boom"))
    with pytest.raises(RuntimeError, match=r"capturing the 64-token encoder graph failed \(ValueError: boom\)"):
        genc.capture()
    assert genc.graphs == {}


# -- the text engine (its capture takes `record` too) --------------------------------------------


@pytest.fixture(scope="module")
def text_model():
    return build_model("tiny", text_layers="full")


def _tokens(eng, emb, lengths):
    eng.prompt(*emb.shape[:2]).copy_(emb)
    eng.prefill(lengths)
    return torch.cat([eng.sample()[:, None], eng.decode(3)], 1)


def test_text_engine_interrupt_keeps_no_graph_of_the_call_and_restores_its_buffers(text_model):
    eng = TextEngine(text_model, max_batch=2, max_len=128)
    first = eng.capture([(1, 40)], record=eager_stand_in)["captured"]
    assert first == ["decode 1x128", "prefill 1x64", "sample 1"]
    for t, v in ((eng.last, 5), (eng.ids, 7), (eng.pos, 9)):
        t.fill_(v)
    real = eng._decode_body

    def stopped(B, S):
        if B == 2:
            raise KeyboardInterrupt
        real(B, S)

    eng._decode_body = stopped
    with pytest.raises(KeyboardInterrupt):
        eng.capture([(2, 100)], record=eager_stand_in)  # prefill 2x128 and sample 2 ran, decode 2 stopped
    assert sorted(eng.graphs) == first, "the interrupted call's graphs were kept"
    assert eng.last.eq(5).all() and eng.ids.eq(7).all() and eng.pos.eq(9).all()
    del eng._decode_body
    emb = torch.randn(2, 100, text_model.config.text_config.hidden_size, generator=torch.Generator().manual_seed(0))
    got = _tokens(eng, emb, [100, 60])
    assert eng.stats.eager == {"prefill 2x128": 1, "sample 2": 1, "decode 2x128": 3}
    assert torch.equal(got, _tokens(TextEngine(text_model, max_batch=2, max_len=128), emb, [100, 60]))


def test_text_engine_out_of_memory_names_the_graph(text_model):
    eng = TextEngine(text_model, max_batch=1, max_len=64)

    def oom(B, T):
        raise torch.OutOfMemoryError(TORCH_OOM)

    eng._prefill_body = oom
    with pytest.raises(torch.OutOfMemoryError, match=rf"the text engine's 'prefill 1x64' graph ran out of GPU "
                                                     rf"memory {NUMBERS}.*max_len"):
        eng.capture([(1, 40)], record=eager_stand_in)
    assert eng.graphs == {} and eng.pool is None


# -- on the GPU: real captures, stopped ------------------------------------------------------------


def _cuda_tiny():
    return build_model("tiny", dtype=torch.bfloat16, device="cuda")


def _parity(outs, model, inputs):
    refs = hf_image_features(model, inputs)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert torch.isfinite(o).all() and rel_error(o, r) <= 1e-2


def _captures_again(genc, model, inputs, budgets, replays):
    """After the failure: a capture of every budget succeeds, and its replay is right."""
    genc.capture()
    assert sorted(genc.graphs) == budgets
    _parity(genc.encode(inputs), model, inputs)
    assert genc.stats.replays == replays
    _collect_survives()


def _collect_survives():
    """What the fault left (the failed capture's graph objects, pools, frames) can be collected
    without taking the process down: a destructor that aborts kills a notebook's kernel."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    assert torch.isfinite(torch.randn(4, device="cuda")).all()


@pytest.mark.gpu
def test_capture_under_memory_pressure_fails_clearly_and_eager_still_works():
    """A limit just above what the process holds after one eager call: the 8192-token budget's
    buffers cannot fit, the eager call still does, and without the limit the capture succeeds."""
    model = _cuda_tiny()
    genc = GraphedEncoder(model, budgets=[64, 8192], dense_graphs=False)
    inputs = random_processor_output(INPUTS[:1], "tiny", seed=2)
    torch.cuda.empty_cache()  # earlier tests' cached blocks must not count as room
    genc.encode(inputs)  # its working set is now in the allocator's cache, inside the limit below
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved() / total)
        with pytest.raises(torch.OutOfMemoryError, match=r"8192-token encoder graph ran out of GPU memory "
                                                         r"\(tried to allocate .*allowed to this process\)"):
            genc.capture()
        assert not torch.cuda.is_current_stream_capturing() and torch.cuda.current_stream() == stream
        assert genc.graphs == {} and genc.pool is None
        outs = genc.encode(inputs)  # still under the same limit
        assert genc.stats.eager_calls == 2
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    _parity(outs, model, inputs)
    _captures_again(genc, model, inputs, [64, 8192], {64: 1})


@pytest.mark.gpu
def test_out_of_memory_inside_the_captured_region_leaves_the_process_usable():
    """Memory running out *inside* ``torch.cuda.graph`` (where the allocator's retry invalidates the
    capture): one clear error naming the budget, no graph kept, eager right, and nothing that aborts
    the process later, at a garbage collection or at exit."""
    model = _cuda_tiny()
    enc = PackedVisionEncoder(model)

    def body(pixel_values, *args, **kwargs):
        out = enc(pixel_values, *args, **kwargs)
        if torch.cuda.is_current_stream_capturing():
            torch.empty(1 << 40, dtype=torch.uint8, device="cuda")  # 1 TiB, inside the captured region
        return out

    genc = GraphedEncoder(model, budgets=[64, 128], body=body)
    with pytest.raises(RuntimeError, match="128-token encoder graph"):
        genc.capture()
    assert not torch.cuda.is_current_stream_capturing() and not genc.captured and genc.pool is None
    assert torch.isfinite(torch.randn(16, device="cuda")).all()
    inputs = random_processor_output(INPUTS, "tiny", seed=4)
    _parity(genc.encode(inputs), model, inputs)
    _collect_survives()


@pytest.mark.gpu
def test_keyboard_interrupt_inside_a_capture_leaves_the_process_usable():
    model = _cuda_tiny()
    enc = PackedVisionEncoder(model)
    stop = [True]

    def body(pixel_values, *args, **kwargs):
        out = enc(pixel_values, *args, **kwargs)
        if stop[0] and pixel_values.shape[0] == 4 * 64 and torch.cuda.is_current_stream_capturing():
            raise KeyboardInterrupt  # the 64-token capture, after its warm-ups and after the 128 one
        return out

    genc = GraphedEncoder(model, budgets=[64, 128], body=body)
    stream = torch.cuda.current_stream()
    with pytest.raises(KeyboardInterrupt):
        genc.capture()
    assert not torch.cuda.is_current_stream_capturing() and torch.cuda.current_stream() == stream
    assert not genc.captured and genc.pool is None
    assert torch.isfinite(torch.randn(16, device="cuda")).all()  # the random generator left capture mode
    inputs = random_processor_output(INPUTS, "tiny", seed=3)
    _parity(genc.encode(inputs), model, inputs)
    stop[0] = False
    _captures_again(genc, model, inputs, [64, 128], {128: 1})


@pytest.mark.gpu
def test_text_engine_keyboard_interrupt_inside_a_capture():
    model = build_model("tiny", dtype=torch.bfloat16, device="cuda", text_layers="full")
    eng = TextEngine(model, max_batch=1, max_len=128)
    real = eng._sample_body

    def interrupted(B):
        real(B)
        if torch.cuda.is_current_stream_capturing():
            raise KeyboardInterrupt

    eng._sample_body = interrupted
    with pytest.raises(KeyboardInterrupt):
        eng.capture([(1, 40)])
    assert not torch.cuda.is_current_stream_capturing() and eng.graphs == {} and eng.pool is None
    assert torch.isfinite(torch.randn(16, device="cuda")).all()
    del eng._sample_body
    emb = torch.randn(1, 40, model.config.text_config.hidden_size, device="cuda", dtype=torch.bfloat16)

    def first_logits():
        eng.prompt(1, 40).copy_(emb)
        eng.prefill([40])
        eng.sample()
        logits = eng.logits[:1].clone()
        eng.decode(3)
        return logits

    eager = first_logits()
    eng.capture([(1, 40)])
    assert sorted(eng.graphs) == ["decode 1x128", "prefill 1x64", "sample 1"]  # one cache span: the whole 128
    graphed = first_logits()
    assert eng.stats.replays == {"prefill 1x64": 1, "sample 1": 1, "decode 1x128": 3}
    assert torch.isfinite(graphed).all() and rel_error(graphed, eager) <= 1e-2
    _collect_survives()
