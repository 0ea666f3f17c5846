"""LFM2's text layers on the hybrid cache: the math each of the engine's graphs captures.

One function per layer kind, taking the layer (transformers' own module: its weights, norms,
projections and rotary embedding), the residual stream and the layer's slice of the cache, and
returning the new residual stream. ``mask is None`` / ``conv_idx is not None`` means a prefill (the
positions from 0, written into the cache); otherwise one decode token per request.

**Fused.** The same functions are what the fused engine compiles (``torch.compile``, inductor):
compiled once per layer kind and shape and reused by every layer of that kind, because the layer is
an argument, not part of the code. Inductor turns the elementwise work between the GEMMs (RMSNorms,
residual adds, rotary, SiLU-and-multiply, the gate products) into a few generated kernels. Two
things it cannot do alone are given to it:

* :func:`shared_weights`: the layer's linears that read the same input as one weight
  (:func:`~lfm2vl_lab.kernels.fused.shared_linear`): q/k/v is one GEMM, and the FFN's ``w1``/``w3``
  another, so a layer runs four GEMMs instead of six (attention) or five (short conv);
* ``fused=True``: the depthwise short convolution (kernel 3) written as a weighted sum of shifted
  inputs, which inductor fuses with the gates around it, instead of a cuDNN call of its own.

Both change only rounding: the fused and unfused engines give the same greedy tokens in float32.

**The linears.** Every function takes ``linear``, the function each of its linear layers runs
through (``linear(x, weight, bias)``, ``F.linear`` by default, which is what ``nn.Linear`` calls).
Once a decode step is graphed and fused, most of its time is these linears, and at one row each is
a GEMV that cuBLAS runs well below the memory bandwidth: the fused engine passes
:func:`~lfm2vl_lab.kernels.router.decode_linear`, which sends rows of at most four to the kit's Triton
GEMV and a prefill's hundreds of rows to torch's own (the ``roofline`` file times both). Where the
GEMV takes a call, the router also takes the work on either side of it into the kernel (:func:`normed`,
:func:`added`, :func:`feed_forward`): the RMSNorm before q/k/v, the conv's input projection, the MLP's
gate and up and the LM head; the MLP's ``silu(g) * u`` before its down projection; and the residual
add after the out and down projections. A decode layer then runs two to three kernels fewer, each
computed with torch's roundings (:mod:`lfm2vl_lab.kernels.gemv`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.fused import shared_linear
from ..kernels.router import DecodeLinear


def lfm2_text_parts(model):
    """transformers' LFM2 text model (``Lfm2Model``) and LM head inside an LFM2-VL model."""
    inner = getattr(model, "model", model)
    return inner.language_model, model.lm_head


def shared_weights(layer: nn.Module) -> dict:
    """What the fused engine passes a layer's function besides the cache: the shared weights (the
    module's parameters become views into them, kept on the module) and, for a short-conv layer,
    ``fused=True``."""
    mlp = layer.feed_forward
    w13, _ = shared_linear(mlp, (mlp.w1, mlp.w3), "_lab_shared_w13")
    if layer.is_attention_layer:
        a = layer.self_attn
        qkv, _ = shared_linear(a, (a.q_proj, a.k_proj, a.v_proj), "_lab_shared_qkv")
        return {"qkv": qkv, "w13": w13}
    return {"w13": w13, "fused": True}


def project(proj: nn.Linear, x: torch.Tensor, linear=None) -> torch.Tensor:
    """``proj(x)`` through ``linear`` (``F.linear``, as ``nn.Linear`` itself runs, when None)."""
    return (linear or F.linear)(x, proj.weight, proj.bias)


# The fused engine's router (DecodeLinear) also takes the op before a linear or the addition after it into
# the GEMV's kernel: these three say so once, and run the same ops in torch for any other ``linear``.
def normed(norm: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias=None, linear=None) -> torch.Tensor:
    """``F.linear(norm(x), weight, bias)`` through ``linear``."""
    if isinstance(linear, DecodeLinear):
        return linear.norm_linear(x, norm, weight, bias)
    return (linear or F.linear)(norm(x), weight, bias)


def added(residual: torch.Tensor, proj: nn.Linear, x: torch.Tensor, linear=None) -> torch.Tensor:
    """``residual + proj(x)`` through ``linear``."""
    if isinstance(linear, DecodeLinear):
        return linear.residual_linear(x, proj.weight, proj.bias, residual)
    return residual + project(proj, x, linear)


