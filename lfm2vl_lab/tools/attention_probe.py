"""``python -m lfm2vl_lab attention``: the capturable attention kernels, timed inside CUDA graphs.

The packed encoder's GPU floor is set largely by its attention kernel. This probe times, for one
preset's head layout and a few packed layouts, each candidate *replayed from a CUDA graph* (so
launch overhead is out of the picture) and checks it against a float32 reference:

* ``varlen``          torch's ``varlen_attn`` (FlashAttention-2 varlen) over cu_seqlens
* ``sdpa_blockmask``  SDPA with a block-diagonal boolean mask (exact; memory-efficient kernel)
* ``sdpa_dense``      plain SDPA per item (only valid when the batch is one item: the best case)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.capture import capture_graph
from ..core.encoder import attention_sdpa_blockmask, attention_varlen
from ..core.parity import rel_error
from ..core.presets import as_preset


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


def _candidates(q, k, v, lens, scale) -> dict:
    """The attention backends to time on one layout, each a no-argument call."""
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    cands = {"varlen": lambda: attention_varlen(q, k, v, cu, max(lens), scale),
             "sdpa_blockmask": lambda: attention_sdpa_blockmask(q, k, v, cu, max(lens), scale)}
    if len(lens) == 1:
        def dense():
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                 v.transpose(0, 1)[None], scale=scale)
            return out[0].transpose(0, 1)
        cands["sdpa_dense"] = dense
    return cands


def probe(preset: str = "lfm2-vl-450m", layouts=((1024,), (1024,) * 4, (1024, 576, 256, 64)),
          seed: int = 0) -> list[dict]:
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
            err = rel_error(fn(), ref)
            rows.append({"preset": p.name, "heads": heads, "head_dim": dim, "layout": list(lens), "backend": name,
                         "graph_ms_per_layer": _graph_time_ms(fn), "rel_err_vs_fp32": err})
    return rows


def add_attention_args(p) -> None:
    """Options of ``python -m lfm2vl_lab attention``."""
    from .args import preset_arg

    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help="preset(s) (default: lfm2-vl-450m, lfm2-vl-1.6b)")
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def run_attention_cli(args) -> int:
    """Time the capturable attention kernels inside CUDA graphs (GPU only)."""
    import sys

    from .args import UsageError
    from .results import RESULTS_ROOT, provenance, save_result

    if not torch.cuda.is_available():
        raise UsageError("the attention probe needs a CUDA GPU and none is available")
    presets = args.preset or ["lfm2-vl-450m", "lfm2-vl-1.6b"]
    rows = [r for name in presets for r in probe(name)]
    result = {"name": "attention", "provenance": provenance("python -m lfm2vl_lab " + " ".join(sys.argv[1:]),
                                                              dtype="bfloat16"), "rows": rows}
    for r in rows:
        print(f"{r['preset']:>14} h{r['heads']}x{r['head_dim']} {str(r['layout']):>24} {r['backend']:>15} "
              f"{1000 * r['graph_ms_per_layer']:8.1f} us/layer  err {r['rel_err_vs_fp32']:.1e}")
    print("results:", save_result(result, args.out or RESULTS_ROOT, "attention"))
    return 0
