"""Packing: processor output → packed varlen layout, checked against transformers' own code."""

import pytest
import torch
from transformers.models.lfm2_vl.modeling_lfm2_vl import Lfm2VlMultiModalProjector
from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

from lfm2vl_lab import PackedVisionEncoder, pack_inputs, random_processor_output
from lfm2vl_lab.core.packing import (
    PositionEmbeddingCache,
    lfm2vl_check_shapes,
    lfm2vl_cu_seqlens,
    lfm2vl_gather_idx,
    lfm2vl_local_gather_idx,
)
from lfm2vl_lab.model.presets import build_config

SHAPES = [(2, 2), (4, 6), (6, 4), (16, 16), (14, 20), (26, 38), (32, 32), (2, 512), (512, 2)]


@pytest.fixture(scope="module")
def hf_projector():
    torch.manual_seed(0)
    return Lfm2VlMultiModalProjector(build_config("tiny")).eval()


# --------------------------------------------------------------------------------------------
# gather_idx == transformers' pixel_unshuffle
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("h,w", SHAPES)
def test_local_gather_idx_is_pixel_unshuffle(hf_projector, h, w):
    c = 8
    x = torch.randn(h * w, c)
    ours = x.index_select(0, lfm2vl_local_gather_idx(h, w)).reshape(-1, 4 * c)
    ref = hf_projector.pixel_unshuffle(x.reshape(1, h, w, c)).reshape(-1, 4 * c)
    assert ours.shape == ref.shape == ((h // 2) * (w // 2), 4 * c)
    assert torch.equal(ours, ref)


def test_packed_gather_idx_is_per_item_pixel_unshuffle(hf_projector):
    shapes = [(4, 6), (32, 32), (2, 2), (14, 20)]
    c = 5
    xs = [torch.randn(h * w, c) for h, w in shapes]
    idx = lfm2vl_gather_idx(shapes)
    assert idx.dtype == torch.int64 and idx.numel() == sum(h * w for h, w in shapes)
    ours = torch.cat(xs).index_select(0, idx).reshape(-1, 4 * c)
    ref = torch.cat([hf_projector.pixel_unshuffle(x.reshape(1, h, w, c)).reshape(-1, 4 * c)
                     for x, (h, w) in zip(xs, shapes)])
    assert torch.equal(ours, ref)


def test_gather_idx_formula():
    # item (4, 6) at offset 0, then item (2, 2) at offset 24: o + (2r+dh)·w + (2c+dw)
    idx = lfm2vl_gather_idx([(4, 6), (2, 2)]).tolist()
    assert idx[:4] == [0, 1, 6, 7]  # token (0, 0)
    assert idx[4:8] == [2, 3, 8, 9]  # token (0, 1)
    assert idx[12:16] == [12, 13, 18, 19]  # token (1, 0)
    assert idx[24:] == [24, 25, 26, 27]
    assert sorted(idx) == list(range(28))  # a permutation: every row used once


def test_gather_idx_with_offset():
    assert torch.equal(lfm2vl_gather_idx([(2, 4)], offset=10), lfm2vl_gather_idx([(2, 4)]) + 10)


# --------------------------------------------------------------------------------------------
# Position embeddings == Siglip2VisionEmbeddings.resize_positional_embeddings
# --------------------------------------------------------------------------------------------

POS_SHAPES = [(2, 2), (4, 6), (16, 16), (14, 20), (26, 38), (32, 32), (8, 128), (34, 28)]


def _hf_resized(weight, shapes, max_length=1024):
    grid = weight.reshape(16, 16, -1)
    ss = torch.tensor(shapes, dtype=torch.int64)
    return Siglip2VisionEmbeddings.resize_positional_embeddings(grid, ss, max_length)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_position_embeddings_match_transformers(dtype):
    torch.manual_seed(1)
    emb = torch.nn.Embedding(256, 24).to(dtype)
    cache = PositionEmbeddingCache(emb)
    assert cache.grid == 16
    ref = _hf_resized(emb.weight.detach(), POS_SHAPES)
    for i, (h, w) in enumerate(POS_SHAPES):
        got = cache.get(h, w)
        assert got.shape == (h * w, 24) and got.dtype == dtype
        torch.testing.assert_close(got, ref[i, : h * w], rtol=0, atol=0)
    packed = cache.pack(POS_SHAPES)
    expected = torch.cat([ref[i, : h * w] for i, (h, w) in enumerate(POS_SHAPES)])
    torch.testing.assert_close(packed, expected, rtol=0, atol=0)


def test_position_cache_counts_hits_and_recomputes_after_weight_change():
    torch.manual_seed(2)
    emb = torch.nn.Embedding(256, 8)
    cache = PositionEmbeddingCache(emb)
    a = cache.get(4, 6)
    assert (cache.hits, cache.misses) == (0, 1)
    b = cache.get(4, 6)
    assert (cache.hits, cache.misses) == (1, 1)
    assert b is a
    cache.pack([(4, 6), (2, 2), (4, 6), (2, 2)])
    assert (cache.hits, cache.misses) == (4, 2)

    with torch.no_grad():
        emb.weight.mul_(-3.0)  # in place: same storage, new version
    c = cache.get(4, 6)
    assert cache.misses == 3, "an in-place weight update must invalidate the cache"
    torch.testing.assert_close(c, _hf_resized(emb.weight.detach(), [(4, 6)])[0, :24], rtol=0, atol=0)
    torch.testing.assert_close(c, -3.0 * a, rtol=1e-6, atol=1e-6)


def _entry_bytes(h, w, channels=8):
    return h * w * channels * 4  # float32 rows of the resized grid


def test_position_cache_is_an_lru_bounded_in_bytes():
    torch.manual_seed(3)
    emb = torch.nn.Embedding(256, 8)
    cache = PositionEmbeddingCache(emb, max_bytes=3 * _entry_bytes(4, 4))
    ref = PositionEmbeddingCache(emb, max_bytes=2**30)  # unbounded: the values to expect
    held = cache.get(4, 4)
    cache.get(2, 8)
    cache.get(8, 2)
    assert (len(cache), cache.nbytes, cache.evictions) == (3, 3 * _entry_bytes(4, 4), 0)
    cache.get(4, 4)  # used again: now the most recent
    cache.get(2, 6)  # needs room: evicts the least recently used, (2, 8)
    assert cache.evictions == 1 and len(cache) == 3
    assert cache.nbytes == 2 * _entry_bytes(4, 4) + _entry_bytes(2, 6) <= cache.max_bytes
    hits = cache.hits
    cache.get(4, 4)
    cache.get(8, 2)
    assert cache.hits == hits + 2  # both survived
    cache.get(2, 8)
    assert cache.misses == 5  # (2, 8) was gone and is recomputed
    torch.testing.assert_close(cache.get(2, 8), ref.get(2, 8), rtol=0, atol=0)
    # A tensor handed out before its entry was evicted is still intact.
    for shape in [(2, 2), (6, 6), (2, 4)]:
        cache.get(*shape)
    torch.testing.assert_close(held, ref.get(4, 4), rtol=0, atol=0)
    assert cache.info() == {"entries": len(cache), "bytes": cache.nbytes, "max_bytes": cache.max_bytes,
                            "hits": cache.hits, "misses": cache.misses, "evictions": cache.evictions}


def test_position_cache_never_exceeds_its_budget_on_a_stream():
    emb = torch.nn.Embedding(256, 8)
    cache = PositionEmbeddingCache(emb, max_bytes=10_000)
    shapes = [(2 * (1 + i % 7), 2 * (1 + (i * 5) % 11)) for i in range(200)]
    for h, w in shapes:
        cache.get(h, w)
        assert cache.nbytes <= cache.max_bytes
        assert cache.nbytes == sum(t.numel() * t.element_size() for t in cache._cache.values())
    assert cache.evictions > 0 and cache.hits + cache.misses == len(shapes)


def test_position_cache_entry_larger_than_the_budget_is_returned_not_kept():
    emb = torch.nn.Embedding(256, 8)
    cache = PositionEmbeddingCache(emb, max_bytes=_entry_bytes(4, 4))
    small = cache.get(4, 4)
    big = cache.get(16, 16)  # 16 times the budget
    torch.testing.assert_close(big, PositionEmbeddingCache(emb).get(16, 16), rtol=0, atol=0)
    assert (len(cache), cache.nbytes, cache.evictions) == (1, _entry_bytes(4, 4), 0)  # the small one stays
    assert cache.get(4, 4) is small
    nothing = PositionEmbeddingCache(emb, max_bytes=0)
    nothing.get(4, 4)
    nothing.get(4, 4)
    assert (len(nothing), nothing.nbytes, nothing.misses) == (0, 0, 2)


def test_position_cache_budget_default_and_bad_value():
    from lfm2vl_lab.core.packing import DEFAULT_POS_CACHE_BYTES

    emb = torch.nn.Embedding(256, 8)
    assert PositionEmbeddingCache(emb).max_bytes == DEFAULT_POS_CACHE_BYTES == 64 * 2**20
    with pytest.raises(ValueError, match="max_bytes.*-1"):
        PositionEmbeddingCache(emb, max_bytes=-1)


# --------------------------------------------------------------------------------------------
# cu_seqlens, max_seqlen and the packed batch
# --------------------------------------------------------------------------------------------


def test_cu_seqlens_values():
    cu = lfm2vl_cu_seqlens([(4, 6), (32, 32), (2, 2)])
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 24, 1048, 1052]


def test_pack_inputs_layout():
    shapes = [(4, 6), (32, 32), (2, 2), (26, 38)]
    inputs = random_processor_output(shapes, "tiny", seed=5)
    b = pack_inputs(inputs)
    assert b.shapes == shapes and b.n_items == 4
    assert b.cu_seqlens.tolist() == [0, 24, 1048, 1052, 2040]
    assert b.max_seqlen == 1024
    assert b.total_rows == 2040
    assert b.out_tokens == [6, 256, 1, 247] and b.total_tokens == 510
    assert b.pos_embeds is None
    assert b.pixel_values.shape == (2040, 768)
    pv = inputs["pixel_values"]
    ref = torch.cat([pv[i, : h * w] for i, (h, w) in enumerate(shapes)])
    assert torch.equal(b.pixel_values, ref)
    assert torch.equal(b.gather_idx, lfm2vl_gather_idx(shapes))


def test_pack_with_position_cache_on_the_encoder(tiny_model):
    enc = PackedVisionEncoder(tiny_model)
    shapes = [(16, 24), (2, 2)]
    b = enc.pack(random_processor_output(shapes, "tiny", seed=1))
    ref = _hf_resized(tiny_model.model.vision_tower.embeddings.position_embedding.weight.detach(), shapes)
    assert torch.equal(b.pos_embeds, torch.cat([ref[0, :384], ref[1, :4]]))
    assert b.max_seqlen == 384


# --------------------------------------------------------------------------------------------
# Bad inputs: ValueError naming the offending shape or value
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 4), (4, 5), (31, 32)])
def test_odd_side(shape):
    h, w = shape
    with pytest.raises(ValueError, match=f"{h}x{w}"):
        pack_inputs(random_processor_output([(2, 2), shape], "tiny"))


