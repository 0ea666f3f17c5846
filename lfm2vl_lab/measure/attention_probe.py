"""``python -m lfm2vl_lab attention``: the capturable attention kernels, timed inside CUDA graphs.

The packed encoder's GPU floor is set largely by its attention kernel. This probe times, for one
preset's head layout and a few packed layouts, each candidate *replayed from a CUDA graph* (so
launch overhead is out of the picture) and checks it against a float32 reference:

* ``varlen``          torch's ``varlen_attn`` over cu_seqlens (FlashAttention-2 on torch 2.11)
* ``sdpa_blockmask``  SDPA with a block-diagonal boolean mask (exact; memory-efficient kernel)
* ``cudnn_ragged``    cuDNN's ragged kernel through ``aten._cudnn_attention_forward`` with
                      cu_seqlens (torch 2.11 could not capture it on the H200: the failure is kept)
* ``dense_cudnn``     batched dense SDPA on (items, heads, L, d), cuDNN first (the dense graphs' kernel;
                      layouts whose items all have one length)
* ``dense_flash``     the same on FlashAttention-2's dense kernel, for comparison
* ``dense+varlen``    the dense graphs' mixed variant: dense on the leading full-length run, varlen on
                      the rest (layouts that start with such a run and have a rest)

A candidate that fails (to run, to capture or to be correct) stays in the rows with its error.
"""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..core.capture import capture_graph, recover_from_failed_capture
from ..kernels.attention import attention_dense_blocks, attention_sdpa_blockmask, attention_varlen, dense_attention
from ..model.parity import rel_error
from ..model.presets import as_preset

LAYOUTS = ((1024,), (1024,) * 4, (1024,) * 16, (256,) * 16, (1024, 600, 256, 256, 64), (1024, 1024, 576, 64))


def _graph_time_ms(fn, iters: int = 50) -> float:
    """Mean ms of one replay of ``fn`` captured into a graph (the kit's one capture recipe)."""
    g = capture_graph(fn, warmup=3)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def _cudnn_ragged(q, k, v, cu, max_len: int, scale: float):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, max_len, max_len, False, 0.0, False,
                                                   False, scale=scale)[0]


def _dense_flash(q, k, v, n: int, scale: float):
    t, h, d = q.shape
    q, k, v = (x.view(n, t // n, h, d).transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(t, h, d)


def _candidates(q, k, v, lens, scale) -> dict:
    """The attention backends to time on one layout, each a no-argument call."""
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    m = max(lens)
    cands = {"varlen": lambda: attention_varlen(q, k, v, cu, m, scale),
             "sdpa_blockmask": lambda: attention_sdpa_blockmask(q, k, v, cu, m, scale),
             "cudnn_ragged": lambda: _cudnn_ragged(q, k, v, cu, m, scale)}
    if len(set(lens)) == 1:
        cands["dense_cudnn"] = lambda: attention_dense_blocks(q, k, v, len(lens), scale)
        cands["dense_flash"] = lambda: _dense_flash(q, k, v, len(lens), scale)
    run = next((i for i, n in enumerate(lens) if n != lens[0]), len(lens))
    if 0 < run < len(lens):
        cu_rest = cu[run:] - cu[run]
        mixed = dense_attention(run, lens[0], rest=attention_varlen)
        cands["dense+varlen"] = lambda: mixed(q, k, v, cu_rest, m, scale)
    return cands


def _measure(fn, ref) -> dict:
    """Error vs float32 and ms per replay, or the error that stopped it (with its traceback)."""
    stream = torch.cuda.current_stream()
    try:
        err = rel_error(fn(), ref)
        if not err <= 1e-2:  # NaN fails too
            return {"rel_err_vs_fp32": err, "error": f"wrong result: rel error {err:.3g} vs float32"}
        return {"rel_err_vs_fp32": err, "graph_ms_per_layer": _graph_time_ms(fn)}
    except Exception as exc:  # every failure is a result of the probe, kept with its traceback
        recover_from_failed_capture(stream)
        return {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}",
                "traceback": traceback.format_exc()}


def probe(preset: str = "lfm2-vl-450m", layouts=LAYOUTS, seed: int = 0) -> list[dict]:
    """Per-layer attention time (ms, graph replay) and error vs float32 for each backend and layout."""
    p = as_preset(preset)
    heads, dim = p.vision["num_attention_heads"], p.vision["hidden_size"] // p.vision["num_attention_heads"]
    scale = dim**-0.5
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for lens in layouts:
        t = sum(lens)
        q, k, v = (torch.randn(t, heads, dim, device="cuda", generator=g).bfloat16() for _ in range(3))
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
        ref = attention_sdpa_blockmask(q.float(), k.float(), v.float(), cu, max(lens), scale)
        for name, fn in _candidates(q, k, v, lens, scale).items():
            rows.append({"preset": p.name, "heads": heads, "head_dim": dim, "layout": list(lens), "backend": name,
                         **_measure(fn, ref)})
    return rows
