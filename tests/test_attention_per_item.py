"""The CPU attention path: per item (equal lengths batched), the same result as the block-diagonal
mask over all packed rows, including buffer padding rows and zero-length tail sequences."""

import pytest
import torch

from lfm2vl_lab.kernels.attention import attention_blockmask_dense, attention_per_item, attention_sdpa_blockmask

H, D = 3, 8

# (cu_seqlens, total rows): rows past cu[-1] are buffer padding (the graph buffers' tail)
LAYOUTS = {
    "mixed lengths": ([0, 5, 12, 30, 33], 33),
    "equal lengths": ([0, 16, 32, 48, 64], 64),
    "equal and unequal": ([0, 8, 16, 20, 28], 28),
    "padding rows": ([0, 6, 16], 25),
    "zero-length tail (repeat_last)": ([0, 9, 20, 20, 20], 20),
    "zero-length tail and padding": ([0, 9, 20, 20, 20], 27),
    "zero-length in the middle": ([0, 4, 4, 11], 11),
    "one item": ([0, 17], 17),
    "padding only": ([0], 7),
}


def reference(q, k, v, cu, scale):
    """float64 softmax attention, segment by segment, written out (no SDPA)."""
    t = q.shape[0]
    bounds = [*cu, t] if cu[-1] < t else list(cu)  # padding rows: one segment of their own
    out = torch.zeros_like(q)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            s = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) * scale
            out[a:b] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[a:b])
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_per_item_equals_the_block_mask(name):
    cu, t = LAYOUTS[name]
    g = torch.Generator().manual_seed(len(name))
    q, k, v = (torch.randn(t, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    cu_t = torch.tensor(cu, dtype=torch.int32)
    lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
    max_seqlen = max(lens, default=0)
    ref = reference(q, k, v, cu, D**-0.5)
    per_item = attention_per_item(q, k, v, cu_t, max_seqlen, D**-0.5)
    masked = attention_blockmask_dense(q, k, v, cu_t, max_seqlen, D**-0.5)
    assert (per_item - masked).abs().max().item() <= 1e-12
    assert (per_item - ref).abs().max().item() <= 1e-12
    # the public backend takes the per-item path on CPU tensors
    assert torch.equal(attention_sdpa_blockmask(q, k, v, cu_t, max_seqlen, D**-0.5), per_item)


def test_per_item_fp32_and_strided_inputs():
    # q/k/v as the fused-QKV layer makes them: views into one (T, 3, H, D) tensor
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(40, 3, H, D, generator=g).unbind(1)
    cu = torch.tensor([0, 10, 20, 26, 36], dtype=torch.int32)
    out = attention_per_item(q, k, v, cu, 10, D**-0.5)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, attention_blockmask_dense(q, k, v, cu, 10, D**-0.5), rtol=0, atol=1e-6)


def test_traced_blockmask_stays_on_the_mask_path():
    # Under torch.compile the host read of cu_seqlens would break the graph: the mask path is traced.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(12, H, D, generator=g) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    compiled = torch.compile(attention_sdpa_blockmask, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, cu, 7, D**-0.5), attention_per_item(q, k, v, cu, 7, D**-0.5),
                               rtol=0, atol=1e-6)
