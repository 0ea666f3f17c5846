"""The decode step's attention as a Triton kernel of the kit's own: one query per request against its
cached keys and values, ``o = softmax(q k^T * scale) v`` over positions ``0..pos[b]``.

Why a kernel of its own, when torch's ``F.scaled_dot_product_attention`` does the same math:

* **one query per request.** A decode step attends with a single new token per request (q of shape
  ``[B, Hq, 1, d]``) against a cache ``[B, Hkv, S, d]``: a matrix-vector product per head, bound by
  reading the cache, not by flops. Nothing is gained from tiling queries, everything from reading
  the cache once and no more of it than needed;
* **GQA.** LFM2's query heads share key/value heads (16 query heads over 8 KV heads in the 450M
  model): query head ``h`` reads KV head ``h // (Hq // Hkv)``, as SDPA's ``enable_gqa`` does. One
  program per (request, KV head) reads that head's keys and values once for all ``G = Hq // Hkv``
  query heads that share it;
* **only the positions in use.** The engine's decode graph attends over a cache span ``S`` fixed at
  capture, while request ``b`` has written positions ``0..pos[b]`` only. SDPA with a mask reads all
  ``S`` and masks the rest; the kernel reads ``pos`` on the device and stops at ``pos[b]``, so a
  captured graph replays the right loop length as the requests grow, and positions past ``pos[b]``
  are never loaded at all (stale or garbage values there cannot reach the output);
* **online softmax in fp32.** The keys are read chunk by chunk; each query row keeps a running
  maximum, a running sum of exponentials and an fp32 accumulator of the weighted values, rescaled
  when the maximum grows (the flash-attention recurrence). q, k and v are upcast to fp32 as they are
  read; ``log2(e)`` is folded into the scale so the exponentials are ``exp2``; the result is rounded
  once, to q's dtype;
* **a fixed reduction order.** Each output is summed by one program, chunk after chunk, in the same
  order on every call: no atomics, no split whose partial results race to be combined, no choice of
  algorithm made at run time. A captured graph replays the same bits every time, which torch does
  not promise for its fused attention backends on the GPU.

The price of the fixed order: ``B * Hkv`` programs (8 for one request of the 450M model), each walking
its positions alone, where a GPU has over a hundred SMs. On the H200 one call for one 450M request of
about 300 positions took 15.9 µs, cuDNN's 5.8 µs (``scripts/engine_probe.py``, the probes of
2026-12-04): its six calls are 0.095 ms of the 0.66 ms decode step, where cuDNN's took 0.035 ms.
Splitting the positions over more programs and combining their partial softmaxes in a fixed order would
fill more of the GPU.

:func:`decode_attention` runs the kernel where it can (a CUDA tensor with Triton, or a CPU tensor
under ``TRITON_INTERPRET=1``, Triton's interpreter, which is how the CPU tests check it), and
:func:`torch_decode_attention`, the same math in plain torch, elsewhere. :func:`decode_attention_op`
makes it a torch custom op, which torch.compile keeps as one opaque call (the fused engine's
``decode_attention="triton"``).
"""

from __future__ import annotations

import functools
import math

import torch

from .gemv import interpreting, triton_available

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the kernel reads (it sums in fp32)
# float64 too, through the plain-torch path: a model cast with .double() keeps its fused engine
DTYPES = KERNEL_DTYPES + (torch.float64,)
MAX_HEAD_DIM = 256
LOG2E = math.log2(math.e)
# Elements of the [G, BLOCK_S, d] product a program holds at once (G rounded up to a power of two): 64 fp32
# registers a thread at 4 warps, so chunks stay long (few loop turns) without spilling.
PRODUCT_ELEMENTS = 8192

_KERNEL = None


