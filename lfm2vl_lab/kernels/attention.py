"""Attention over packed rows: the backends the packed encoder can select, the dense attention of the
dense graphs, and the choice of a backend for a device.

Rows are (T, H, D) tensors holding several sequences one after another, delimited by ``cu_seqlens``.
An attention function of the packed signature, ``fn(q, k, v, cu_seqlens, max_seqlen, scale)``, lets
each row attend only to the rows of its own sequence.

**Selectable backends** (:data:`ATTENTION_BACKENDS`, the names ``PackedVisionEncoder`` and
``GraphedEncoder`` take as ``attention=``). Neither reads a size on the host when its tensors are on a
GPU, so both can be captured in a CUDA graph:

* ``varlen`` (:func:`attention_varlen`): FlashAttention-2's varlen kernel (torch's ``varlen_attn``):
  CUDA, fp16/bf16, sm80 and newer;
* ``sdpa_blockmask`` (:func:`attention_sdpa_blockmask`): exact on any device and dtype. On CUDA (and
  under torch.compile) it is :func:`attention_blockmask_dense`, one SDPA with a block-diagonal T×T mask;
  on CPU tensors it is :func:`attention_per_item`, the same result item by item (host reads are free there).

:func:`resolve_attention` turns a name, or ``"auto"`` (the first of these the device can run), into
``(name, fn)``; :func:`varlen_available` and :func:`cuda_capability` are what it asks.

**Dense attention** for batches of equal-length items, which is what the dense graph variants
(``dense{k}``) of :mod:`lfm2vl_lab.core` replay: :func:`attention_dense_blocks` runs ``n_items``
sequences of equal length as one batched SDPA without a mask (cuDNN first, :data:`DENSE_BACKENDS`),
and :func:`dense_attention` builds the packed-signature function for a batch that starts with such
items and hands any rows after them to a backend. It is not selectable: on any other batch it would
mix items. :mod:`lfm2vl_lab.measure.attention_probe` times these against each other on a GPU.
"""

from __future__ import annotations

import importlib.util
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ATTENTION_BACKENDS = ("varlen", "sdpa_blockmask")

# varlen_attn is FlashAttention-2: Ampere (sm80) and newer. A T4 (sm75) has no kernel for it.
VARLEN_MIN_CAPABILITY = (8, 0)


def cuda_capability(device) -> tuple[int, int] | None:
    """The compute capability of ``device`` when it is a CUDA device torch can see, else None."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))


def sm(capability: tuple[int, int]) -> str:
    """``(8, 6)`` → ``"86"``, as in "sm86"."""
    return f"{capability[0]}{capability[1]}"


def varlen_available(device="cuda") -> bool:
    """torch ships ``varlen_attn`` (2.11 on) and ``device`` is a GPU with FlashAttention-2 (sm80+);
    it has no CPU kernel."""
    cap = cuda_capability(device)
    return (cap is not None and cap >= VARLEN_MIN_CAPABILITY
            and importlib.util.find_spec("torch.nn.attention.varlen") is not None)


def attention_varlen(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """FlashAttention varlen (CUDA only): q/k/v (T, H, D), sequences given by ``cu_seqlens``."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale)


