"""The packed split-forward encoder against transformers' own ``get_image_features``."""

import pytest
import torch

from lfm2vl_lab import (
    PackedVisionEncoder,
    SplitProjector,
    build_model,
    hf_image_features,
    load_sample_images,
    max_rel_error,
    process_images,
    random_processor_output,
    rel_error,
    synthetic_image,
)
from lfm2vl_lab.core.packing import lfm2vl_gather_idx
from lfm2vl_lab.kernels.attention import (
    attention_dense_blocks,
    attention_sdpa_blockmask,
    dense_attention,
    resolve_attention,
)
from lfm2vl_lab.model.parity import float32_reference, lowp_parity

FP32_TOL = 1e-4
BF16_TOL = 1e-2


def _assert_parity(outs, refs, tol):
    assert len(outs) == len(refs)
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape, f"item {i}: {tuple(o.shape)} vs {tuple(r.shape)}"
        assert torch.isfinite(o).all(), f"item {i}: non-finite output"
        err = rel_error(o, r)
        assert err <= tol, f"item {i}: rel error {err:.3g} > {tol}"


@pytest.fixture(scope="module")
def mixed_inputs():
    """Sample photos + a tiled 1024×768 image + a small image, in ONE processor batch."""
    images = load_sample_images() + [synthetic_image(1024, 768, seed=1), synthetic_image(200, 150, seed=2)]
    return process_images(images, "tiny")


# --------------------------------------------------------------------------------------------
# Parity with transformers (fp32, CPU)
# --------------------------------------------------------------------------------------------


