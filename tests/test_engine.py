"""The text model as an engine runs it (serving/engine.py) and the request pipeline (serving/pipeline.py):
the same logits and tokens as transformers' own text model and ``generate``, padding that changes
nothing, clear errors at the engine's limits, and on a GPU the captured graphs replaying the eager
bodies."""

import pytest
import torch

from lfm2vl_lab.serving.cache import bucket_batch, bucket_len, decode_spans
from lfm2vl_lab.serving.engine import TextEngine
from lfm2vl_lab.serving.layers import lfm2_text_parts
from lfm2vl_lab.serving.pipeline import HfText, VlmPipeline


@pytest.fixture(scope="module")
def text_model():
    from lfm2vl_lab import build_model

    return build_model("tiny", text_layers="full")


def hf_steps(model, emb, steps):
    """transformers' LFM2 text model on one prompt: the first-token logits, then ``steps`` greedy
    decode steps' logits, with its own DynamicCache."""
    lm, head = lfm2_text_parts(model)
    out = lm(inputs_embeds=emb[None], use_cache=True)
    logits = [head(out.last_hidden_state[:, -1])[0]]
    cache = out.past_key_values
    for _ in range(steps):
        h = lm(inputs_embeds=lm.embed_tokens(logits[-1].argmax()[None])[:, None], past_key_values=cache,
               use_cache=True).last_hidden_state[:, -1]
        logits.append(head(h)[0])
    return torch.stack(logits)


def engine_steps(eng, lengths, steps):
    """The engine's logits for the same steps: [requests, 1 + steps, vocab]."""
    eng.prefill(lengths)
    eng.sample()
    out = [eng.logits[: len(lengths)].clone()]
    for _ in range(steps):
        eng.decode(1)
        out.append(eng.logits[: len(lengths)].clone())
    return torch.stack(out, 1)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@torch.no_grad()
def test_engine_matches_transformers_per_request_lengths(text_model):
    """Two requests of different lengths in one batch: each request's prefill and decode logits equal
    transformers' own text model run on that request alone (fp32)."""
    torch.manual_seed(0)
    H = text_model.config.text_config.hidden_size
    lengths = [37, 21]
    emb = torch.randn(2, 37, H)
    eng = TextEngine(text_model, max_batch=2, max_len=128)
    eng.prompt(2, 37).copy_(emb)
    got = engine_steps(eng, lengths, 5)
    for i, n in enumerate(lengths):
        want = hf_steps(text_model, emb[i, :n], 5)
        assert rel(got[i], want) < 1e-5, (i, rel(got[i], want))
    assert eng.stats.eager == {"prefill 2x64": 1, "sample 2": 1, "decode 2x128": 5}  # no graphs on the CPU: counted


def test_decode_spans_start_past_the_prefill_bucket_and_double_up_to_max_len():
    assert decode_spans(320, 2048) == [384, 768, 1536, 2048]
    assert decode_spans(320, 448) == [384, 448]  # the engine role's cache: 280 positions and the tokens after
    assert decode_spans(128, 512) == [256, 512]
    assert decode_spans(64, 128) == decode_spans(128, 128) == [128]


@torch.no_grad()
def test_decode_attends_over_the_first_span_past_its_position_and_matches_transformers(text_model, monkeypatch):
    """A decode that runs past its first cache span (stand-in graphs, so the capture path runs): each
    step attends over the first captured span past its position, across several decode() calls, and
    its logits still equal transformers' own text model's with its whole cache (fp32)."""
    from lfm2vl_lab.core.capture import eager_stand_in

    torch.manual_seed(3)
    H = text_model.config.text_config.hidden_size
    eng = TextEngine(text_model, max_batch=1, max_len=512)
    got = eng.capture([(1, 100)], record=eager_stand_in)["captured"]
    assert got == ["decode 1x256", "decode 1x512", "prefill 1x128", "sample 1"]
    attn, conv, head = eng.fns
    spans = []

    def watched(layer, x, cos, sin, kc, vc, pos, mask, **kw):
        if mask is not None:
            spans.append((int(pos.max()), kc.shape[2], mask.shape[-1]))
        return attn(layer, x, cos, sin, kc, vc, pos, mask, **kw)

    eng.fns = (watched, conv, head)
    emb = torch.randn(1, 100, H)
    eng.prompt(1, 100).copy_(emb)
    steps = 170  # positions 100..269: 156 in the 256 span, 14 in the 512 one
    logits = engine_steps(eng, [100], steps)[0]
    assert rel(logits, hf_steps(text_model, emb[0], steps)) < 1e-5
    assert eng.stats.replays == {"prefill 1x128": 1, "sample 1": 1, "decode 1x256": 156, "decode 1x512": 14}
    layers = sum(layer.is_attention_layer for layer in eng.lm.layers)
    assert spans == [(p, S, S) for p in range(100, 270) for S in [256 if p < 256 else 512] for _ in range(layers)]
    with pytest.raises(ValueError, match="170 decoded steps pass the cache's 512 positions"):
        eng.decode(243)  # 100 + 170 + 243 = 513