def _sdpa_rows(q, k, v, scale: float, mask=None):
    """SDPA over packed rows (T, H, D) as one batch entry: (1, H, T, D) in, (T, H, D) out."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, scale=scale,
    )
    return out.squeeze(0).transpose(0, 1)


def _segments(cu_seqlens, t: int, device) -> torch.Tensor:
    """Segment id of each of ``t`` packed rows: item ``i`` for rows in [cu[i], cu[i+1]), and one
    extra segment for rows past ``cu_seqlens[-1]`` (buffer padding), so they never mix with real rows."""
    rows = torch.arange(t, device=device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), rows, right=True)


def attention_sdpa_blockmask(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """Exact reference on any device: attention within each sequence of ``cu_seqlens``.

    Rows past ``cu_seqlens[-1]`` (buffer padding) get a segment of their own, so they never mix
    with real rows; zero-length sequences have no rows and change nothing.

    On CUDA (and whenever torch.compile traces it) this is one SDPA with a block-diagonal T×T
    mask: no host sync, so it can run inside a CUDA graph, but its work and memory grow as T²
    over *all* packed rows. On CPU tensors, where host reads are free, the same result is
    computed per item instead (:func:`attention_per_item`): 4 items of 1024 rows cost 4·1024²
    instead of 4096², which made the packed path slower than transformers' padded batch there.
    """
    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        return attention_per_item(q, k, v, cu_seqlens, max_seqlen, scale)
    return attention_blockmask_dense(q, k, v, cu_seqlens, max_seqlen, scale)


def attention_blockmask_dense(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """The block-diagonal T×T mask formulation (any device, no host sync): one SDPA over all rows."""
    seg = _segments(cu_seqlens, q.shape[0], q.device)
    return _sdpa_rows(q, k, v, scale, seg[:, None] == seg[None, :])


def attention_per_item(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """The block-mask attention computed segment by segment (same segments, same result).

    Reads ``cu_seqlens`` on the host, so it is for CPU tensors (a CUDA graph could not capture it).
    Segments of equal length share one batched SDPA call without a mask: (n, H, L, D).
    """
    t, out = q.shape[0], torch.empty_like(q)
    if t == 0:
        return out
    seg = _segments(cu_seqlens.cpu(), t, "cpu")
    # seg is non-decreasing, so each segment is one contiguous run of rows
    _, counts = torch.unique_consecutive(seg, return_counts=True)
    lengths = counts.tolist()
    starts = [0, *itertools.accumulate(lengths)][:-1]
    by_len: dict[int, list[int]] = {}
    for s, n in zip(starts, lengths):
        by_len.setdefault(n, []).append(s)
    for n, group in by_len.items():
        s, e = group[0], group[-1] + n
        if e - s == n * len(group):  # adjacent items (the usual case): (items, n) views, no copies
            qi, ki, vi = (x[s:e].unflatten(0, (len(group), n)).transpose(1, 2) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qi, ki, vi, scale=scale)
            out[s:e] = o.transpose(1, 2).flatten(0, 1)
            continue
        idx = (torch.tensor(group)[:, None] + torch.arange(n)).to(q.device)  # (items, n) row indices
        qi, ki, vi = (x[idx].transpose(1, 2) for x in (q, k, v))  # (items, H, n, D)
        o = F.scaled_dot_product_attention(qi, ki, vi, scale=scale)
        out[idx.reshape(-1)] = o.transpose(1, 2).reshape(-1, *q.shape[1:])
    return out


# cuDNN first: in a graph it beat FlashAttention-2 (dense and varlen) at every equal-length layout the H200
# probe timed (attention-*.json); the others serve shapes or devices cuDNN refuses (and CPUs).
DENSE_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                  SDPBackend.MATH]


def attention_dense_blocks(q, k, v, n_items: int, scale: float):
    """Dense SDPA over rows (T, H, D) that are ``n_items`` sequences of ``T / n_items`` rows each:
    one batched call on (n_items, H, L, D) views, no mask, cuDNN first."""
    t, h, d = q.shape
    q, k, v = (x.view(n_items, t // n_items, h, d).transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(DENSE_BACKENDS, set_priority=True):
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(t, h, d)


def dense_attention(n_items: int, item_rows: int, rest=None):
    """An attention function (same signature as the backends) for a batch that starts with
    ``n_items`` items of exactly ``item_rows`` rows: those rows go through batched dense SDPA and any
    rows after them through ``rest`` (a backend) with ``cu_seqlens`` counted from the rest's first
    row. Correct only for such batches: ``GraphedEncoder`` replays its dense graphs only then. Not a
    user-selectable backend, because on other batches it would silently mix items."""
    head = n_items * item_rows

    def attn(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
        out = attention_dense_blocks(q[:head], k[:head], v[:head], n_items, scale)
        if q.shape[0] == head:
            return out
        return torch.cat([out, rest(q[head:], k[head:], v[head:], cu_seqlens, max_seqlen, scale)])

    return attn


VARLEN_DTYPES = (torch.float16, torch.bfloat16)  # varlen_attn is FlashAttention: fp32 fails inside the kernel


def resolve_attention(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """``(name, fn)`` of an attention backend for ``device`` and ``dtype``.

    ``auto`` picks varlen where it runs (CUDA sm80+, fp16/bf16, a torch that has it) and the exact
    block-mask SDPA everywhere else (CPUs, fp32, sm75 GPUs such as a T4): both capture in a graph.
    Asking for varlen where it cannot run is an error that names the reason.
    """
    device = torch.device(device)
    if name == "auto":
        ok = dtype in VARLEN_DTYPES and varlen_available(device)
        name = "varlen" if ok else "sdpa_blockmask"
    if name == "varlen":
        if device.type != "cuda" or dtype not in VARLEN_DTYPES:
            raise ValueError(f"attention='varlen' needs a CUDA device and fp16 or bf16 (torch's varlen_attn is "
                             f"FlashAttention); got {device.type}, {dtype}: use 'auto' or 'sdpa_blockmask'")
        cap = cuda_capability(device)
        if cap is not None and cap < VARLEN_MIN_CAPABILITY:
            raise ValueError(f"attention='varlen' needs FlashAttention-2, sm{sm(VARLEN_MIN_CAPABILITY)} or newer; "
                             f"this GPU is sm{sm(cap)}: use 'auto' or 'sdpa_blockmask'")
        return name, attention_varlen
    if name == "sdpa_blockmask":
        return name, attention_sdpa_blockmask
    raise ValueError(f"unknown attention backend {name!r}; choose from auto, {', '.join(ATTENTION_BACKENDS)}")
