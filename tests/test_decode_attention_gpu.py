"""On a GPU: the decode attention kernel (kernels/decode_attention.py), compiled for the card it runs on,
on the 450M text model's shapes: within bf16 rounding of fp32, blind to what lies past each request's
position, and the same bits on every replay of a CUDA graph that holds it, for whatever positions the
graph finds; and the fused 450M engine with it: the unfused engine's tokens in fp32 (that its graphs
replay the same bits is tests/test_engine_fused.py's)."""

import pytest
import torch
import torch.nn.functional as F
from test_engine_fused import _gpu_model, rel, tokens_and_logits

from lfm2vl_lab.kernels.decode_attention import decode_attention, torch_decode_attention
from lfm2vl_lab.serving.engine import TextEngine

pytestmark = pytest.mark.gpu

# the 450M text model's attention: 16 query heads over 8 KV heads of 64, the decode span of a 280-position
# prompt (384) in a cache of 512, two requests at positions 296 and 227
B, HQ, HKV, D, S, MAX_LEN, POS = 2, 16, 8, 64, 384, 512, (296, 227)
SCALE = D**-0.5
FP32_TOL, LOWP_TOL, LOWP_SLACK = 1e-4, 1e-2, 1.05


def _data(dtype, seed=0):
    """q as the engine makes it (transposed from [B, 1, Hq, d]) and kc/vc as slices of a bigger cache."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    ck, cv = (torch.randn(B + 2, HKV, MAX_LEN, D, generator=g, device="cuda").to(dtype) for _ in range(2))
    q = torch.randn(B, 1, HQ, D, generator=g, device="cuda").to(dtype).transpose(1, 2)
    return q, ck, cv


def _rel(y, ref):
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_matches_the_reference_on_the_450m_shapes(dtype):
    """fp32 within 1e-4 of float64; bf16 within 1e-2 of fp32 of the same bf16 values, or no worse than
    SDPA's own bf16 on the same inputs."""
    q, ck, cv = _data(dtype)
    kc, vc = ck[:B, :, :S], cv[:B, :, :S]
    pos = torch.tensor(POS, device="cuda")
    o = decode_attention(q, kc, vc, pos, SCALE)
    assert o.shape == q.shape and o.dtype == dtype and torch.isfinite(o).all()
    wide = torch.float64 if dtype == torch.float32 else torch.float32
    ref = torch_decode_attention(q.to(wide), kc.to(wide), vc.to(wide), pos, SCALE)
    err = _rel(o, ref)
    if dtype == torch.float32:
        assert err <= FP32_TOL, err
    else:
        mask = (torch.arange(S, device="cuda")[None] <= pos[:, None])[:, None, None, :]
        sdpa = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=SCALE, enable_gqa=True)
        assert err <= LOWP_TOL or err <= LOWP_SLACK * _rel(sdpa, ref), (err, _rel(sdpa, ref))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_positions_past_each_request_are_never_read(dtype):
    """NaN keys and infinite values past each request's position (and past the span) give the bits
    that zeros there give."""
    q, ck, cv = _data(dtype, seed=1)
    pos = torch.tensor(POS, device="cuda")
    past = torch.arange(MAX_LEN, device="cuda")[None, :] > pos[:, None]
    clean_k, clean_v, bad_k, bad_v = ck.clone(), cv.clone(), ck.clone(), cv.clone()
    for b in range(B):
        clean_k[b][:, past[b]], clean_v[b][:, past[b]] = 0, 0
        bad_k[b][:, past[b]], bad_v[b][:, past[b]] = float("nan"), float("inf")
    clean = decode_attention(q, clean_k[:B, :, :S], clean_v[:B, :, :S], pos, SCALE)
    dirty = decode_attention(q, bad_k[:B, :, :S], bad_v[:B, :, :S], pos, SCALE)
    assert torch.isfinite(clean).all() and torch.equal(clean, dirty)


def test_a_nan_in_use_reaches_only_the_heads_that_read_it():
    q, ck, cv = _data(torch.bfloat16, seed=2)
    ck[1, 3, POS[1], 5] = float("nan")  # request 1's own position, KV head 3: query heads 6 and 7
    o = decode_attention(q, ck[:B, :, :S], cv[:B, :, :S], torch.tensor(POS, device="cuda"), SCALE)
    rows = o.isnan().any(-1).any(-1).nonzero().tolist()
    assert rows == [[1, 6], [1, 7]], rows


@torch.no_grad()
def test_a_graph_holding_the_kernel_replays_the_same_bits_for_the_positions_it_finds():
    """200 replays of a CUDA graph holding the kernel give the eager call's bits every time; with other
    positions written into ``pos`` before a replay, the graph's loop follows them (the eager call's bits
    for the new positions, which differ from the old)."""
    q, ck, cv = _data(torch.bfloat16, seed=3)
    kc, vc = ck[:B, :, :S], cv[:B, :, :S]
    pos = torch.tensor(POS, device="cuda")
    eager = decode_attention(q, kc, vc, pos, SCALE)  # the first call compiles, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, kc, vc, pos, SCALE)
    for _ in range(200):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    pos.copy_(torch.tensor([40, 383], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    moved = decode_attention(q, kc, vc, pos, SCALE)
    assert torch.equal(out, moved) and not torch.equal(moved, eager)


@torch.no_grad()
def test_the_fused_engine_with_the_kernel_gives_the_unfused_tokens_in_fp32():
    """fp32, 450M, two requests, 16 greedy tokens: the fused engine's graphs with ``decode_attention="triton"``
    give the unfused engine's graphs' tokens, and its last decode step's logits within 1e-4."""
    model = _gpu_model(torch.float32)
    emb = torch.randn(2, 280, model.config.text_config.hidden_size, device="cuda")
    out = []
    for kwargs in ({}, {"fuse": True, "decode_attention": "triton"}):
        eng = TextEngine(model, max_batch=2, max_len=512, **kwargs)
        eng.capture([(2, 280)])
        tokens, _ = tokens_and_logits(eng, emb, [280, 211], 16)
        out.append((tokens, eng.logits[:2].clone()))
        assert not eng.stats.eager
    assert torch.equal(out[0][0], out[1][0]) and rel(out[1][1], out[0][1]) < 1e-4
