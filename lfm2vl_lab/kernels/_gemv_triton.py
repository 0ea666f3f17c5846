"""The Triton side of :mod:`.gemv`: its kernel and helpers. Imported by :func:`.gemv._kernel` on
first use only, since importing Triton costs time and a CPU run never needs it.

A program owns ``BLOCK_N`` rows of W (one row tile) and one of ``SPLIT_K`` spans of K. It keeps one
fp32 accumulator per row of x (``BLOCK_M`` of them, at most four, unrolled at compile time), so each
chunk of W it loads serves every row of x. Without a split it writes ``y`` itself; with one, it
parks its partial sums, and the last program of its row tile to bump the tile's counter adds them
up, writes ``y`` and puts the counter back to zero.

With ``NORM`` the kernel is :func:`.gemv.gemv_rmsnorm`: ``x`` goes through transformers' RMSNorm on
its way in. Each program first reads its rows of x whole (a few KiB, from L2) for their sums of
squares in fp32, so every program, split-K or not, has each row's ``rstd`` without a second kernel;
then each x chunk of its K loop is normalized as Lfm2RMSNorm does it: ``(x * rstd)`` in fp32, rounded
to x's dtype, times the norm weight (rounded again: a 16-bit product, as torch's), and only then dotted
with W in fp32.

With ``SWIGLU`` each row of x holds ``2K`` values, a gate ``g`` and an up projection ``u``, and the
row the GEMV reads is LFM2's MLP activation, ``silu(g) * u``, computed as torch computes it on 16-bit
tensors: ``silu`` in fp32 rounded to x's dtype, the product rounded again. With ``RES`` the row of y
is added to a residual row on its way out: the product rounded to y's dtype first (the linear's own
output), then the sum rounded again, as ``residual + F.linear(...)`` rounds. Both take a kernel off
the decode step: the activation's and the residual add's.
"""

import triton
import triton.language as tl


@triton.jit
def _rstd(x_ptr, K, eps, ON: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row's ``1 / sqrt(mean(x * x) + eps)`` in fp32 (the row read whole); 1 unless ``ON``."""
    r = 1.0
    if ON:
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, eviction_policy="evict_last").to(tl.float32)
            ss += x * x
        r = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    return r