def test_tiny_parity_mixed_batch(tiny_model, mixed_inputs):
    shapes = [tuple(s) for s in mixed_inputs["spatial_shapes"].tolist()]
    assert len(shapes) > 5, "the 1024×768 image should have been tiled into several items"
    assert len(set(shapes)) >= 3, "the batch should mix patch grids"
    refs = hf_image_features(tiny_model, mixed_inputs)
    outs = PackedVisionEncoder(tiny_model).encode(mixed_inputs)
    assert [o.shape[0] for o in outs] == [(h // 2) * (w // 2) for h, w in shapes]
    assert all(o.shape[1] == 64 for o in outs)
    _assert_parity(outs, refs, FP32_TOL)
    # same order: each output matches its own reference far better than any other item of its shape
    for i, o in enumerate(outs):
        for j, r in enumerate(refs):
            if j != i and r.shape == o.shape:
                assert rel_error(o, r) > 100 * FP32_TOL


def test_tiny_parity_random_shapes(tiny_model):
    shapes = [(8, 8), (32, 32), (2, 2), (14, 20), (26, 38), (4, 256)]
    inputs = random_processor_output(shapes, "tiny", seed=11)
    _assert_parity(PackedVisionEncoder(tiny_model).encode(inputs), hf_image_features(tiny_model, inputs), FP32_TOL)


@pytest.mark.slow
def test_450m_parity_one_small_image(model_450m):
    inputs = process_images([synthetic_image(256, 256, seed=3)], "lfm2-vl-450m")
    assert inputs["spatial_shapes"].tolist() == [[16, 16]]
    refs = hf_image_features(model_450m, inputs)
    outs = PackedVisionEncoder(model_450m).encode(inputs)
    assert outs[0].shape == (64, 1024)
    _assert_parity(outs, refs, FP32_TOL)


def test_parity_detects_a_broken_encoder(tiny_model):
    """Guard against a vacuous tolerance: perturbing one weight must break parity."""
    m = build_model("tiny")
    inputs = random_processor_output([(16, 16)], "tiny", seed=4)
    refs = hf_image_features(m, inputs)
    enc = PackedVisionEncoder(m)
    with torch.no_grad():
        m.model.vision_tower.encoder.layers[0].self_attn.q_proj.weight.mul_(1.1)
    assert max_rel_error(enc.encode(inputs), refs) > 10 * FP32_TOL


# --------------------------------------------------------------------------------------------
# The split projector
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("h,w", [(2, 2), (4, 6), (16, 16), (26, 38)])
def test_split_projector_forward_equals_transformers(tiny_model, h, w):
    proj = tiny_model.model.multi_modal_projector
    split = SplitProjector(proj, factor=2)
    assert split.inner is proj  # parameters shared, not copied
    x = torch.randn(1, h, w, 64)
    with torch.no_grad():
        ref = proj(x)
        got = split(x)
    assert got.shape == ref.shape == (1, h // 2, w // 2, 64)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_forward_with_gather_idx_equals_manual_unshuffle(tiny_model):
    proj = tiny_model.model.multi_modal_projector
    split = SplitProjector(proj, factor=2)
    shapes = [(4, 6), (32, 32), (14, 20)]
    x = torch.randn(sum(h * w for h, w in shapes), 64)
    manual, o = [], 0
    for h, w in shapes:
        manual.append(proj.pixel_unshuffle(x[o : o + h * w].reshape(1, h, w, 64)).reshape(-1, 256))
        o += h * w
    with torch.no_grad():
        got = split.forward_with_gather_idx(x, lfm2vl_gather_idx(shapes))
        ref = split.forward_from_unshuffled(torch.cat(manual))
    assert got.shape == ref.shape == (6 + 256 + 70, 64)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Attention backends
# --------------------------------------------------------------------------------------------


def test_attention_auto_on_cpu_is_the_blockmask(tiny_model):
    assert PackedVisionEncoder(tiny_model).attention_backend == "sdpa_blockmask"
    assert PackedVisionEncoder(tiny_model, attention="auto").attention_backend == "sdpa_blockmask"


def test_attention_varlen_on_cpu_raises(tiny_model):
    enc = PackedVisionEncoder(tiny_model, attention="varlen")
    with pytest.raises(ValueError, match="varlen"):
        enc.encode(random_processor_output([(4, 6)], "tiny"))
    with pytest.raises(ValueError, match="CUDA"):
        resolve_attention("varlen", torch.device("cpu"))


def test_auto_attention_follows_the_dtype():
    """FlashAttention varlen takes half precision only: ``auto`` never picks it for fp32 (a fp32 model
    on a GPU then captures with the exact block-mask path), and asking for it says why."""
    cuda = torch.device("cuda")
    name, _ = resolve_attention("auto", cuda, torch.float32)
    assert name == "sdpa_blockmask"
    with pytest.raises(ValueError, match=r"fp16 or bf16 .*got cuda, torch.float32"):
        resolve_attention("varlen", cuda, torch.float32)


@pytest.mark.parametrize(("capability", "half", "fp32"), [
    ((7, 5), "sdpa_blockmask", "sdpa_blockmask"),  # T4: no FlashAttention-2
    ((8, 0), "varlen", "sdpa_blockmask"),  # A100
    ((8, 6), "varlen", "sdpa_blockmask"),  # A10
    ((8, 9), "varlen", "sdpa_blockmask"),  # L4
    ((9, 0), "varlen", "sdpa_blockmask"),  # H100 / H200
])
def test_auto_attention_follows_the_gpu(monkeypatch, capability, half, fp32):
    """The workshop's GPUs, faked on the CPU: ``auto`` picks a backend that exists on the device, and
    asking for varlen on a T4 names the capability instead of failing inside the kernel."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda")
    for dtype in (torch.float16, torch.bfloat16):
        assert resolve_attention("auto", cuda, dtype)[0] == half
    assert resolve_attention("auto", cuda, torch.float32)[0] == fp32
    if half == "varlen":
        assert resolve_attention("varlen", cuda, torch.float16)[0] == "varlen"
    else:
        with pytest.raises(ValueError, match=r"sm80 or newer; this GPU is sm75"):
            resolve_attention("varlen", cuda, torch.float16)


def test_unknown_attention_backend():
    with pytest.raises(ValueError, match="flash9"):
        resolve_attention("flash9", torch.device("cpu"))


def test_blockmask_attention_equals_per_sequence_sdpa():
    torch.manual_seed(0)
    lens = [5, 12, 1, 7]
    t, heads, d = sum(lens) + 3, 2, 8  # 3 rows of buffer padding past cu_seqlens[-1]
    q, k, v = (torch.randn(t, heads, d) for _ in range(3))
    cu = torch.tensor([0, 5, 17, 18, 25], dtype=torch.int32)
    out = attention_sdpa_blockmask(q, k, v, cu, max(lens), d**-0.5)
    o = 0
    for n in lens:
        sl = slice(o, o + n)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), scale=d**-0.5
        ).transpose(0, 1)
        torch.testing.assert_close(out[sl], ref, rtol=1e-5, atol=1e-6)
        o += n
    assert torch.isfinite(out).all()  # padding rows attend among themselves, no NaN


def test_dense_attention_is_exact_for_one_item_only():
    torch.manual_seed(1)
    t, heads, d = 24, 2, 8
    q, k, v = (torch.randn(t, heads, d) for _ in range(3))
    one = torch.tensor([0, t], dtype=torch.int32)
    torch.testing.assert_close(attention_dense_blocks(q, k, v, 1, d**-0.5),
                               attention_sdpa_blockmask(q, k, v, one, t, d**-0.5), rtol=1e-5, atol=1e-6)
    two = torch.tensor([0, 10, t], dtype=torch.int32)  # why it is not a user backend: it mixes items
    assert not torch.allclose(attention_dense_blocks(q, k, v, 1, d**-0.5),
                              attention_sdpa_blockmask(q, k, v, two, 14, d**-0.5), atol=1e-3)
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_attention("dense", torch.device("cpu"))


def test_forward_with_dense_attention_matches_for_one_item(tiny_model):
    enc = PackedVisionEncoder(tiny_model)
    batch = enc.pack(random_processor_output([(32, 32)], "tiny", seed=2))
    rows = int(batch.cu_seqlens[-1])
    assert batch.pixel_values.shape[0] == rows  # one item, no padding rows: the whole batch is one sequence
    with torch.no_grad():
        ref = enc.forward_packed(batch)
        out = enc(batch.pixel_values, batch.pos_embeds, batch.cu_seqlens, batch.max_seqlen, batch.gather_idx,
                  attn=dense_attention(1, rows))
    assert rel_error(out, ref) <= 1e-5


# --------------------------------------------------------------------------------------------
# GPU (run on the device)
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny", "lfm2-vl-450m"])
def test_bf16_parity_on_cuda(preset):
    model = build_model(preset, dtype=torch.bfloat16, device="cuda")
    images = load_sample_images() + [synthetic_image(1024, 768, seed=1), synthetic_image(200, 150, seed=2)]
    inputs = process_images(images, preset)
    refs = hf_image_features(model, inputs)
    enc = PackedVisionEncoder(model)
    assert enc.attention_backend in ("varlen", "sdpa_blockmask")
    outs = enc.encode(inputs)
    assert all(o.dtype == torch.bfloat16 and o.device.type == "cuda" for o in outs)
    assert all(o.shape == r.shape for o, r in zip(outs, refs))
    # Judged against float32 (bf16 vs bf16 differs by ~1e-2 on random deep weights: lowp_parity)
    judged = lowp_parity(outs, refs, hf_image_features(float32_reference(model), inputs), BF16_TOL)
    assert judged["pass"], judged


@pytest.mark.gpu
def test_packed_forward_has_no_host_sync():
    model = build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda")
    enc = PackedVisionEncoder(model)
    inputs = random_processor_output([(32, 32), (16, 24), (26, 38)], "lfm2-vl-450m", seed=7)
    with torch.no_grad():
        enc.forward_packed(enc.pack(inputs))  # warm-up: lazy kernel loading, cuBLAS handles
        batch = enc.pack(inputs)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = enc.forward_packed(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    outs = list(out.split(batch.out_tokens))
    fp32_refs = hf_image_features(float32_reference(model), inputs)
    judged = lowp_parity(outs, hf_image_features(model, inputs), fp32_refs, BF16_TOL)
    assert judged["pass"], judged