def feed_forward(mlp: nn.Module, x: torch.Tensor, norm: nn.Module, w13: torch.Tensor | None,
                 linear=None) -> torch.Tensor:
    """The residual stream after LFM2's SwiGLU MLP, ``x + w2(silu(w1 h) * w3 h)`` with ``h = norm(x)``;
    with ``w13`` the two input GEMMs are one."""
    if w13 is None:
        h = norm(x)
        g, u = project(mlp.w1, h, linear), project(mlp.w3, h, linear)
        return x + project(mlp.w2, F.silu(g) * u, linear)
    gu = normed(norm, x, w13, None, linear)
    if isinstance(linear, DecodeLinear):
        return linear.swiglu_linear(gu, mlp.w2.weight, mlp.w2.bias, x)
    g, u = gu.chunk(2, dim=-1)
    return x + project(mlp.w2, F.silu(g) * u, linear)


def attention_layer(layer, x, cos, sin, kc, vc, pos, mask, qkv=None, w13=None, linear=None) -> torch.Tensor:
    """An attention layer. Prefill (``mask is None``): ``x`` holds positions 0..L-1, written into
    ``kc``/``vc[:, :, :L]``, causal attention among them. Decode: one token per request, written at
    its own position ``pos`` and attending to the cache positions ``mask`` allows."""
    from transformers.models.lfm2.modeling_lfm2 import apply_rotary_pos_emb

    attn = layer.self_attn
    B, L, _ = x.shape
    d = attn.head_dim
    if qkv is None:
        h = layer.operator_norm(x)
        q, k, v = (project(p, h, linear) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    else:
        sizes = (attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0], attn.v_proj.weight.shape[0])
        q, k, v = normed(layer.operator_norm, x, qkv, None, linear).split(sizes, dim=-1)
    q = attn.q_layernorm(q.reshape(B, L, -1, d)).transpose(1, 2)
    k = attn.k_layernorm(k.reshape(B, L, -1, d)).transpose(1, 2)
    v = v.reshape(B, L, -1, d).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if mask is None:
        kc[:, :, :L].copy_(k)
        vc[:, :, :L].copy_(v)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
    else:  # write this token at each request's own position, attend to positions <= it
        idx = pos.view(B, 1, 1, 1).expand(B, k.shape[1], 1, d)
        kc.scatter_(2, idx, k)
        vc.scatter_(2, idx, v)
        o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
    x = added(x, attn.out_proj, o.transpose(1, 2).reshape(B, L, -1), linear)
    return feed_forward(layer.feed_forward, x, layer.ffn_norm, w13, linear)


def short_conv(window: torch.Tensor, weight: torch.Tensor, bias, length: int, fused: bool) -> torch.Tensor:
    """The depthwise causal convolution over ``window`` ``[B, C, length + k - 1]`` (the inputs with
    their ``k - 1`` predecessors in front): ``[B, C, length]``. ``fused``: as a weighted sum of ``k``
    shifted slices, which inductor fuses with its neighbours; else ``F.conv1d``."""
    if not fused:
        return F.conv1d(window, weight, bias, groups=window.shape[1])
    k = weight.shape[-1]
    w = weight[:, 0, :, None]  # [C, k, 1]
    y = sum(window[:, :, j : j + length] * w[:, j] for j in range(k))
    return y if bias is None else y + bias[:, None]


def conv_layer(layer, x, state, conv_idx, w13=None, fused: bool = False, linear=None) -> torch.Tensor:
    """A gated short-convolution layer; ``state`` keeps each request's last ``k - 1`` inputs.
    Prefill (``conv_idx``: each request's last ``k - 1`` real positions, offset by the padding):
    the state is gathered there. Decode: the state and the new input make the window."""
    conv = layer.conv
    b, c, xx = normed(layer.operator_norm, x, conv.in_proj.weight, conv.in_proj.bias, linear).transpose(
        -1, -2).chunk(3, dim=-2)
    bx = b * xx  # [B, hidden, L]
    weight, bias = conv.conv.weight, conv.conv.bias  # [hidden, 1, k]: depthwise, as causal_conv1d_fn
    k, L = weight.shape[-1], bx.shape[-1]
    if conv_idx is not None:
        padded = F.pad(bx, (k - 1, 0))  # positions before 0 read as zeros, like the conv's own padding
        state.copy_(torch.gather(padded, 2, conv_idx[:, None, :].expand(bx.shape[0], bx.shape[1], k - 1)))
        if fused:
            y = short_conv(padded, weight, bias, L, fused)
        else:  # the unfused engine's own call, as it always ran
            y = F.conv1d(bx, weight, bias, padding=k - 1, groups=bx.shape[1])[..., :L]
    else:
        window = torch.cat([state, bx], dim=-1)  # [B, hidden, k]
        y = short_conv(window, weight, bias, 1, fused)
        state.copy_(window[..., 1:])
    x = added(x, conv.out_proj, (c * y).transpose(-1, -2).contiguous(), linear)
    return feed_forward(layer.feed_forward, x, layer.ffn_norm, w13, linear)


def lm_head(norm: nn.Module, head: nn.Module, h: torch.Tensor, linear=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The final norm, the LM head and the greedy choice: ``(logits, ids)``."""
    logits = normed(norm, h, head.weight, head.bias, linear)
    return logits, logits.argmax(-1)