@torch.no_grad()
def test_padded_tail_changes_nothing(text_model):
    """Whatever the bucket's padded positions hold (here: large noise), the logits are the same:
    every LFM2 operator is causal and the conv state is read at the real last positions."""
    torch.manual_seed(1)
    H = text_model.config.text_config.hidden_size
    eng = TextEngine(text_model, max_batch=1, max_len=128)
    emb = torch.randn(1, 30, H)
    eng.embeds.zero_()
    eng.prompt(1, 30).copy_(emb)
    clean = engine_steps(eng, [30], 3)
    eng.embeds[:, 30:64] = 50 * torch.randn(1, 34, H)
    eng.prompt(1, 30).copy_(emb)
    noisy = engine_steps(eng, [30], 3)
    assert torch.equal(clean, noisy)


def test_buckets_and_limits(text_model):
    assert [bucket_len(n) for n in (1, 64, 65, 280)] == [64, 64, 128, 320]
    assert [bucket_batch(n) for n in (1, 3, 5, 8)] == [1, 4, 8, 8]
    with pytest.raises(ValueError, match="9 requests"):
        bucket_batch(9)
    eng = TextEngine(text_model, max_batch=2, max_len=64)
    with pytest.raises(ValueError, match=r"3 requests .* 1\.\.2 requests"):
        eng.prompt(3, 10)
    with pytest.raises(ValueError, match=r"lengths \[65\].*1\.\.64 positions"):
        eng.prefill([65])
    eng.prompt(1, 60).zero_()
    eng.prefill([60])
    eng.sample()
    with pytest.raises(ValueError, match=r"5 decode steps after prompts of \[60\]"):
        eng.decode(5)


def test_hf_text_needs_one_length(text_model):
    with pytest.raises(ValueError, match=r"one length; got lengths \[3, 4\]"):
        HfText(text_model).prefill([3, 4], torch.zeros(2, 4, 64))


@pytest.fixture(scope="module")
def request_of_two(text_model):
    from lfm2vl_lab.measure.e2e import build_prompt, generate_once
    from lfm2vl_lab.measure.workloads import synthetic_image
    from lfm2vl_lab.model.inputs import process_images

    inputs = process_images([synthetic_image(512, 512, seed=1)] * 2, text_model)
    batch = build_prompt(text_model, process_images([synthetic_image(512, 512, seed=1)], text_model), 2)
    want = generate_once(text_model, batch, 4)[:, batch["input_ids"].shape[1]:]
    return batch["input_ids"].cpu(), inputs, want


