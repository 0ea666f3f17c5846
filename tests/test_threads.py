"""Several threads on one graph owner (core/serial.py), on a CPU with ``eager_stand_in`` graphs: the
stand-ins replay through the same shared buffers, so unserialised calls would mix them up.

GraphedEncoder, VlmPipeline and chat serialise their calls; a TextEngine serialises each call and
gives a request to one thread at a time: other threads wrap theirs in ``engine.request()`` or are
refused with a one-line error."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.measure.workloads import random_processor_output
from lfm2vl_lab.model.parity import max_rel_error
from lfm2vl_lab.model.presets import build_model
from lfm2vl_lab.serving.engine import TextEngine
from lfm2vl_lab.serving.pipeline import VlmPipeline

SHAPES = [[(16, 16)], [(8, 12), (16, 16)], [(16, 16), (12, 8), (8, 8)], [(16, 16)] * 4]


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", text_layers="full", seed=3)


def _in_threads(n: int, fn, calls: int):
    """``fn(thread, call)`` from ``n`` threads at once, ``calls`` times each; the results by thread."""
    start = threading.Barrier(n)

    def worker(k):
        start.wait()
        return [fn(k, c) for c in range(calls)]

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(worker, range(n)))


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_on_one_encoder_each_get_their_own_items(tiny, threads):
    genc = GraphedEncoder(tiny, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    inputs = [random_processor_output(SHAPES[k % len(SHAPES)], tiny, seed=k) for k in range(8)]
    want = [genc.encoder.encode(x) for x in inputs]  # the packed eager encoder, one call at a time
    outs = _in_threads(threads, lambda t, c: genc.encode(inputs[(t + c) % 8]), 12)
    for t, row in enumerate(outs):
        for c, out in enumerate(row):
            assert max_rel_error(out, want[(t + c) % 8]) <= 1e-4
    assert genc.stats.hits == sum(len(SHAPES[(t + c) % 4]) for t in range(threads) for c in range(12))


def _embeds(tiny, k: int, length: int = 20):
    return torch.randn(1, length, tiny.config.text_config.hidden_size, generator=torch.Generator().manual_seed(k))


def _request(eng, emb, steps: int = 4):
    eng.prefill([emb.shape[1]], emb)
    return torch.cat([eng.sample()[:, None], eng.decode(steps)], 1)


def test_threads_that_wrap_their_requests_share_one_engine(tiny):
    eng = TextEngine(tiny, max_batch=1, max_len=64)
    eng.capture([(1, 20)], record=eager_stand_in)
    want = [_request(TextEngine(tiny, max_batch=1, max_len=64), _embeds(tiny, k)) for k in range(4)]

    def one(t, c):
        with eng.request():
            return _request(eng, _embeds(tiny, (t + c) % 4))

    outs = _in_threads(3, one, 4)
    for t, row in enumerate(outs):
        for c, tokens in enumerate(row):
            assert torch.equal(tokens, want[(t + c) % 4])
    assert eng.serial.owner is None  # every request ended: the engine is free


def test_a_second_thread_is_refused_a_request_held_outside_request(tiny):
    eng = TextEngine(tiny, max_batch=1, max_len=64)
    eng.prefill([20], _embeds(tiny, 0))  # this thread's request, held outside request()
    with ThreadPoolExecutor(1) as pool:
        for call in (lambda: eng.prefill([20], _embeds(tiny, 1)), eng.sample, lambda: eng.decode(2),
                     lambda: eng.prompt(1, 20), lambda: eng.request().__enter__()):
            with pytest.raises(RuntimeError, match=r"holds its request \(started outside `with …\.request\(\):`\)"
                                                   r".*wrap every request") as err:
                pool.submit(call).result()
            assert "\n" not in str(err.value)
    assert eng.sample().shape == (1,)  # the owner goes on


def test_a_request_overtaken_by_another_threads_is_refused_not_continued(tiny):
    """A thread that goes on after another thread's request ran gets an error, never the other
    request's tokens."""
    eng = TextEngine(tiny, max_batch=1, max_len=64)
    with eng.request():
        eng.prefill([20], _embeds(tiny, 0))
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: _request_in_block(eng, _embeds(tiny, 1))).result()
    with eng.request(), pytest.raises(RuntimeError, match=r"decode\(\): it holds a request another thread"):
        eng.decode(2)
    with eng.request():
        view = eng.prompt(1, 20)  # where this thread's next prompt goes ...
    with ThreadPoolExecutor(1) as pool:  # ... but another thread's request runs first
        pool.submit(lambda: _request_in_block(eng, _embeds(tiny, 2))).result()
    view.copy_(_embeds(tiny, 3))
    with eng.request(), pytest.raises(RuntimeError, match=r"prefill\(\): it holds a request another thread"):
        eng.prefill([20])


def _request_in_block(eng, emb):
    with eng.request():
        return _request(eng, emb)


def _pipeline_inputs(tiny, k: int):
    from lfm2vl_lab.measure.e2e import build_prompt
    from lfm2vl_lab.measure.workloads import synthetic_image
    from lfm2vl_lab.model.inputs import process_images

    inputs = process_images([synthetic_image(256 + 64 * k, 256, seed=k)], tiny)
    return build_prompt(tiny, inputs, 1, seed=k)["input_ids"].cpu(), inputs


@pytest.mark.filterwarnings("ignore:GraphedEncoder. no CUDA device")
def test_pipelines_sharing_an_encoder_and_an_engine_serve_threads_right(tiny):
    genc = GraphedEncoder(tiny, budgets=[64, 256], record=eager_stand_in)
    genc.capture()
    eng = TextEngine(tiny, max_batch=1, max_len=256)
    pipes = [VlmPipeline(tiny, "graphed", "graphed", genc=genc, engine=eng) for _ in range(2)]
    reqs = [_pipeline_inputs(tiny, k) for k in range(3)]
    ref = VlmPipeline(tiny, "eager", "eager")
    want = [ref.run(ids, inputs, 4) for ids, inputs in reqs]
    outs = _in_threads(4, lambda t, c: pipes[t % 2].run(*reqs[(t + c) % 3], 4), 3)
    for t, row in enumerate(outs):
        for c, tokens in enumerate(row):
            assert torch.equal(tokens, want[(t + c) % 3])


def test_threads_on_one_eager_pipeline_keep_their_requests(tiny):
    pipe = VlmPipeline(tiny, "eager", "eager")  # one HfText: its cache is one request's too
    reqs = [_pipeline_inputs(tiny, k) for k in range(2)]
    want = [pipe.run(ids, inputs, 3) for ids, inputs in reqs]
    outs = _in_threads(2, lambda t, c: pipe.run(*reqs[(t + c) % 2], 3), 3)
    assert all(torch.equal(tok, want[(t + c) % 2]) for t, row in enumerate(outs) for c, tok in enumerate(row))
