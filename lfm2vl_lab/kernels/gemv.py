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
same kernel: ``F.linear(rmsnorm(x), W)`` in one launch, no normalized row written and read back;
:func:`gemv_swiglu` the MLP's ``silu(g) * u`` before its down projection, and :func:`gemv_residual` (or
``residual=`` of :func:`gemv_swiglu`) the residual add after a projection.

Plain torch (fp32 accumulation, then the input's dtype) runs where there is no CUDA or no Triton,
and for more than :data:`MAX_M` rows (a GEMM's work, cuBLAS's job). With ``TRITON_INTERPRET=1`` set
before Triton is imported, the kernel runs on CPU tensors, which is how the CPU tests check it.
Workspaces are kept per device and shape, for calls on one stream at a time; the first call of a
shape must come before a graph capture (it compiles, and allocates its workspace).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import NamedTuple

import torch

MAX_M = 4  # rows of x the kernel takes in one launch (one accumulator each)
# Programmatic dependent launch (the kernel's ``PDL``) on request only (``LFM2VL_GEMV_PDL=1``): the kernel
# waits for the one before it, so it is right next to any kernel, and with inductor's PDL around it the 450M
# decode step took 0.557 ms against 0.605 (scripts/engine_probe.py); but engines whose inductor kernels used
# PDL replayed other logits in more runs than without it (scripts/pdl_race_probe.py), so it stays an experiment.
PDL_ENV = "LFM2VL_GEMV_PDL"
PDL_MIN_CAPABILITY = (9, 0)  # griddepcontrol: Hopper and later
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


def pdl_wanted() -> bool:
    """The launches ask for programmatic dependent launch (on Hopper and later): ``LFM2VL_GEMV_PDL=1``, read
    at each launch, so a graph holds the launches as they were when it was captured."""
    return os.environ.get(PDL_ENV) == "1"


@functools.cache
def _pdl_device(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= PDL_MIN_CAPABILITY


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def pick_config(m: int, n: int, k: int, sms: int = SMS_DEFAULT) -> GemvConfig:
    """The table: at least two programs per SM, each of a few dozen KiB of W at most.

    BLOCK_K is 512 bf16 (1 KiB per row: 16-byte loads, 64 lanes along K), less for short K or for
    several rows of x (one fp32 accumulator each). BLOCK_N is 16 where that gives ``2 * sms`` row
    tiles, else 8; where even 8 rows do not, K is split too (BLOCK_K 256 then, so that a 1024-wide K
    splits four ways). Small programs (16 x 512 at 4 warps: 96 registers a thread, Triton 3.6, sm_90) let several
    share an SM, which keeps enough loads in flight without software pipelining; wider tiles are among
    the probe's candidates.

    K is split for one row of x only. The 450M decode step of two requests, K split for both rows, gave
    other logits in six of seven later runs of the same request on the H200, where without the split
    none did in seven; but the split kernel alone replayed the same bits 2,000 times for one, two and
    four rows, and later runs of the engine without the split differed too (3 of 10), each time just
    after an attention layer (the probes of 2026-12-04 in ``data/results/nvidia-h200/probes/2026-12-04-pdl/``).
    So the split is not known to cause anything; the table leaves two rows unsplit until the decode
    attention, the suspect, is cleared. An explicit ``config`` still splits, for the probes and the
    interpreter's tests."""
    want = 2 * sms
    block_k = min(512 if m == 1 else 256, max(16, _next_pow2(k)))
    block_n = 16 if -(-n // 16) >= want else 8
    tiles_n = -(-n // block_n)
    split = 1
    if tiles_n < want and m == 1:
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
    the call uses (:func:`.router.decode_linear` gives each of its callers one of their own)."""
    check_inputs(x, weight, bias)
    return _product(x, weight, bias, config, space, None)


def _product(x, weight, bias, config, space, norm, residual=None, swiglu: bool = False):
    """The kernel over x's rows as a (rows, K) block (rows of 2K with ``swiglu``), or plain torch where
    it does not run; ``norm`` is (RMSNorm weight, eps) or None; ``residual`` (y's shape) is added to y."""
    k = weight.shape[1]
    width = 2 * k if swiglu else k
    m = x.numel() // width if k else 0
    if not _runs_triton(x) or m == 0 or m > MAX_M or k == 0:
        if swiglu:
            x = torch_swiglu(x)
        y = torch_gemv(x if norm is None else torch_rmsnorm(x, *norm), weight, bias)
        return y if residual is None else residual + y
    r = None if residual is None else residual.reshape(m, weight.shape[0])
    y = _launch(x.reshape(m, width), weight, bias, config, space, norm, r, swiglu)
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


def torch_swiglu(h: torch.Tensor) -> torch.Tensor:
    """LFM2's MLP activation as torch computes it: ``silu(g) * u`` of ``h``'s two halves, in h's dtype."""
    g, u = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


def check_residual(residual, x: torch.Tensor, weight: torch.Tensor) -> None:
    """One-line ``ValueError`` for a residual that cannot be added to the product's rows."""
    if residual is None:
        return
    want = (*x.shape[:-1], weight.shape[0])
    if not isinstance(residual, torch.Tensor) or tuple(residual.shape) != want:
        shape = tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__
        raise ValueError(f"gemv: residual shape {shape}, expected {want}")
    if residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"gemv: residual {residual.dtype} on {residual.device}, expected {x.dtype} on {x.device}")


def gemv_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None,
                  config: GemvConfig | None = None, space: int = 0) -> torch.Tensor:
    """``residual + F.linear(x, weight, bias)`` in one kernel: the product rounded to x's dtype, then the
    sum rounded again, as torch rounds the two ops. Plain torch where :func:`gemv` is."""
    check_inputs(x, weight, bias)
    check_residual(residual, x, weight)
    return _product(x, weight, bias, config, space, None, residual)


def gemv_swiglu(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, config: GemvConfig | None = None,
                space: int = 0) -> torch.Tensor:
    """``F.linear(silu(g) * u, weight, bias)`` (``+ residual``) in one kernel, ``g, u = h.chunk(2, -1)``:
    LFM2's MLP down projection reading the gate and up projections' output, the activation computed as
    :func:`torch_swiglu` computes it. Plain torch where :func:`gemv` is."""
    if h.dim() == 0 or h.shape[-1] != 2 * weight.shape[-1]:
        raise ValueError(f"gemv_swiglu: h shape {tuple(h.shape)} does not end in twice weight's in_features "
                         f"{weight.shape[-1] if weight.dim() == 2 else '?'}")
    check_inputs(h[..., : weight.shape[1]], weight, bias)
    check_residual(residual, h[..., : weight.shape[1]], weight)
    return _product(h, weight, bias, config, space, None, residual, swiglu=True)


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
            space: int = 0, norm: tuple[torch.Tensor, float] | None = None, residual: torch.Tensor | None = None,
            swiglu: bool = False):
    """One kernel launch; ``norm`` is (RMSNorm weight, eps) for :func:`gemv_rmsnorm`, or None; ``residual``
    (m, N) is added to y; with ``swiglu`` x's rows are (gate, up) pairs of K each."""
    m = x.shape[0]
    n, k = weight.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride() != (n, 1):
        residual = residual.contiguous()
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
    # never in Triton's interpreter, which cannot run the griddepcontrol instructions
    pdl = pdl_wanted() and x.is_cuda and _pdl_device(x.device.index if x.device.index is not None
                                                     else torch.cuda.current_device())
    _kernel()[(tiles_n, split)](
        x, weight, weight if bias is None else bias, norm_weight, y if residual is None else residual, y, partials,
        counters, n, k, x.stride(0), k_iters, float(eps), HAS_BIAS=bias is not None, NORM=norm is not None,
        SWIGLU=swiglu, RES=residual is not None, BLOCK_M=m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=split, EVEN_K=k % cfg.block_k == 0, PDL=pdl, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **({"launch_pdl": True} if pdl else {}))
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
