"""The Triton kernel behind :func:`lfm2vl_lab.kernels.decode_attention.decode_attention`, kept in a module of
its own: importing Triton costs time, and only a run that launches the kernel imports this."""

import triton
import triton.language as tl


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, S, qk_scale,
                            sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h,
                            G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """One request ``b`` and one KV head ``hk``: the ``G`` query heads that share that KV head attend to
    positions ``0..pos[b]`` of the cache, in ``BLOCK_S``-long chunks, one after another.

    ``qk_scale`` is the softmax scale times log2(e), so the exponentials are ``exp2``. The loop's end
    is read from ``pos`` on the device, so a captured graph replays it for whatever ``pos`` holds then;
    a position past ``pos[b]`` (or at ``S`` and beyond) is never loaded. ``GP`` is ``G`` rounded up to a
    power of two; the rows past ``G`` compute on zeros and are never stored."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    g = tl.arange(0, GP)
    g_ok = g < G
    d = tl.arange(0, D)
    heads = hk * G + g
    q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None], other=0.0)
    q = q.to(tl.float32) * qk_scale
    end = tl.minimum(tl.load(pos_ptr + b) + 1, S).to(tl.int32)  # positions 0..pos[b], never one the slice lacks
    k_base = k_ptr + b.to(tl.int64) * sk_b + hk.to(tl.int64) * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + hk.to(tl.int64) * sv_h
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)  # running max of each row's scores (log2 units)
    l_i = tl.zeros([GP], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([GP, D], dtype=tl.float32)  # running sum of exp2(score - m_i) * v
    for s0 in range(0, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < end
        k = tl.load(k_base + s[:, None] * sk_s + d[None, :], mask=s_ok[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GP, BLOCK_S]
        scores = tl.where(s_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)  # 0 on the first chunk (m_i = -inf); every chunk has a position in use
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + s[:, None] * sv_s + d[None, :], mask=s_ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + b * so_b + heads[:, None] * so_h + d[None, :], o.to(o_ptr.dtype.element_ty), mask=g_ok[:, None])