def test_item_over_max_patches():
    n = 34 * 32  # 1088 rows, even sides
    inputs = {
        "pixel_values": torch.zeros(1, n, 768),
        "pixel_attention_mask": torch.ones(1, n, dtype=torch.int32),
        "spatial_shapes": torch.tensor([[34, 32]]),
    }
    with pytest.raises(ValueError, match=r"34x32 = 1088 rows exceeds max_num_patches=1024"):
        pack_inputs(inputs)
    with pytest.raises(ValueError, match="1088"):
        lfm2vl_check_shapes([(34, 32)], 1024)


def test_spatial_shape_larger_than_the_padded_rows():
    inputs = random_processor_output([(32, 32)], "tiny")
    inputs["spatial_shapes"] = torch.tensor([[32, 34]])
    inputs.pop("pixel_attention_mask")
    with pytest.raises(ValueError, match="32x34"):
        pack_inputs(inputs)


def test_empty_batch():
    inputs = {
        "pixel_values": torch.zeros(0, 1024, 768),
        "pixel_attention_mask": torch.zeros(0, 1024, dtype=torch.int32),
        "spatial_shapes": torch.zeros(0, 2, dtype=torch.int64),
    }
    with pytest.raises(ValueError, match="empty"):
        pack_inputs(inputs)


