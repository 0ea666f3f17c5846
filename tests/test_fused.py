"""The fused elementwise kernels (kernels/fused.py) and the dense attention of the dense graphs: each
against the plain torch it replaces, on the CPU where the logic allows (the Triton kernel through
Triton's interpreter) and on the GPU for the real kernels."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lfm2vl_lab.core.encoder import PackedVisionEncoder
from lfm2vl_lab.kernels.attention import attention_dense_blocks, attention_per_item, dense_attention
from lfm2vl_lab.kernels.fused import add_layer_norm, linear_gelu
from lfm2vl_lab.measure.workloads import random_processor_output
from lfm2vl_lab.model.parity import rel_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ln(c, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(c, eps=1e-6)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(c, generator=g))
        ln.bias.copy_(torch.randn(c, generator=g))
    return ln.to(device, dtype)


def test_add_layer_norm_unfused_is_the_plain_ops():
    x, r = torch.randn(5, 24), torch.randn(5, 24)
    ln = _ln(24)
    s, h = add_layer_norm(x, r, ln, fused=True)  # on CPU the fused kernel does not apply
    assert torch.equal(s, x + r) and torch.equal(h, ln(x + r))


def test_linear_gelu_on_cpu_is_the_modules_own_activation():
    lin = nn.Linear(16, 32)
    h = torch.randn(7, 16)
    act = nn.GELU(approximate="tanh")
    assert torch.equal(linear_gelu(h, lin, act), act(lin(h)))
    # on CPU torch._addmm_activation's GELU is the exact one: the fused path must not be taken there
    assert not torch.equal(torch._addmm_activation(lin.bias, h, lin.weight.t(), use_gelu=True), act(lin(h)))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_add_layer_norm_kernel_in_the_interpreter():
    """The Triton kernel itself, run by Triton's CPU interpreter (TRITON_INTERPRET=1 must be set
    before Triton is imported, hence the subprocess): widths that are and are not powers of two."""
    code = textwrap.dedent("""
        import torch
        from torch import nn
        from lfm2vl_lab.kernels.fused import add_layer_norm_triton
        torch.manual_seed(0)
        for c in (768, 40, 1152):
            x, r = torch.randn(6, c), torch.randn(6, c)
            ln = nn.LayerNorm(c, eps=1e-6)
            ln.weight.data.normal_(); ln.bias.data.normal_()
            s, h = add_layer_norm_triton(x, r, ln)
            assert torch.equal(s, x + r), c
            err = (h - ln(x + r)).abs().max().item()
            assert err < 1e-4, (c, err)
        s, h = add_layer_norm_triton(torch.empty(0, 8), torch.empty(0, 8), nn.LayerNorm(8))
        assert s.shape == h.shape == (0, 8)
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize("n,rows", [(1, 16), (3, 16), (2, 7)])
def test_dense_blocks_equal_per_item_attention(n, rows):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(n * rows, 4, 8, generator=g) for _ in range(3))
    cu = torch.arange(0, n * rows + 1, rows, dtype=torch.int32)
    ref = attention_per_item(q, k, v, cu, rows, 8**-0.5)
    torch.testing.assert_close(attention_dense_blocks(q, k, v, n, 8**-0.5), ref, rtol=1e-5, atol=1e-6)