def _kernel():
    """Build the Triton kernel on first use (importing Triton costs time; CPU runs never need it)."""
    global _KERNEL
    if _KERNEL is None:
        from . import _decode_attention_triton

        _KERNEL = _decode_attention_triton.decode_attention_kernel
    return _KERNEL


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def block_size(group: int, head_dim: int) -> int:
    """Positions a program reads per loop turn for ``group`` query heads per KV head: 16 to 64."""
    return max(16, min(64, PRODUCT_ELEMENTS // (_next_pow2(group) * head_dim)))


def check_inputs(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, scale: float) -> None:
    """One-line ``ValueError`` naming the first value the kernel cannot take."""
    for name, t in (("q", q), ("kc", kc), ("vc", vc), ("pos", pos)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"decode_attention: {name} is a {type(t).__name__}, expected a tensor")
    if q.dtype not in DTYPES:
        raise ValueError(f"decode_attention: q dtype {q.dtype}, expected one of bfloat16, float16, float32, float64")
    for name, t in (("kc", kc), ("vc", vc)):
        if t.dtype != q.dtype:
            raise ValueError(f"decode_attention: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
    for name, t in (("q", q), ("kc", kc), ("vc", vc)):
        if t.dim() != 4:
            raise ValueError(f"decode_attention: {name} shape {tuple(t.shape)}, expected 4 dims [B, heads, len, d]")
    B, Hq, L, d = q.shape
    if L != 1:
        raise ValueError(f"decode_attention: q shape {tuple(q.shape)} holds {L} queries per request, expected 1")
    if kc.shape != vc.shape:
        raise ValueError(f"decode_attention: kc shape {tuple(kc.shape)} differs from vc shape {tuple(vc.shape)}")
    Bk, Hkv, S, dk = kc.shape
    if Bk != B:
        raise ValueError(f"decode_attention: kc shape {tuple(kc.shape)} holds {Bk} requests, q holds {B}")
    if dk != d:
        raise ValueError(f"decode_attention: kc head_dim {dk} differs from q head_dim {d}")
    if d < 1 or d > MAX_HEAD_DIM or d & (d - 1):
        raise ValueError(f"decode_attention: head_dim {d}, expected a power of two up to {MAX_HEAD_DIM}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"decode_attention: {Hq} query heads are not a multiple of {Hkv} KV heads")
    if S < 1:
        raise ValueError(f"decode_attention: kc shape {tuple(kc.shape)} holds no cache positions")
    if pos.dtype != torch.int64 or tuple(pos.shape) != (B,):
        raise ValueError(f"decode_attention: pos {pos.dtype} of shape {tuple(pos.shape)}, expected int64 of ({B},)")
    for name, t in (("kc", kc), ("vc", vc), ("pos", pos)):
        if t.device != q.device:
            raise ValueError(f"decode_attention: {name} on {t.device}, q on {q.device}")
    for name, t in (("q", q), ("kc", kc), ("vc", vc)):
        if t.stride(-1) != 1:
            raise ValueError(f"decode_attention: {name} strides {t.stride()} end in {t.stride(-1)}, expected 1")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"decode_attention: scale {scale!r}, expected a finite number")


def torch_decode_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """The reference and the fallback, in plain torch: fp32 scores (float64 for float64 inputs) over the
    positions ``<= pos[b]``, softmax, times v, rounded to q's dtype. Query head ``h`` reads KV head
    ``h // (Hq // Hkv)``."""
    group = q.shape[1] // kc.shape[1]
    wide = torch.promote_types(q.dtype, torch.float32)
    k = kc.to(wide).repeat_interleave(group, dim=1)
    v = vc.to(wide).repeat_interleave(group, dim=1)
    scores = (q.to(wide) @ k.transpose(-1, -2)) * scale  # [B, Hq, 1, S]
    used = torch.arange(kc.shape[2], device=kc.device)[None, :] <= pos[:, None]
    scores = scores.masked_fill(~used[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


def _runs_triton(q: torch.Tensor) -> bool:
    on_device = (q.is_cuda and triton_available()) or (q.device.type == "cpu" and interpreting())
    return on_device and q.dtype in KERNEL_DTYPES


def decode_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, scale: float,
                     block_s: int | None = None) -> torch.Tensor:
    """``o[b, h] = softmax(q[b, h] kc[b, h // G, :pos[b] + 1]^T * scale) vc[b, h // G, :pos[b] + 1]``,
    ``G = Hq // Hkv``: q ``[B, Hq, 1, d]``, kc and vc ``[B, Hkv, S, d]`` (any strides but the last),
    ``pos`` ``[B]`` int64; ``o`` is q's shape and dtype. A ``pos[b]`` of ``S`` or more reads all ``S``
    positions; a negative one has none to attend to, and its row is NaN (as the reference's). The
    Triton kernel where it runs, else :func:`torch_decode_attention`. ``block_s`` (a power of two of
    16 or more) overrides :func:`block_size`, for the tests."""
    check_inputs(q, kc, vc, pos, scale)
    if block_s is not None and (isinstance(block_s, bool) or not isinstance(block_s, int) or block_s < 16
                                or block_s & (block_s - 1)):
        raise ValueError(f"decode_attention: block_s {block_s!r}, expected a power of two of 16 or more")
    if not _runs_triton(q):
        return torch_decode_attention(q, kc, vc, pos, float(scale))
    B, Hq, _, d = q.shape
    Hkv, S = kc.shape[1], kc.shape[2]
    group = Hq // Hkv
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    _kernel()[(B, Hkv)](
        q, kc, vc, pos, o, S, float(scale) * LOG2E,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2), o.stride(0), o.stride(1),
        G=group, GP=_next_pow2(group), D=d, BLOCK_S=block_s or block_size(group, d), num_warps=4)
    return o


def _decode_attention_op(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                         scale: float) -> torch.Tensor:
    return decode_attention(q, kc, vc, pos, scale)


@functools.cache
def decode_attention_op():
    """:func:`decode_attention` as a torch custom op, ``torch.ops.lfm2vl.decode_attention(q, kc, vc, pos,
    scale)``: torch.compile keeps it as one opaque call, which inductor neither retraces nor rewrites, and a
    captured graph holds the Triton kernel it launches. Registered on first use."""
    op = torch.library.custom_op("lfm2vl::decode_attention", _decode_attention_op, mutates_args=())
    op.register_fake(lambda q, kc, vc, pos, scale: torch.empty_like(q, memory_format=torch.contiguous_format))
    return op