def test_mismatched_item_counts():
    inputs = random_processor_output([(4, 6), (2, 2)], "tiny")
    inputs["spatial_shapes"] = torch.tensor([[4, 6], [2, 2], [2, 2]])
    with pytest.raises(ValueError, match=r"2 items.*3"):
        pack_inputs(inputs)


def test_mask_disagrees_with_spatial_shapes():
    inputs = random_processor_output([(4, 6), (2, 2)], "tiny")
    inputs["pixel_attention_mask"][1, 4] = 1  # one extra row marked real
    with pytest.raises(ValueError, match=r"item 1.*5 rows.*2x2 = 4"):
        pack_inputs(inputs)


def test_mask_of_the_wrong_shape():
    inputs = random_processor_output([(4, 6)], "tiny")
    inputs["pixel_attention_mask"] = torch.ones(1, 512, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(1, 512\)"):
        pack_inputs(inputs)


def test_missing_key():
    inputs = random_processor_output([(4, 6)], "tiny")
    del inputs["spatial_shapes"]
    with pytest.raises(ValueError, match="spatial_shapes"):
        pack_inputs(inputs)


def test_wrong_pixel_row_width(tiny_model):
    enc = PackedVisionEncoder(tiny_model)
    inputs = random_processor_output([(4, 6)], "tiny")
    inputs["pixel_values"] = inputs["pixel_values"][..., :700]
    with pytest.raises(ValueError, match=r"700.*768"):
        enc.pack(inputs)


def test_pixel_values_of_the_wrong_rank():
    inputs = random_processor_output([(4, 6)], "tiny")
    inputs["pixel_values"] = inputs["pixel_values"].reshape(-1, 768)
    with pytest.raises(ValueError, match=r"\(1024, 768\)"):
        pack_inputs(inputs)