@triton.jit
def _row_dot(w, x_ptr, cols, col_ok, nw_ptr, rstd, K, NORM: tl.constexpr, SWIGLU: tl.constexpr):
    """One row of x's chunk (normalized first, with ``NORM``; ``silu(g) * u`` of its two halves, with
    ``SWIGLU``) against the loaded W chunk: a (BLOCK_N,) fp32 partial sum."""
    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
    if SWIGLU:  # torch's roundings: silu(g) in fp32 to x's dtype, then the 16-bit product
        u = tl.load(x_ptr + K + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        g = x.to(tl.float32)
        x = ((g / (1.0 + tl.exp(-g))).to(x.dtype).to(tl.float32) * u.to(tl.float32)).to(x.dtype)
    if NORM:  # Lfm2RMSNorm's roundings: weight * (x * rstd).to(dtype), a product in x's dtype. Each cast
        # rounds to nearest even, as torch's (on the GPU: Triton's interpreter truncates fp32 -> bf16)
        nw = tl.load(nw_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        x = ((x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32) * nw).to(x.dtype)
    return tl.sum(w * x.to(tl.float32)[None, :], axis=1)


@triton.jit
def _write(acc, m, y_ptr, b_ptr, r_ptr, rows, row_ok, N, HAS_BIAS: tl.constexpr, RES: tl.constexpr):
    """Row ``m`` of y: the bias added in fp32, then rounded once to y's dtype; with ``RES``, that
    added to row ``m`` of the residual and rounded again."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    y = acc.to(y_ptr.dtype.element_ty)
    if RES:
        r = tl.load(r_ptr + m * N + rows, mask=row_ok, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + m * N + rows, y, mask=row_ok)


@triton.jit
def _gather(m, part_ptr, rows, row_ok, N, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """Row ``m``'s partial sums from every split, added up (``.cg``: from L2, where the others wrote)."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(part_ptr + (s * BLOCK_M + m) * N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _finish(acc, m, y_ptr, b_ptr, r_ptr, part_ptr, rows, row_ok, N, last, HAS_BIAS: tl.constexpr,
            RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """Row ``m``'s end: written, or (split K, the last program of the tile) gathered and written."""
    if SPLIT_K == 1:
        _write(acc, m, y_ptr, b_ptr, r_ptr, rows, row_ok, N, HAS_BIAS, RES)
    else:
        if last:
            _write(_gather(m, part_ptr, rows, row_ok, N, BLOCK_N, BLOCK_M, SPLIT_K), m, y_ptr, b_ptr, r_ptr,
                   rows, row_ok, N, HAS_BIAS, RES)


@triton.jit
def _park(acc, m, part_ptr, pid_k, rows, row_ok, N, BLOCK_M: tl.constexpr):
    tl.store(part_ptr + (pid_k * BLOCK_M + m) * N + rows, acc, mask=row_ok)


@triton.jit
def _rows_end(acc0, acc1, acc2, acc3, y_ptr, b_ptr, r_ptr, part_ptr, count_ptr, pid_n, pid_k, rows, row_ok, N,
              HAS_BIAS: tl.constexpr, RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              SPLIT_K: tl.constexpr):
    """Every row's end: written (no split), or parked, counted, and gathered by the tile's last program."""
    last = True
    if SPLIT_K > 1:
        _park(acc0, 0, part_ptr, pid_k, rows, row_ok, N, BLOCK_M)
        if BLOCK_M > 1:
            _park(acc1, 1, part_ptr, pid_k, rows, row_ok, N, BLOCK_M)
        if BLOCK_M > 2:
            _park(acc2, 2, part_ptr, pid_k, rows, row_ok, N, BLOCK_M)
        if BLOCK_M > 3:
            _park(acc3, 3, part_ptr, pid_k, rows, row_ok, N, BLOCK_M)
        tl.debug_barrier()  # every thread's partials are stored before the counter says so
        last = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == SPLIT_K - 1
    _finish(acc0, 0, y_ptr, b_ptr, r_ptr, part_ptr, rows, row_ok, N, last, HAS_BIAS, RES, BLOCK_N, BLOCK_M,
                SPLIT_K)
    if BLOCK_M > 1:
        _finish(acc1, 1, y_ptr, b_ptr, r_ptr, part_ptr, rows, row_ok, N, last, HAS_BIAS, RES, BLOCK_N, BLOCK_M,
                SPLIT_K)
    if BLOCK_M > 2:
        _finish(acc2, 2, y_ptr, b_ptr, r_ptr, part_ptr, rows, row_ok, N, last, HAS_BIAS, RES, BLOCK_N, BLOCK_M,
                SPLIT_K)
    if BLOCK_M > 3:
        _finish(acc3, 3, y_ptr, b_ptr, r_ptr, part_ptr, rows, row_ok, N, last, HAS_BIAS, RES, BLOCK_N, BLOCK_M,
                SPLIT_K)
    if SPLIT_K > 1:
        if last:
            tl.atomic_xchg(count_ptr + pid_n, 0)  # ready for the next call (or graph replay)


@triton.jit
def gemv_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, y_ptr, part_ptr, count_ptr, N, K, stride_xm, k_iters, eps,
                HAS_BIAS: tl.constexpr, NORM: tl.constexpr, SWIGLU: tl.constexpr, RES: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                EVEN_K: tl.constexpr, PDL: tl.constexpr):
    """``y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n])`` for one row tile and one span of K; with ``NORM``,
    ``x[m]`` is first RMS-normalized with the weight at ``nw_ptr`` (each program computes the rstd); with
    ``SWIGLU`` the row read is ``silu(g) * u`` of x's two halves; with ``RES``, y's row adds ``r_ptr``'s.

    With ``PDL`` (launched with programmatic dependent launch, Hopper on) the kernel may start while
    the kernel before it still runs: it waits for that kernel's writes (``gdc_wait``) before it reads
    anything, x, W, the workspace or the counters alike, then lets the kernel after it start launching
    at once (``gdc_launch_dependents``); that kernel waits in turn for this one's writes, so what is
    saved is the launch and ramp-up at each boundary, never an ordering."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    k_lo = pid_k * k_iters * BLOCK_K
    r0 = _rstd(x_ptr, K, eps, NORM, BLOCK_K)
    r1 = _rstd(x_ptr + stride_xm, K, eps, NORM and BLOCK_M > 1, BLOCK_K)
    r2 = _rstd(x_ptr + 2 * stride_xm, K, eps, NORM and BLOCK_M > 2, BLOCK_K)
    r3 = _rstd(x_ptr + 3 * stride_xm, K, eps, NORM and BLOCK_M > 3, BLOCK_K)
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in range(k_iters):
        k0 = k_lo + i * BLOCK_K
        cols = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:  # a chunk is all in K or (the last split's spare turns) all past it: one scalar says which
            col_ok = k0 < K
            w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok, other=0.0,
                        eviction_policy="evict_first")
        else:
            col_ok = cols < K
            w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
        w = w.to(tl.float32)
        acc0 += _row_dot(w, x_ptr, cols, col_ok, nw_ptr, r0, K, NORM, SWIGLU)
        if BLOCK_M > 1:
            acc1 += _row_dot(w, x_ptr + stride_xm, cols, col_ok, nw_ptr, r1, K, NORM, SWIGLU)
        if BLOCK_M > 2:
            acc2 += _row_dot(w, x_ptr + 2 * stride_xm, cols, col_ok, nw_ptr, r2, K, NORM, SWIGLU)
        if BLOCK_M > 3:
            acc3 += _row_dot(w, x_ptr + 3 * stride_xm, cols, col_ok, nw_ptr, r3, K, NORM, SWIGLU)
    _rows_end(acc0, acc1, acc2, acc3, y_ptr, b_ptr, r_ptr, part_ptr, count_ptr, pid_n, pid_k, rows, row_ok, N,
              HAS_BIAS, RES, BLOCK_M, BLOCK_N, SPLIT_K)
