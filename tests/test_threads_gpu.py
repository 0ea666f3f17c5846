"""On a GPU: several threads on one captured encoder, engine, pipeline and chat (core/serial.py).
Every result equals the one the same object gives a single thread, never an illegal memory access;
a thread on a stream of its own is ordered after the last caller's work."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.measure.workloads import random_processor_output
from lfm2vl_lab.model.presets import build_model
from lfm2vl_lab.serving.engine import TextEngine

pytestmark = pytest.mark.gpu

PRESET = "lfm2-vl-450m"
SHAPES = [[(32, 32)], [(32, 32), (16, 24)], [(24, 20), (8, 8), (32, 32)], [(32, 32)] * 4]


@pytest.fixture(scope="module")
def model():
    return build_model(PRESET, dtype=torch.bfloat16, device="cuda")


def _threads(n, fn, calls):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda t: [fn(t, c) for c in range(calls)], range(n)))


@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize("own_stream", [False, True])
def test_threads_on_one_encoder(model, threads, own_stream):
    genc = GraphedEncoder(model, budgets=[256, 1024])
    genc.capture()
    inputs = [random_processor_output(SHAPES[k % 4], PRESET, seed=k) for k in range(8)]
    want = [[o.clone() for o in genc.encode(x)] for x in inputs]  # one thread: the reference

    def call(t, c):
        if not own_stream:
            return genc.encode(inputs[(t + c) % 8])
        with torch.cuda.stream(torch.cuda.Stream()):
            out = genc.encode(inputs[(t + c) % 8])
            torch.cuda.current_stream().synchronize()
            return out

    outs = _threads(threads, call, 50)
    torch.cuda.synchronize()  # an illegal memory access would surface here
    wrong = sum(not all(torch.equal(a, b) for a, b in zip(out, want[(t + c) % 8]))
                for t, row in enumerate(outs) for c, out in enumerate(row))
    assert wrong == 0


@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize("fuse", [False, True])
def test_threads_on_one_text_engine(model, threads, fuse):
    eng = TextEngine(model, max_batch=1, max_len=256, fuse=fuse)
    eng.capture([(1, 64)])
    H = model.config.text_config.hidden_size
    embs = [torch.randn(1, 64, H, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(k))
            for k in range(4)]

    def request(t, c):
        with eng.request():
            eng.prefill([64], embs[(t + c) % 4])
            return torch.cat([eng.sample()[:, None], eng.decode(8)], 1)

    want = [request(0, k) for k in range(4)]
    outs = _threads(threads, request, 10)
    torch.cuda.synchronize()
    assert all(torch.equal(tok, want[(t + c) % 4]) for t, row in enumerate(outs) for c, tok in enumerate(row))


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_on_one_pipeline_and_on_chat(model, threads):
    from lfm2vl_lab.measure.workloads import synthetic_image
    from lfm2vl_lab.serving.chat import chat

    images = [synthetic_image(512 - 64 * k, 512, seed=k) for k in range(3)]
    want = [chat(model, im, "Describe the image.", max_new_tokens=12).token_ids for im in images]
    outs = _threads(threads, lambda t, c: chat(model, images[(t + c) % 3], "Describe the image.",
                                                max_new_tokens=12).token_ids, 6)
    torch.cuda.synchronize()
    assert all(tok == want[(t + c) % 3] for t, row in enumerate(outs) for c, tok in enumerate(row))


def test_a_capture_goes_on_while_another_thread_encodes(model):
    """Captures record in "thread_local" mode: another thread's encode (its allocations, its stream's
    synchronize) during a capture neither breaks the capture nor fails itself."""
    import threading

    busy = GraphedEncoder(model, budgets=[256])
    busy.capture()
    inp = random_processor_output(SHAPES[1], PRESET, seed=3)
    want_busy = [o.clone() for o in busy.encode(inp)]
    stop, wrong = threading.Event(), []

    def other():  # what goes wrong here is kept in ``wrong``: a thread's exception would vanish
        try:
            while not stop.is_set():
                out = busy.encode(inp)
                torch.cuda.current_stream().synchronize()
                wrong.extend(k for k, (a, b) in enumerate(zip(out, want_busy)) if not torch.equal(a, b))
        except BaseException as exc:
            wrong.append(repr(exc))

    x = random_processor_output(SHAPES[2], PRESET, seed=5)
    quiet = GraphedEncoder(model, budgets=[64, 256, 1024])  # captured with nothing else running
    quiet.capture()
    want = [o.clone() for o in quiet.encode(x)]
    worker = threading.Thread(target=other)
    worker.start()
    try:
        for _ in range(3):
            genc = GraphedEncoder(model, budgets=[64, 256, 1024])
            genc.capture()
    finally:
        stop.set()
        worker.join()
    assert all(torch.equal(a, b) for a, b in zip(genc.encode(x), want)) and wrong == []


def test_a_garbage_collection_never_runs_inside_a_capture(model):
    """An old encoder left in a reference cycle is collected before a capture, not during it (where
    destroying its graphs invalidated the capture, and a later cuBLAS call failed)."""
    import gc

    x = random_processor_output(SHAPES[3], PRESET, seed=6)
    old = GraphedEncoder(model, budgets=[64, 256, 1024])
    old.capture()
    want = [o.clone() for o in old.encode(x)]
    old.me = old  # a cycle: only the collector frees it
    del old
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # a collection at almost every allocation
    try:
        genc = GraphedEncoder(model, budgets=[64, 256, 1024])
        genc.capture()
    finally:
        gc.set_threshold(*thresholds)
    assert all(torch.equal(a, b) for a, b in zip(genc.encode(x), want))
