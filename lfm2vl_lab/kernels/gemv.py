"""A Triton GEMV for the decode step: ``y = x @ W.T (+ b)`` for one to four rows of ``x``, W of shape
(N, K) row-major as ``nn.Linear`` keeps it, accumulated in fp32.

Once a decode step is graphed, its time is its linear layers, and at batch 1 a linear layer is a
GEMV: it reads every weight once and does two flops per weight, so its floor is the weight bytes
over the memory bandwidth. ``scripts/boundary_probe.py`` measured the 450M text model's decode GEMVs
(``F.linear``) at about 1.16 TB/s on an H200 where a plain copy moves 2.67 TB/s, and the small
layers (N = 512 or 1024) at a tenth of that: too few blocks to keep 132 SMs reading. This kernel is
shaped for streaming:

* each program reads a tile of ``BLOCK_N`` rows of W along K in ``BLOCK_K``-wide chunks (wide,
  16-byte loads along the contiguous K), marked evict-first since no one reads W again this step;
* where N alone gives too few programs, K is split over ``SPLIT_K`` programs too. Their fp32
  partial sums go to a small workspace, and the last program of a row tile to arrive (an atomic
  counter per tile) adds them up, adds the bias and writes ``y``: one kernel, no zeroing kernel
  and no second reduction kernel, each of which would cost a kernel boundary (about 1 µs inside
  a graph, as much as a small GEMV's whole read). The counter goes back to zero, so graph replays
  work;
* the block sizes come from a small explicit table (:func:`pick_config`), not an autotuner, so a
  captured graph holds the same kernel every run; ``scripts/boundary_probe.py`` times a few
  candidates per shape on the GPU to check the table's pick.

:func:`gemv_shared` is the variant for linears that share an input (q/k/v, the MLP's gate and
up): one launch over their concatenated weight (:func:`cat_weights`), fewer and larger kernels.
:func:`gemv_rmsnorm` (and :func:`gemv_rmsnorm_shared`) takes the RMSNorm before such a group into the
same kernel: ``F.linear(rmsnorm(x), W)`` in one launch, no normalized row written and read back.

Plain torch (fp32 accumulation, then the input's dtype) runs where there is no CUDA or no Triton,
and for more than :data:`MAX_M` rows (a GEMM's work, cuBLAS's job). With ``TRITON_INTERPRET=1`` set
before Triton is imported, the kernel runs on CPU tensors, which is how the CPU tests check it.
Workspaces are kept per device and shape, for calls on one stream at a time; the first call of a
shape must come before a graph capture (it compiles, and allocates its workspace).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
from typing import NamedTuple

import torch

MAX_M = 4  # rows of x the kernel takes in one launch (one accumulator each)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SMS_DEFAULT = 132  # an H200's SMs, for the table when no GPU is there to ask


class GemvConfig(NamedTuple):
    """One launch's tiling: rows per program, K chunk, K splits, warps and software-pipeline stages."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1


