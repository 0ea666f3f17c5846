"""kernels/decode_attention.py: the decode step's attention kernel, on the CPU. The kernel runs in Triton's
interpreter (one subprocess runs every kernel check, the engine's decode with it too, and prints its
findings); the plain-torch fallback, the input checks and the custom op run here. The GPU half (the
450M shapes, graph replays, the engine's runs bit for bit) is tests/test_decode_attention_gpu.py."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from interpreter import run_interpreted

from lfm2vl_lab.kernels.decode_attention import (
    block_size,
    decode_attention,
    decode_attention_op,
    torch_decode_attention,
)
from lfm2vl_lab.kernels.gemv import interpreting

FP32_TOL = 1e-4  # the kit's rule for fp32 against a float64 reference
LOWP_TOL, LOWP_SLACK = 1e-2, 1.05  # bf16 against fp32 of the same values: within 1e-2, or no worse than SDPA's own
# (dtype, B, Hq, Hkv, d): one, two and three requests; a group of 2, 8 pairs (the 450M model's 16 over 8),
# no sharing, a group of 3 (padded to 4 rows inside the kernel); one head_dim of 32
CASES = [(dt, b, hq, hkv, 64) for dt in ("float32", "bfloat16") for b in (1, 2, 3)
         for hq, hkv in ((2, 1), (16, 8), (4, 4))] + [("float32", 2, 6, 2, 64), ("bfloat16", 2, 4, 2, 32)]

INTERPRETED = textwrap.dedent("""
    import json, torch, torch.nn.functional as F
    from lfm2vl_lab.kernels import decode_attention as DA
    CASES = json.loads(%r)
    g = torch.Generator().manual_seed(0)
    launches = []
    _kernel = DA._kernel
    DA._kernel = lambda: launches.append(1) or _kernel()

    def data(B, Hq, Hkv, d, S, dtype):
        # kc/vc as the engine slices them: rows and positions of a bigger cache; q transposed from [B, 1, Hq, d]
        ck, cv = (torch.randn(B + 1, Hkv, S + 37, d, generator=g).to(dtype) for _ in range(2))
        return torch.randn(B, 1, Hq, d, generator=g).to(dtype).transpose(1, 2), ck, cv

    def rel(y, ref):
        return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()

    def positions(G, d, block_s=None):
        # 0, inside the first chunk, either side of a chunk boundary, the span's last (in a third, partial chunk)
        blk = block_s or DA.block_size(G, d)
        S = 2 * blk + 22
        return blk, S, [0, 10, blk - 1, blk, blk + 1, S - 1]

    def run_case(dtype, B, Hq, Hkv, d, block_s=None):
        dtype = getattr(torch, dtype)
        blk, S, pos_all = positions(Hq // Hkv, d, block_s)
        row = {"block": blk, "S": S, "err": 0.0, "sdpa_err": 0.0, "same_again": True, "shape_dtype_ok": True}
        q, ck, cv = data(B, Hq, Hkv, d, S, dtype)
        kc, vc = ck[:B, :, :S], cv[:B, :, :S]
        for i in range(0, len(pos_all), B):
            pos = torch.tensor((pos_all[i:i + B] + pos_all[:B])[:B])
            o = DA.decode_attention(q, kc, vc, pos, d ** -0.5, block_s)
            if i == 0:
                row["same_again"] = torch.equal(o, DA.decode_attention(q, kc, vc, pos, d ** -0.5, block_s))
            row["shape_dtype_ok"] &= o.shape == q.shape and o.dtype == dtype
            wide = torch.float64 if dtype == torch.float32 else torch.float32
            ref = DA.torch_decode_attention(q.to(wide), kc.to(wide), vc.to(wide), pos, d ** -0.5)
            mask = (torch.arange(S)[None] <= pos[:, None])[:, None, None, :]
            sdpa = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=d ** -0.5, enable_gqa=True)
            row["err"] = max(row["err"], rel(o, ref))
            row["sdpa_err"] = max(row["sdpa_err"], rel(sdpa, ref))
        return row

    out = {"cases": [run_case(*c) for c in CASES], "many_chunks": run_case("float32", 2, 16, 8, 64, 16)}

    def nan_rows(o):
        return sorted({(b, h) for b, h in o.isnan().any(-1).any(-1).nonzero().tolist()})

    out["garbage"], out["nan"] = {}, {}
    for name in ("float32", "bfloat16"):
        dtype = getattr(torch, name)
        B, Hq, Hkv, d = 3, 16, 8, 64
        blk, S, _ = positions(Hq // Hkv, d)
        q, ck, cv = data(B, Hq, Hkv, d, S, dtype)
        pos = torch.tensor([10, blk, S + 5])  # the last past the span: all S positions in use, none after
        past = torch.arange(S + 37)[None, :] > pos[:, None]  # [B, S + 37]: past each request's position
        past = past | (torch.arange(S + 37) >= S)[None, :]  # and everything past the span
        clean_k, clean_v, bad_k, bad_v = ck.clone(), cv.clone(), ck.clone(), cv.clone()
        for b in range(B):
            clean_k[b][:, past[b]] = 0
            clean_v[b][:, past[b]] = 0
            bad_k[b][:, past[b]] = float("nan")
            bad_v[b][:, past[b]] = float("inf")
            bad_v[b][::2, past[b]] = float("-inf")
        bad_k[B], bad_v[B] = float("nan"), float("inf")  # the cache row past the batch
        clean = DA.decode_attention(q, clean_k[:B, :, :S], clean_v[:B, :, :S], pos, 0.125)
        dirty = DA.decode_attention(q, bad_k[:B, :, :S], bad_v[:B, :, :S], pos, 0.125)
        out["garbage"][name] = {"equal": torch.equal(clean, dirty), "finite": bool(clean.isfinite().all())}
        # a NaN inside the positions in use: k at request 1's own position (the last chunk's last one used),
        # v at request 2's position 0, one element of q; each reaches only what reads it
        pos = torch.tensor([10, blk + 1, S - 1])
        kn, vn, qn = ck.clone(), cv.clone(), q.clone()
        kn[1, 3, blk + 1, 5] = float("nan")
        vn[2, 0, 0, 7] = float("nan")
        qn[0, 9, 0, 2] = float("nan")
        found = {}
        for what, args in (("k", (q, kn, cv)), ("v", (q, ck, vn)), ("q", (qn, ck, cv))):
            qq, kk, vv = args
            found[what] = nan_rows(DA.decode_attention(qq, kk[:B, :, :S], vv[:B, :, :S], pos, 0.125))
        out["nan"][name] = found

    torch.compile = lambda fn, **options: fn  # the layer functions uncompiled: every kernel call is the engine's
    from lfm2vl_lab import build_model
    from lfm2vl_lab.core.capture import eager_stand_in
    from lfm2vl_lab.serving.engine import TextEngine
    model = build_model("tiny", text_layers=4)
    lengths = [70, 5, 77]
    emb = torch.randn(3, 77, model.config.text_config.hidden_size, generator=torch.Generator().manual_seed(1))
    runs = []
    for eng in (TextEngine(model, max_batch=4, max_len=256),
                TextEngine(model, max_batch=4, max_len=256, fuse=True, decode_attention="triton")):
        eng.capture([(3, 77)], record=eager_stand_in)
        eng.prompt(3, 77).copy_(emb)
        eng.prefill(lengths)
        launches.clear()
        tokens = torch.cat([eng.sample()[:, None], eng.decode(4)], 1)
        runs.append((tokens, eng.logits[:3].clone(), len(launches)))
    (ta, la, na), (tb, lb, nb) = runs
    out["engine"] = {"same_tokens": torch.equal(ta, tb), "rel": ((lb - la).norm() / la.norm()).item(),
                     "launches": [na, nb]}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def interpreted():
    """Every kernel check, run once by Triton's interpreter in a subprocess."""
    return run_interpreted(INTERPRETED % json.dumps(CASES))


def _judge(dtype: str, row: dict) -> None:
    assert row["shape_dtype_ok"] and row["same_again"], row
    if dtype == "float32":
        assert row["err"] <= FP32_TOL, row
    else:
        assert row["err"] <= LOWP_TOL or row["err"] <= LOWP_SLACK * row["sdpa_err"], row


@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: "{}-B{}-Hq{}-Hkv{}-d{}".format(*CASES[i]))
def test_the_kernel_matches_the_reference_at_every_chunk_boundary(interpreted, i):
    """fp32 within 1e-4 of float64; bf16 within 1e-2 of fp32 of the same values (or no worse than SDPA's
    own bf16); positions 0, 10, either side of a chunk boundary and the span's last; a call made twice
    gives the same bits; the output has q's shape and dtype."""
    _, _, hq, hkv, d = CASES[i]
    row = interpreted["cases"][i]
    assert row["block"] == block_size(hq // hkv, d) and row["block"] >= 32, row  # 64, or 32 for 3 rows padded to 4
    assert row["S"] == 2 * row["block"] + 22, row  # three chunks, the last one partial
    _judge(CASES[i][0], row)


def test_many_short_chunks_rescale_the_running_softmax_exactly(interpreted):
    row = interpreted["many_chunks"]
    assert row["block"] == 16 and row["S"] == 54
    _judge("float32", row)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_positions_past_each_request_are_never_read(interpreted, dtype):
    """NaN keys and infinite values past each request's position, past the span (a request whose position is
    past it reads the span's S positions) and in the cache's row past the batch give the bits that zeros
    there give: the kernel never loads them."""
    assert interpreted["garbage"][dtype] == {"equal": True, "finite": True}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_nan_in_use_reaches_the_heads_that_read_it_and_no_other(interpreted, dtype):
    """A NaN key at request 1's own position (KV head 3: query heads 6 and 7), a NaN value at request 2's
    position 0 (KV head 0: query heads 0 and 1), a NaN in request 0's query head 9: NaN there, nowhere else."""
    assert interpreted["nan"][dtype] == {"k": [[1, 6], [1, 7]], "v": [[2, 0], [2, 1]], "q": [[0, 9]]}


def test_the_engine_with_the_kernel_gives_the_unfused_tokens_and_logits(interpreted):
    """The tiny model, three requests (batch bucket 4), five tokens: the fused engine with
    ``decode_attention="triton"``, its attention run by the kernel in the interpreter, gives the unfused
    engine's tokens, and its last decode step's logits within 1e-5; one launch per attention layer and step."""
    engine = interpreted["engine"]
    assert engine["same_tokens"] and engine["rel"] < 1e-5, engine
    assert engine["launches"] == [0, 4], engine  # the tiny model's one attention layer, four decode steps


# --- here, without the interpreter --------------------------------------------------------------


def _data(B=2, Hq=4, Hkv=2, S=20, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ck, cv = (torch.randn(B + 1, Hkv, S + 5, d, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(B, 1, Hq, d, generator=g).to(dtype).transpose(1, 2)
    return q, ck[:B, :, :S], cv[:B, :, :S]


@pytest.mark.parametrize("B,Hq,Hkv,pos", [(1, 2, 1, [0]), (2, 16, 8, [7, 19]), (3, 4, 4, [19, 0, 12]),
                                          (2, 6, 2, [25, 3])])
def test_the_fallback_is_sdpa_with_the_decode_mask(B, Hq, Hkv, pos):
    """The plain-torch reference equals SDPA with the engine's mask (fp32, 1e-5), a position past the span
    (25 of 20) included: every position is then in use."""
    q, kc, vc = _data(B, Hq, Hkv)
    pos = torch.tensor(pos)
    mask = (torch.arange(kc.shape[2])[None] <= pos[:, None])[:, None, None, :]
    want = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=0.3, enable_gqa=True)
    got = torch_decode_attention(q, kc, vc, pos, 0.3)
    assert got.shape == q.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(interpreting(), reason="runs the kernel under TRITON_INTERPRET=1")
def test_without_triton_or_a_gpu_it_is_the_fallback():
    q, kc, vc = _data(dtype=torch.bfloat16)
    pos = torch.tensor([3, 11])
    assert torch.equal(decode_attention(q, kc, vc, pos, 0.25), torch_decode_attention(q, kc, vc, pos, 0.25))


def test_float64_is_computed_in_float64_even_under_the_interpreter(monkeypatch):
    """A model cast with ``.double()`` keeps its fused engine: float64 inputs take the plain-torch path (the
    kernel reads at most fp32), summed in float64, not rounded through fp32 on the way."""
    q, kc, vc = _data(dtype=torch.float64)
    pos = torch.tensor([7, 19])
    mask = (torch.arange(kc.shape[2])[None] <= pos[:, None])[:, None, None, :]
    want = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=0.3, enable_gqa=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # where the kernel would run for a 16- or 32-bit input
    got = decode_attention(q, kc, vc, pos, 0.3)
    assert got.dtype == torch.float64 and (got - want).abs().max().item() < 1e-12


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


Q, KV, POS = (2, 4, 1, 16), (2, 2, 20, 16), torch.tensor([3, 5])
BAD = {
    "q-int": (lambda: (torch.ones(Q, dtype=torch.int32), _bf16(*KV), _bf16(*KV), POS), "q dtype torch.int32"),
    "kc-dtype": (lambda: (_bf16(*Q), torch.randn(KV), _bf16(*KV), POS), "kc dtype torch.float32"),
    "vc-dtype": (lambda: (_bf16(*Q), _bf16(*KV), torch.randn(KV).half(), POS), "vc dtype torch.float16"),
    "q-3d": (lambda: (_bf16(2, 4, 16), _bf16(*KV), _bf16(*KV), POS), "q shape (2, 4, 16)"),
    "q-len": (lambda: (_bf16(2, 4, 3, 16), _bf16(*KV), _bf16(*KV), POS), "q shape (2, 4, 3, 16) holds 3 queries"),
    "kv-shapes": (lambda: (_bf16(*Q), _bf16(*KV), _bf16(2, 2, 24, 16), POS), "vc shape (2, 2, 24, 16)"),
    "batch": (lambda: (_bf16(*Q), _bf16(3, 2, 20, 16), _bf16(3, 2, 20, 16), POS), "kc shape (3, 2, 20, 16) holds 3"),
    "head-dim": (lambda: (_bf16(*Q), _bf16(2, 2, 20, 32), _bf16(2, 2, 20, 32), POS), "kc head_dim 32"),
    "not-pow2": (lambda: (_bf16(2, 4, 1, 24), _bf16(2, 2, 20, 24), _bf16(2, 2, 20, 24), POS), "head_dim 24"),
    "groups": (lambda: (_bf16(2, 6, 1, 16), _bf16(2, 4, 20, 16), _bf16(2, 4, 20, 16), POS), "6 query heads"),
    "pos-dtype": (lambda: (_bf16(*Q), _bf16(*KV), _bf16(*KV), POS.int()), "pos torch.int32"),
    "pos-shape": (lambda: (_bf16(*Q), _bf16(*KV), _bf16(*KV), POS[:1]), "pos torch.int64 of shape (1,)"),
    "device": (lambda: (_bf16(*Q), _bf16(*KV), _bf16(*KV), POS.to("meta")), "pos on meta"),
    "stride": (lambda: (_bf16(*Q), _bf16(2, 2, 16, 20).transpose(-1, -2), _bf16(*KV), POS),
               "kc strides (640, 320, 1, 20)"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_line_naming_the_value(name):
    make, needle = BAD[name]
    with pytest.raises(ValueError) as err:
        decode_attention(*make(), 0.25)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("block_s", [8, 24, 0, True])
def test_a_bad_block_is_one_line_naming_it(block_s):
    q, kc, vc = _data()
    with pytest.raises(ValueError, match=rf"^decode_attention: block_s {block_s!r}, expected a power of two"):
        decode_attention(q, kc, vc, torch.tensor([1, 2]), 0.25, block_s)


def test_the_custom_op_is_the_function_and_compiles_whole():
    """``torch.ops.lfm2vl.decode_attention`` gives what the function gives, its fake (shape-only) version
    agrees with it, and a function that calls it compiles as one frame, with no graph break."""
    from torch._dynamo.testing import CompileCounter

    op = decode_attention_op()
    q, kc, vc = _data()
    pos = torch.tensor([4, 19])
    assert torch.equal(torch.ops.lfm2vl.decode_attention(q, kc, vc, pos, 0.25), decode_attention(q, kc, vc, pos, 0.25))
    torch.library.opcheck(op, (q, kc, vc, pos, 0.25))
    counter = CompileCounter()
    fn = torch.compile(lambda a, k, v, p: op(a, k, v, p, 0.25) * 2, backend=counter, fullgraph=True)
    assert torch.equal(fn(q, kc, vc, pos), decode_attention(q, kc, vc, pos, 0.25) * 2) and counter.frame_count == 1