def test_dense_attention_with_a_rest():
    """Two items of 16 rows through dense attention, then a rest of 5 + 3 rows (cu_seqlens counted
    from the rest's first row) through the given backend: the same as attention per item."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(40, 4, 8, generator=g) for _ in range(3))
    full = attention_per_item(q, k, v, torch.tensor([0, 16, 32, 37, 40], dtype=torch.int32), 16, 0.3)
    attn = dense_attention(2, 16, rest=attention_per_item)
    out = attn(q, k, v, torch.tensor([0, 5, 8], dtype=torch.int32), 16, 0.3)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-6)
    pure = dense_attention(2, 16)(q[:32], k[:32], v[:32], None, 16, 0.3)  # no rest: cu_seqlens unread
    torch.testing.assert_close(pure, full[:32], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# GPU: the real kernels


@pytest.mark.gpu
@pytest.mark.parametrize("c", [768, 1152, 40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_triton_add_layer_norm_on_cuda(c, dtype):
    g = torch.Generator(device="cuda").manual_seed(c)
    x, r = (torch.randn(1024, c, device="cuda", generator=g).to(dtype) for _ in range(2))
    ln = _ln(c, dtype, "cuda")
    s, h = add_layer_norm(x, r, ln, fused=True)
    assert torch.equal(s, x + r)  # the residual stream rounds exactly as the unfused add does
    ref = F.layer_norm((x + r).float(), (c,), ln.weight.float(), ln.bias.float(), ln.eps)
    assert rel_error(h, ref) <= (1e-2 if dtype == torch.bfloat16 else 1e-5)
    assert not torch.isnan(h).any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gelu_epilogue_on_cuda(dtype):
    lin = nn.Linear(768, 3072).to("cuda", dtype)
    h = torch.randn(1024, 768, device="cuda", dtype=dtype)
    act = nn.GELU(approximate="tanh")
    ref = act(F.linear(h.float(), lin.weight.float(), lin.bias.float()))
    assert rel_error(linear_gelu(h, lin, act), ref) <= (1e-2 if dtype == torch.bfloat16 else 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["lfm2-vl-450m", "lfm2-vl-1.6b"])
def test_kernel_options_keep_the_encoder_within_the_fp32_judge(preset):
    """Every combination of fuse_qkv and fuse_elementwise, bf16, against a float32 copy of the same
    weights (the kit's judge), on a mixed batch."""
    from lfm2vl_lab.model.parity import float32_reference, max_rel_error
    from lfm2vl_lab.model.presets import build_model

    model = build_model(preset, dtype=torch.bfloat16, device="cuda")
    # float32 has no FlashAttention kernel: the judge runs the exact block-mask attention
    ref = PackedVisionEncoder(float32_reference(model), attention="sdpa_blockmask", fuse_qkv=False,
                              fuse_elementwise=False)
    inputs = random_processor_output([(32, 32), (32, 32), (24, 32), (8, 16)], preset, seed=2)
    expected = ref.encode(inputs)
    plain = max_rel_error(PackedVisionEncoder(model, fuse_qkv=False, fuse_elementwise=False).encode(inputs), expected)
    for qkv in (False, True):
        for ew in (False, True):
            err = max_rel_error(PackedVisionEncoder(model, fuse_qkv=qkv, fuse_elementwise=ew).encode(inputs), expected)
            assert err == err and (err <= 1e-2 or err <= 1.05 * plain), (qkv, ew, err, plain)


# ------------------------------------------------------------------------------------------------
# Fused QKV is shared by every encoder on a model


def test_fused_qkv_is_made_once_per_model():
    from lfm2vl_lab.model.presets import build_model

    tiny_model = build_model("tiny")  # its own: the shared fixture may be fused already
    sa = tiny_model.model.vision_tower.encoder.layers[0].self_attn
    original = sa.q_proj.weight
    first = PackedVisionEncoder(tiny_model, fuse_qkv=True)
    w, b = first._qkv[0]
    assert sa.q_proj.weight.data_ptr() == w.data_ptr()  # the parameters now view the fused storage
    second = PackedVisionEncoder(tiny_model, fuse_qkv=True)
    assert second._qkv[0][0] is w and second._qkv[0][1] is b  # reused, not re-fused
    second.encode(random_processor_output([(16, 16)], tiny_model))
    assert first._qkv_current() and first._qkv[0][0] is w
    # the separate tensors are not kept: graphs captured before fusing notice and capture again
    assert not hasattr(sa, "_lab_unfused_qkv") and sa.q_proj.weight is not original


@pytest.mark.gpu
def test_graphs_survive_other_encoders_on_the_same_model():
    """A graphed encoder keeps passing the judge after other encoders (fused or not) were built on
    its model and ran eagerly: none of them frees weights its graphs read."""
    from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
    from lfm2vl_lab.model.parity import float32_reference, judge_replay
    from lfm2vl_lab.model.presets import build_model

    model = build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda")
    ref32 = float32_reference(model)
    unfused = GraphedEncoder(model, fuse_qkv=False, budgets=[256, 1024])
    unfused.capture()
    fused = GraphedEncoder(model, budgets=[256, 1024])  # fuses the model's q/k/v now
    fused.capture()
    PackedVisionEncoder(model).encode(random_processor_output([(32, 32)], "lfm2-vl-450m", seed=1))
    for k, genc in enumerate((unfused, fused, unfused)):
        inputs = random_processor_output([(32, 32), (24, 32), (8, 8)], "lfm2-vl-450m", seed=10 + k)
        verdict = judge_replay(genc.encode(inputs), genc.encoder.encode(inputs), inputs, 1e-2, ref32)
        assert verdict["pass"] and not verdict["nan"], verdict