def triton_available() -> bool:
    """Triton is importable and there is a GPU to run it on."""
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def interpreting() -> bool:
    """Triton's CPU interpreter is on (``TRITON_INTERPRET=1``) and Triton is there to run it."""
    return os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def pick_config(m: int, n: int, k: int, sms: int = SMS_DEFAULT) -> GemvConfig:
    """The table: at least two programs per SM, each of a few dozen KiB of W at most.

    BLOCK_K is 512 bf16 (1 KiB per row: 16-byte loads, 64 lanes along K), less for short K or for
    several rows of x (one fp32 accumulator each). BLOCK_N is 16 where that gives ``2 * sms`` row
    tiles, else 8; where even 8 rows do not, K is split too (BLOCK_K 256 then, so that a 1024-wide K
    splits four ways). Small programs (16 x 512 at 4 warps: 96 registers a thread, Triton 3.6, sm_90) let several
    share an SM, which keeps enough loads in flight without software pipelining; wider tiles are among
    the probe's candidates."""
    want = 2 * sms
    block_k = min(512 if m == 1 else 256, max(16, _next_pow2(k)))
    block_n = 16 if -(-n // 16) >= want else 8
    tiles_n = -(-n // block_n)
    split = 1
    if tiles_n < want:
        block_k = min(block_k, max(16, _next_pow2(k) // 4), 256)
        k_tiles = -(-k // block_k)
        while tiles_n * split < want and split * 2 <= k_tiles:
            split *= 2
    num_warps = 8 if block_n * block_k >= 16384 else 4
    return GemvConfig(block_n, block_k, split, num_warps, 1)


def resolve(cfg: GemvConfig, k: int) -> tuple[GemvConfig, int]:
    """``cfg`` as it launches for a K of ``k``, and the K chunks each program reads: no more splits
    than chunks, and none left without a chunk."""
    k_tiles = -(-k // cfg.block_k)
    k_iters = -(-k_tiles // max(1, min(cfg.split_k, k_tiles)))
    return cfg._replace(split_k=-(-k_tiles // k_iters)), k_iters


_KERNEL = None


def _kernel():
    """Build the Triton kernel on first use (importing Triton costs time; CPU runs never need it)."""
    global _KERNEL
    if _KERNEL is None:
        from . import _gemv_triton

        _KERNEL = _gemv_triton.gemv_kernel
    return _KERNEL


def check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """One-line ``ValueError`` naming the first value that the kernel cannot take."""
    if x.dtype not in DTYPES:
        raise ValueError(f"gemv: x dtype {x.dtype}, expected one of bfloat16, float16, float32")
    if weight.dtype != x.dtype:
        raise ValueError(f"gemv: weight dtype {weight.dtype} differs from x dtype {x.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"gemv: weight shape {tuple(weight.shape)}, expected (out_features, in_features)")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"gemv: x shape {tuple(x.shape)} does not end in weight's in_features {weight.shape[1]}")
    if weight.stride() != (weight.shape[1], 1):
        raise ValueError(f"gemv: weight strides {weight.stride()} are not row-major contiguous "
                         f"(expected ({weight.shape[1]}, 1))")
    if x.device != weight.device:
        raise ValueError(f"gemv: x on {x.device}, weight on {weight.device}")
    if bias is not None:
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"gemv: bias shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")
        if bias.dtype != x.dtype or bias.device != x.device:
            raise ValueError(f"gemv: bias {bias.dtype} on {bias.device}, expected {x.dtype} on {x.device}")


def torch_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The fallback: the same product in plain torch, fp32 accumulation, rounded to x's dtype."""
    y = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def _runs_triton(x: torch.Tensor) -> bool:
    return (x.is_cuda and triton_available()) or (x.device.type == "cpu" and interpreting())


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None, space: int = 0) -> torch.Tensor:
    """``x @ weight.T + bias`` for x of shape (..., K): the Triton kernel for up to :data:`MAX_M`
    rows on CUDA (or in Triton's interpreter on CPU), plain torch otherwise. ``config`` overrides
    :func:`pick_config` (the probe and the tests use it); ``space`` names whose split-K workspaces
    the call uses (:func:`decode_linear` gives each of its callers one of their own)."""
    check_inputs(x, weight, bias)
    return _product(x, weight, bias, config, space, None)


def _product(x, weight, bias, config, space, norm):
    """The kernel over x's rows as a (rows, K) block, or plain torch where it does not run; ``norm`` is
    (RMSNorm weight, eps) or None."""
    k = weight.shape[1]
    m = x.numel() // k if k else 0
    if not _runs_triton(x) or m == 0 or m > MAX_M or k == 0:
        return torch_gemv(x if norm is None else torch_rmsnorm(x, *norm), weight, bias)
    y = _launch(x.reshape(m, k), weight, bias, config, space, norm)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def check_norm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> None:
    """One-line ``ValueError`` for an RMSNorm weight or eps that :func:`gemv_rmsnorm` cannot take."""
    if not isinstance(norm_weight, torch.Tensor) or tuple(norm_weight.shape) != (x.shape[-1],):
        shape = tuple(norm_weight.shape) if isinstance(norm_weight, torch.Tensor) else type(norm_weight).__name__
        raise ValueError(f"gemv_rmsnorm: norm_weight shape {shape}, expected ({x.shape[-1]},)")
    if norm_weight.dtype != x.dtype or norm_weight.device != x.device:
        raise ValueError(f"gemv_rmsnorm: norm_weight {norm_weight.dtype} on {norm_weight.device}, "
                         f"expected {x.dtype} on {x.device}")
    if norm_weight.stride() != (1,):
        raise ValueError(f"gemv_rmsnorm: norm_weight stride {norm_weight.stride()}, expected (1,)")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0 or eps == float("inf"):
        raise ValueError(f"gemv_rmsnorm: eps {eps!r}, expected a positive finite number")


def torch_rmsnorm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Lfm2RMSNorm, as it computes it: fp32 statistics, rounded to x's dtype, then
    times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return norm_weight * h.to(x.dtype)


def gemv_rmsnorm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, config: GemvConfig | None = None,
                 space: int = 0) -> torch.Tensor:
    """``F.linear(rmsnorm(x), weight, bias)`` in one kernel, the norm being transformers'
    Lfm2RMSNorm (:func:`torch_rmsnorm`) with ``norm_weight`` and ``eps``: each program sums x's
    squares itself and normalizes x's chunks as it reads them. Plain torch where :func:`gemv` is."""
    check_inputs(x, weight, bias)
    check_norm(x, norm_weight, eps)
    return _product(x, weight, bias, config, space, (norm_weight, eps))


_WORKSPACES: dict = {}


def _workspace(device: torch.device, kind: str, numel: int, dtype: torch.dtype, space: int = 0) -> torch.Tensor:
    """A buffer kept per (space, device, kind, size): split-K partials (``empty``) and tile counters
    (zeros, which the kernel returns to zero). Calls in one space must run one after another (one
    stream); two spaces never share a buffer. Made outside graph capture only: made inside, it would
    live in the graph's private pool and be zeroed by the graph itself."""
    key = (space, str(device), kind, numel)
    buf = _WORKSPACES.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"gemv: first call of this shape inside a graph capture ({kind} of {numel}): "
                               "call it once before capturing")
        buf = (torch.zeros if kind == "counters" else torch.empty)(numel, dtype=dtype, device=device)
        _WORKSPACES[key] = buf
    return buf


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: GemvConfig | None,
            space: int = 0, norm: tuple[torch.Tensor, float] | None = None):
    """One kernel launch; ``norm`` is (RMSNorm weight, eps) for :func:`gemv_rmsnorm`, or None."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    cfg, k_iters = resolve(config or pick_config(m, n, k, _sms(x.device)), k)
    split = cfg.split_k
    tiles_n = -(-n // cfg.block_n)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if split > 1:
        partials = _workspace(x.device, "partials", split * m * n, torch.float32, space)
        counters = _workspace(x.device, "counters", tiles_n, torch.int32, space)
    else:
        partials = counters = y  # unread: SPLIT_K == 1 compiles the split-K path away
    norm_weight, eps = norm if norm is not None else (weight, 1.0)  # unread without NORM
    _kernel()[(tiles_n, split)](
        x, weight, weight if bias is None else bias, norm_weight, y, partials, counters, n, k, x.stride(0),
        k_iters, float(eps), HAS_BIAS=bias is not None, NORM=norm is not None, BLOCK_M=m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=split, EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return y


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return SMS_DEFAULT
    return _cuda_sms(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def cat_weights(weights, biases=None) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """Linears that read one input as one ``(sum of N, K)`` weight (and bias), and their sizes: made
    once, outside the step, for :func:`gemv_shared`. Biases all present or all None."""
    weights = list(weights)
    biases = list(biases) if biases is not None else [None] * len(weights)
    if len(biases) != len(weights) or len({b is None for b in biases}) > 1:
        raise ValueError(f"gemv: {len(weights)} weights need as many biases, all or none ({len(biases)} given)")
    sizes = tuple(w.shape[0] for w in weights)
    bias = None if biases[0] is None else torch.cat(biases)
    return torch.cat(weights).contiguous(), bias, sizes


def gemv_shared(x: torch.Tensor, weight: torch.Tensor, sizes, bias: torch.Tensor | None = None,
                config: GemvConfig | None = None, space: int = 0) -> tuple[torch.Tensor, ...]:
    """Several linears that share ``x`` in one launch: ``weight`` is their concatenation
    (:func:`cat_weights`), ``sizes`` their output widths; returns each output (views of one)."""
    _check_sizes(sizes, weight)
    return gemv(x, weight, bias, config, space).split(list(sizes), dim=-1)


def _check_sizes(sizes, weight: torch.Tensor) -> None:
    """A shared launch's output widths must cover its concatenated weight's rows."""
    if sum(sizes) != weight.shape[0]:
        raise ValueError(f"gemv: sizes {tuple(sizes)} add up to {sum(sizes)}, weight has {weight.shape[0]} rows")


def gemv_rmsnorm_shared(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, sizes,
                        bias: torch.Tensor | None = None, config: GemvConfig | None = None,
                        space: int = 0) -> tuple[torch.Tensor, ...]:
    """:func:`gemv_shared` with the RMSNorm in front (:func:`gemv_rmsnorm`): q/k/v after
    ``operator_norm``, w1/w3 after ``ffn_norm``, as one launch."""
    _check_sizes(sizes, weight)
    return gemv_rmsnorm(x, norm_weight, eps, weight, bias, config, space).split(list(sizes), dim=-1)


_F_LINEAR = torch.nn.functional.linear  # torch's own, whatever a caller later routes F.linear to
_SPACES = itertools.count(1)  # workspace names for decode_linear's routers (0: direct calls of gemv)


def _gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, space: torch.Tensor) -> torch.Tensor:
    return gemv(x, weight, bias, space=int(space))


@functools.cache
def gemv_op():
    """:func:`gemv` as a torch custom op, ``torch.ops.lfm2vl.gemv(x, weight, bias, space)``: torch.compile
    keeps it as one opaque call (traced as itself, it would be lowered to inductor's own GEMM), and a
    captured graph holds the Triton kernel it launches. ``space`` is the workspace's name as a CPU
    scalar tensor: a graph input, so one compiled graph serves every router (an ``int`` would be
    a constant, compiled again for each). Registered on first use."""
    op = torch.library.custom_op("lfm2vl::gemv", _gemv_op, mutates_args=())
    op.register_fake(lambda x, weight, bias, space: x.new_empty((*x.shape[:-1], weight.shape[0])))
    return op


class DecodeLinear:
    """A drop-in ``F.linear`` (``linear(x, weight, bias)``) that sends a decode step's linears (at most
    :data:`MAX_M` rows, 16-bit, on CUDA, a contiguous weight) to the kernel and everything else (a
    prefill's hundreds of rows) to torch's own. It reads only tensor properties, so torch.compile
    traces it whole (``fullgraph``).

    Each router has split-K workspaces of its own (``space``): an engine that makes one never shares
    a buffer with another engine's graphs, which another thread may replay at the same time on another
    stream. The space is a tensor, not part of the traced code, so routers of several engines share
    one compiled function instead of each compiling its own."""

    def __init__(self):
        self.op = gemv_op()
        self.on = triton_available()  # decided here, once: a call inside a traced function must not ask
        self.space = torch.tensor(next(_SPACES))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if (self.on and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
                and weight.dim() == 2 and weight.is_contiguous() and x.shape[-1] == weight.shape[1]
                and x.numel() <= MAX_M * weight.shape[1] and (bias is None or bias.dtype == x.dtype)):
            return self.op(x, weight, bias, self.space)
        return _F_LINEAR(x, weight, bias)


def decode_linear() -> DecodeLinear:
    """A new router (:class:`DecodeLinear`) with workspaces of its own."""
    return DecodeLinear()
