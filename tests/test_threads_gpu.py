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