@pytest.mark.parametrize("text_mode", ["eager", "graphed"])
@pytest.mark.parametrize("encoder_mode", ["eager", "graphed"])
def test_pipeline_modes_give_generates_tokens(text_model, request_of_two, text_mode, encoder_mode):
    """Every mode of the grid gives ``generate``'s greedy tokens (on the CPU the graphed modes run
    their bodies eagerly: the same plumbing, without capture)."""
    from lfm2vl_lab.core.graphed_encoder import GraphedEncoder

    ids, inputs, want = request_of_two
    pipe = VlmPipeline(text_model, encoder_mode, text_mode, genc=GraphedEncoder(text_model),
                       engine=TextEngine(text_model, max_batch=2, max_len=ids.shape[1] + 8))
    with pytest.warns(UserWarning) if encoder_mode == "graphed" else _nothing():
        got = pipe.run(ids, inputs, 4)
    assert torch.equal(got, want)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_pipeline_errors(text_model, request_of_two):
    ids, inputs, _ = request_of_two
    with pytest.raises(ValueError, match="encoder_mode must be one of"):
        VlmPipeline(text_model, "fast", "eager")
    with pytest.raises(ValueError, match="needs engine="):
        VlmPipeline(text_model, "eager", "graphed")
    pipe = VlmPipeline(text_model, "eager", "eager")
    with pytest.raises(ValueError, match=r"holds 512 image tokens but the images give 256 features"):
        pipe.run(ids, {k: v[:1] for k, v in inputs.items()})
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        pipe.run(ids, inputs, 0)


# -- on the GPU: the captured graphs --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_graph_replay_equals_eager_body(dtype):
    """The 450M text model: graphs captured for 1 and 3 requests replay what the eager bodies compute
    on fresh random prompts (fp32 within 1e-4; bf16 with the same first tokens and finite logits),
    and the calls were replays, not counted fallbacks."""
    from lfm2vl_lab import build_model

    model = build_model("lfm2-vl-450m", dtype=dtype, device="cuda", text_layers="full")
    H = model.config.text_config.hidden_size
    graphed = TextEngine(model, max_batch=4, max_len=512)
    eager = TextEngine(model, max_batch=4, max_len=512)
    graphed.capture([(1, 280), (3, 200)])
    for lengths in ([280], [200, 150, 77]):
        emb = torch.randn(len(lengths), max(lengths), H, device="cuda", dtype=dtype)
        outs = []
        for eng in (graphed, eager):
            eng.prompt(*emb.shape[:2]).copy_(emb)
            outs.append(engine_steps(eng, lengths, 4).float())
        assert torch.isfinite(outs[0]).all()
        if dtype == torch.float32:
            assert rel(outs[0], outs[1]) < 1e-4
        assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
    assert not graphed.stats.eager and sum(graphed.stats.replays.values()) == 2 * (1 + 1 + 4)


@pytest.mark.gpu
def test_every_mode_passes_parity_on_450m():
    """bf16 on the GPU: every mode's first tokens equal ``generate``'s, and its first-token logits are
    within 1e-2 of a float32 copy (or no worse than transformers' own bf16 path)."""
    from lfm2vl_lab import build_model
    from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
    from lfm2vl_lab.measure.ttft import build_pipelines, prompt_len, ttft_parity

    model = build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda", text_layers="full")
    genc = GraphedEncoder(model)
    genc.capture()
    eng = TextEngine(model, max_batch=2, max_len=1024)
    eng.capture([(2, prompt_len(model, "1x512"))])
    (res,) = ttft_parity(model, build_pipelines(model, genc, eng), cases=[("1x512", 2)])
    assert all(r["ok"] for r in res["modes"].values()), res["modes"]
    assert not eng.stats.eager


@pytest.mark.gpu
def test_every_mode_gives_generates_tokens_in_fp32():
    """fp32 on the GPU, 450M, two 512 px requests and one tiled image: every mode (graphs captured)
    gives ``generate``'s tokens and float32's logits, so a bf16 first-token difference can only be
    rounding, never the plumbing."""
    from lfm2vl_lab import build_model
    from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
    from lfm2vl_lab.measure.ttft import PARITY_CASES, build_pipelines, capture_engine, ttft_parity

    model = build_model("lfm2-vl-450m", dtype=torch.float32, device="cuda", text_layers="full")
    genc = GraphedEncoder(model)
    genc.capture()
    eng = TextEngine(model, max_batch=2, max_len=2048)
    capture_engine(eng, model, [], [], progress=False)
    for case in ttft_parity(model, build_pipelines(model, genc, eng), cases=PARITY_CASES, new_tokens=6):
        for m, r in case["modes"].items():
            assert r["same_first_token"] and r["matching_tokens"] >= 4, (case["image"], m, r)
            assert r["rel_err_vs_fp32"] < 1e-4, (case["image"], m, r)
    assert not eng.stats.eager
