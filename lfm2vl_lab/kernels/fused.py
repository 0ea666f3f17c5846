"""Fewer elementwise kernels in the encoder body: residual add + LayerNorm in one kernel, and the
MLP's bias + GELU in the GEMM's epilogue.

Inside a CUDA graph the launch gaps are gone, so what is left is the kernels themselves. Unfused, a
replay of the 450M encoder runs 26 LayerNorms, 24 residual adds and 12 GELUs beside its GEMMs, and
each of those small kernels reads and writes the whole (rows, C) activation for very little math
(docs/results.md shows a replay's kernel classes, and the reference set's ``kernels`` file times
each fusion off and on). Two fusions remove most of them:

* :func:`add_layer_norm`: ``s = x + r; h = LayerNorm(s)`` as one Triton kernel that reads ``x``
  and ``r`` once and writes ``s`` and ``h`` (the residual stream needs ``s``, the next block ``h``).
  Every LayerNorm of a SigLIP2 layer follows a residual add except the first one, and the
  post-LayerNorm follows the last add, so 24 adds and 24 LayerNorms become 24 kernels.
* :func:`linear_gelu`: ``gelu_tanh(h @ W.T + b)`` through ``torch._addmm_activation``, which on
  CUDA asks cuBLASLt for its bias+GELU epilogue (the tanh approximation, the one SigLIP2 uses), so
  the GELU kernel disappears into the GEMM.

Both fall back to plain torch where the fused kernel does not apply (no CUDA, no Triton, another
activation), with the same results up to rounding. ``add_layer_norm`` rounds ``s`` to the
activation dtype before normalising it, as the unfused path does.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

TANH_GELU_ACTS = ("gelu_pytorch_tanh",)  # the activations cuBLASLt's GELU epilogue computes


def triton_available() -> bool:
    """Triton is importable and there is a GPU to run it on."""
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


_KERNEL = None


def _add_layer_norm_kernel():
    """Build the Triton kernel on first use (importing Triton costs time, and CPU runs never need it)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def add_ln(x_ptr, r_ptr, w_ptr, b_ptr, s_ptr, h_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)  # the residual stream keeps the activation dtype
        tl.store(s_ptr + row * n_cols + cols, s, mask=mask)
        s = s.to(tl.float32)
        mean = tl.sum(s, axis=0) / n_cols
        d = tl.where(mask, s - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * n_cols + cols, (d * rstd * w + b).to(h_ptr.dtype.element_ty), mask=mask)

    _KERNEL = (add_ln, triton.next_power_of_2)
    return _KERNEL


def _triton_ok(x: torch.Tensor, r: torch.Tensor, norm: nn.LayerNorm) -> bool:
    return (x.is_cuda and x.dim() == 2 and x.is_contiguous() and r.is_contiguous() and x.shape == r.shape
            and x.dtype == r.dtype and norm.weight is not None and norm.bias is not None
            and tuple(norm.normalized_shape) == (x.shape[1],) and triton_available())


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, norm: nn.LayerNorm, fused: bool = True):
    """``(s, norm(s))`` with ``s = x + r``: one Triton kernel on CUDA when ``fused``, else two ops."""
    if not (fused and _triton_ok(x, r, norm)):
        s = x + r
        return s, norm(s)
    return add_layer_norm_triton(x, r, norm)


def add_layer_norm_triton(x: torch.Tensor, r: torch.Tensor, norm: nn.LayerNorm):
    """The Triton kernel itself, for contiguous (rows, C) ``x`` and ``r`` (with ``TRITON_INTERPRET=1``
    it runs on CPU tensors too, which is how the CPU tests check it)."""
    kernel, next_pow2 = _add_layer_norm_kernel()
    rows, cols = x.shape
    s, h = torch.empty_like(x), torch.empty_like(x)
    if rows:
        block = next_pow2(cols)
        kernel[(rows,)](x, r, norm.weight, norm.bias, s, h, cols, norm.eps, BLOCK=block,
                        num_warps=4 if block <= 1024 else 8)
    return s, h


def linear_gelu(h: torch.Tensor, linear: nn.Linear, act, fused: bool = True) -> torch.Tensor:
    """``act(linear(h))`` where ``act`` is the tanh GELU; on CUDA, when ``fused``, the bias and GELU
    run in the GEMM's epilogue. On CPU ``torch._addmm_activation`` computes the *exact* (erf) GELU,
    so there (and for other shapes) the module's own ``act`` runs instead."""
    if fused and h.is_cuda and h.dim() == 2 and linear.bias is not None:
        return torch._addmm_activation(linear.bias, h, linear.weight.t(), use_gelu=True)
    return act(linear(h))


def shared_linear(owner: nn.Module, projs, tag: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linears that read the same input (``projs``) as one ``(sum of outputs, in)`` weight and bias
    (None when they have none), so that one GEMM does the work of ``len(projs)``.

    The linears' own parameters are re-pointed as views into that storage: the same values and the
    same memory, so their own forwards and in-place weight loading still work and reach the shared
    GEMM too. Kept on ``owner`` as ``tag``; a later call returns the same tensors while the
    parameters still view them (making them again would drop the storage that earlier graphs
    read). Re-pointing fires torch's registration hooks, which is how graphs captured before it
    notice (:mod:`lfm2vl_lab.core.guard`). After ``model.to(...)`` the views are broken, and the
    next call shares them again."""
    sizes = [p.weight.shape[0] for p in projs]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    has_bias = projs[0].bias is not None
    kept = getattr(owner, tag, None)
    if kept is not None:
        w, b = kept
        if all(p.weight.data_ptr() == w[s].data_ptr() and (b is None or p.bias.data_ptr() == b[s:].data_ptr())
               for p, s in zip(projs, starts)):
            return kept
    with torch.no_grad():
        w = torch.cat([p.weight for p in projs])
        b = torch.cat([p.bias for p in projs]) if has_bias else None
        for p, s, n in zip(projs, starts, sizes):
            p.weight = nn.Parameter(w[s : s + n], requires_grad=p.weight.requires_grad)
            if has_bias:
                p.bias = nn.Parameter(b[s : s + n], requires_grad=p.bias.requires_grad)
    setattr(owner, tag, (w, b))
    return w, b
