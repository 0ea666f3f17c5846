"""The decode step's router: which of a compiled engine's linears run the Triton GEMV
(:mod:`.gemv`), and how torch.compile keeps those calls whole.

The fused text engine passes its layer functions a ``linear(x, weight, bias)`` in place of ``F.linear``
(:mod:`lfm2vl_lab.serving.layers`' "The linears"). :class:`DecodeLinear` is that function for the fused
engine: a decode step's few 16-bit rows on CUDA go to the kernel, as a torch custom op (:func:`gemv_op`,
:func:`gemv_fused_op`), which inductor keeps as one opaque call and a captured graph holds as the
kernel it launches; a prefill's hundreds of rows and anything else go to torch's own ``F.linear``. Its
other methods fold the op on either side of a linear into the same launch (``fold``). Each router has
split-K workspaces of its own (``space``), so engines never share a buffer.
"""

from __future__ import annotations

import functools
import itertools

import torch

from .gemv import MAX_M, gemv, gemv_residual, gemv_rmsnorm, gemv_swiglu, torch_swiglu, triton_available

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


def _gemv_fused_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                   residual: torch.Tensor | None, eps: float, swiglu: bool, space: torch.Tensor) -> torch.Tensor:
    if swiglu:
        return gemv_swiglu(x, weight, bias, residual, space=int(space))
    if norm_weight is not None:
        return gemv_rmsnorm(x, norm_weight, eps, weight, bias, space=int(space))
    return gemv_residual(x, weight, residual, bias, space=int(space))


@functools.cache
def gemv_fused_op():
    """The GEMV with its prologue or epilogue as a custom op (as :func:`gemv_op`):
    ``torch.ops.lfm2vl.gemv_fused(x, weight, bias, norm_weight, residual, eps, swiglu, space)`` runs
    :func:`gemv_swiglu` (``swiglu``), else :func:`gemv_rmsnorm` (a ``norm_weight``), else
    :func:`gemv_residual`. Registered on first use."""
    op = torch.library.custom_op("lfm2vl::gemv_fused", _gemv_fused_op, mutates_args=())
    op.register_fake(lambda x, weight, bias, norm_weight, residual, eps, swiglu, space:
                     x.new_empty((*x.shape[:-1], weight.shape[0])))
    return op


class DecodeLinear:
    """A drop-in ``F.linear`` (``linear(x, weight, bias)``) that sends a decode step's linears (at most
    :data:`MAX_M` rows, 16-bit, on CUDA, a contiguous weight) to the kernel and everything else (a
    prefill's hundreds of rows) to torch's own. It reads only tensor properties, so torch.compile
    traces it whole (``fullgraph``).

    Each router has split-K workspaces of its own (``space``): an engine that makes one never shares
    a buffer with another engine's graphs, which another thread may replay at the same time on another
    stream. The space is a tensor, not part of the traced code, so routers of several engines share
    one compiled function instead of each compiling its own.

    Its three other methods take the op next to a linear into the same kernel where the kernel takes the
    call (``fold``): :meth:`norm_linear` the RMSNorm before it, :meth:`residual_linear` the residual add
    after it, :meth:`swiglu_linear` the MLP's activation before it (and the add after); elsewhere, and
    while ``fold`` is off, they run torch's own ops.

    ``fold`` is off by default. Folded, the 450M decode step ran 0.605 ms against 0.655 (one request), but
    an engine of two requests with the folds gave other logits in 4 of 15 runs of the same request, and
    one without them in 3 of 10 (``scripts/pdl_race_probe.py``, ``scripts/divergence_probe.py``, the
    probes of 2026-12-04 in ``data/results/nvidia-h200/probes/``): runs part just after an attention layer.
    The kernel's own roundings are torch's (the interpreter's tests); until the cause is cleared, the
    folds stay an experiment."""

    def __init__(self, fold: bool = False):
        self.op, self.fused_op = gemv_op(), gemv_fused_op()
        self.on = triton_available()  # decided here, once: a call inside a traced function must not ask
        self.space = torch.tensor(next(_SPACES))
        self.fold = fold  # the norm, activation and residual add into the kernel (norm_linear and the others)

    def _takes(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, width: int) -> bool:
        """The kernel takes this call: a decode step's few 16-bit rows on CUDA, rows ``width`` wide."""
        return (self.on and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
                and weight.dim() == 2 and weight.is_contiguous() and x.shape[-1] == width
                and x.numel() <= MAX_M * width and (bias is None or bias.dtype == x.dtype))

    def _adds(self, residual: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return residual is None or (residual.dtype == x.dtype and residual.is_cuda
                                    and tuple(residual.shape) == (*x.shape[:-1], weight.shape[0]))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self._takes(x, weight, bias, weight.shape[-1]):
            return self.op(x, weight, bias, self.space)
        return _F_LINEAR(x, weight, bias)

    def norm_linear(self, x: torch.Tensor, norm, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """``F.linear(norm(x), weight, bias)``, LFM2's RMSNorm (``norm``: a module with ``weight`` and
        ``variance_epsilon``) inside the kernel (:func:`gemv_rmsnorm`) where it takes the call."""
        nw = norm.weight
        if self.fold and self._takes(x, weight, bias, weight.shape[-1]) and nw.dtype == x.dtype \
                and nw.is_contiguous():
            return self.fused_op(x, weight, bias, nw, None, float(norm.variance_epsilon), False, self.space)
        return self(norm(x), weight, bias)

    def residual_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        residual: torch.Tensor) -> torch.Tensor:
        """``residual + F.linear(x, weight, bias)``, the addition in the kernel (:func:`gemv_residual`)."""
        if self.fold and self._takes(x, weight, bias, weight.shape[-1]) and self._adds(residual, x, weight):
            return self.fused_op(x, weight, bias, None, residual, 0.0, False, self.space)
        return residual + self(x, weight, bias)

    def swiglu_linear(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      residual: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear(silu(g) * u, weight, bias)`` (``+ residual``), ``g, u = h.chunk(2, -1)``, the
        activation and the addition in the kernel (:func:`gemv_swiglu`)."""
        if self.fold and self._takes(h, weight, bias, 2 * weight.shape[-1]) \
                and self._adds(residual, h[..., : weight.shape[-1]], weight):
            return self.fused_op(h, weight, bias, None, residual, 0.0, True, self.space)
        y = self(torch_swiglu(h), weight, bias)
        return y if residual is None else residual + y


def decode_linear(fold: bool = False) -> DecodeLinear:
    """A new router (:class:`DecodeLinear`) with workspaces of its own."""
    return DecodeLinear(fold)
