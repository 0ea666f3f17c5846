"""Parity with vLLM's own LFM2-VL encoder-graph helpers (VLLM_VERSION of lfm2vl_lab/tools/vllm_release.py).

Skipped where vLLM is not installed. CI runs this file in a separate venv that has it
(see .ci/run). Every comparison uses fresh random inputs; vLLM's methods that only need a
``factor`` or a static helper from ``self`` are called with a minimal stand-in object.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from lfm2vl_lab.core.config import auto_budgets, auto_max_items, pad_cu_seqlens_repeat_last
from lfm2vl_lab.core.manager import pad_default
from lfm2vl_lab.core.packing import PositionEmbeddingCache, lfm2vl_cu_seqlens, lfm2vl_gather_idx, lfm2vl_pack_pixels

# Not `pip install '.[vllm]'`: that pulls vLLM's own CUDA torch, GBs. The script layers vLLM onto .venv (~0.9 GB).
vllm_lfm2 = pytest.importorskip(
    "vllm.model_executor.models.lfm2_vl",
    reason="vLLM is not installed here; build .venv-vllm with scripts/vllm_venv.sh and run this file with it "
    "(docs/install.md)",
)
vllm_graphs = pytest.importorskip("vllm.v1.worker.encoder_cudagraph")
vllm_siglip = pytest.importorskip("vllm.model_executor.models.lfm2_siglip2")


VllmLfm2 = vllm_lfm2.Lfm2VLForConditionalGeneration
Manager = vllm_graphs.EncoderCudaGraphManager


def random_shapes(rng: random.Random, n: int) -> list[tuple[int, int]]:
    out = []
    while len(out) < n:
        h, w = 2 * rng.randint(1, 32), 2 * rng.randint(1, 32)
        if h * w <= 1024:
            out.append((h, w))
    return out


def vllm_self(factor: int = 2):
    """The few attributes vLLM's LFM2-VL packing methods read from ``self``."""
    return SimpleNamespace(
        multi_modal_projector=SimpleNamespace(factor=factor),
        _get_lfm2vl_tile_input_lengths=VllmLfm2._get_lfm2vl_tile_input_lengths,
    )


@pytest.mark.parametrize("lo,hi", [(64, 1024), (64, 800), (64, 64), (32, 4096), (100, 700)])
def test_budgets_match_vllm(lo, hi):
    assert auto_budgets(lo, hi) == Manager._generate_budgets(lo, hi)
    budgets = auto_budgets(lo, hi)
    # vLLM's automatic item limit: min(max_budget // min_budget, min(budgets))
    assert auto_max_items(budgets, lo) == min(max(budgets) // lo, min(budgets))


@pytest.mark.parametrize("seed", range(5))
def test_gather_idx_matches_vllm(seed):
    shapes = random_shapes(random.Random(seed), 6)
    theirs = VllmLfm2._get_lfm2vl_projector_gather_idx(vllm_self(), [list(s) for s in shapes], torch.device("cpu"))
    assert torch.equal(lfm2vl_gather_idx(shapes, 2), theirs)


@pytest.mark.parametrize("seed", range(5))
def test_packing_matches_vllm(seed):
    rng = random.Random(seed)
    shapes = random_shapes(rng, 5)
    pv = torch.randn(len(shapes), 1024, 768)
    ours = lfm2vl_pack_pixels(pv, shapes)
    theirs = VllmLfm2._pack_lfm2vl_pixel_values(vllm_self(), pv, [list(s) for s in shapes])
    assert torch.equal(ours, theirs)
    cu_theirs = VllmLfm2._get_lfm2vl_cu_seqlens(vllm_self(), [list(s) for s in shapes], torch.device("cpu"))
    assert torch.equal(lfm2vl_cu_seqlens(shapes), cu_theirs)


@pytest.mark.parametrize("seed", range(3))
def test_pos_embeds_match_vllm(seed):
    shapes = random_shapes(random.Random(seed), 4)
    emb = torch.nn.Embedding(256, 48)
    torch.nn.init.normal_(emb.weight, generator=torch.Generator().manual_seed(seed))
    ours = PositionEmbeddingCache(emb).pack(shapes)
    theirs = vllm_siglip.Siglip2VisionEmbeddings.resize_positional_embeddings_packed(
        emb.weight.reshape(16, 16, -1), torch.tensor(shapes), lengths_list=[h * w for h, w in shapes]
    )
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(5))
def test_padding_functions_match_vllm(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 9, (1,), generator=g))
    lens = torch.randint(1, 300, (n,), generator=g, dtype=torch.int32)
    src = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0, dtype=torch.int32)])
    size = n + int(torch.randint(1, 6, (1,), generator=g))
    ours, theirs = torch.full((size,), -7, dtype=torch.int32), torch.full((size,), -7, dtype=torch.int32)
    pad_cu_seqlens_repeat_last(ours, src)
    vllm_lfm2._pad_cumulative_seqlens_buffer(theirs, src)
    assert torch.equal(ours, theirs)

    rows = int(torch.randint(1, 50, (1,), generator=g))
    data = torch.randn(rows, 8, generator=g)
    ours, theirs = torch.randn(64, 8), torch.randn(64, 8)
    pad_default(ours, data)
    Manager._copy_padded_buffer(theirs, data)
    assert torch.equal(ours, theirs)
