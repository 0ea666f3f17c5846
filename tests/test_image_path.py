"""The image path: staging the real rows through pinned memory, the processor on
the GPU, and the instrument that compares and times both. CPU tests use the tiny preset; the
``gpu`` ones check what only CUDA has (pinned buffers, async copies, the CUDA processor)."""

import pytest
import torch

from lfm2vl_lab import build_model
from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder
from lfm2vl_lab.core.staging import PixelItems, RowStager, gather_rows, padded_rows, row_offsets
from lfm2vl_lab.measure.image_path import compare_processors, on_device, time_encode_sources, time_processors
from lfm2vl_lab.measure.workloads import synthetic_image
from lfm2vl_lab.model.inputs import process_images

SHAPES = [(8, 8), (8, 8), (4, 4), (8, 8), (2, 6)]  # full, full, short, full, short: merges and breaks

# The CUDA processor resizes uint8 images in float32 and rounds back (torchvision), the CPU one with
# its native uint8 kernel: on CPU, the two kernels differ by at most 1 level on noise images; one
# more for float rounding differences between the CPU and CUDA float kernels.
MAX_DIFF_LEVELS = 2.0


def _padded(shapes=SHAPES, rows=64, dim=12, seed=0):
    pv = torch.randn(len(shapes), rows, dim, generator=torch.Generator().manual_seed(seed))
    for i, (h, w) in enumerate(shapes):
        pv[i, h * w :] = float("nan")  # padding: never read
    return pv


def _real(pv, shapes, batch=None):
    batch = range(len(shapes)) if batch is None else batch
    return torch.cat([pv[i, : shapes[i][0] * shapes[i][1]] for i in batch])


def _images():
    """A tiled image, a small one and a 512 px one: 6 full-length items, a short one, a full one
    (so the padded rows are two pieces, and replays sort the short item out of its place)."""
    return [synthetic_image(1024, 768), synthetic_image(200, 120, seed=2), synthetic_image(512, 512, seed=1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gather_rows_is_the_real_rows_cast_to_the_dtype(dtype):
    pv = _padded()
    out = torch.full((300, 12), 7.0, dtype=dtype)
    got = gather_rows(pv, SHAPES, out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (sum(h * w for h, w in SHAPES), 12)
    assert torch.equal(got, _real(pv, SHAPES).to(dtype))
    assert (out[got.shape[0] :] == 7).all()  # nothing written past the real rows
    with pytest.raises(ValueError, match="do not fit"):
        gather_rows(pv, SHAPES, torch.empty(10, 12, dtype=dtype))


def test_row_offsets_and_fewest_pieces():
    assert row_offsets(SHAPES) == (0, 64, 128, 144, 208, 220)
    pv = _padded()
    # padded: consecutive items merge while the earlier ones are full (tiles, then what follows them)
    assert [p.shape[0] for p in padded_rows(pv, SHAPES, [0, 1, 2, 3, 4])] == [144, 76]
    assert [p.shape[0] for p in padded_rows(pv, SHAPES, [3, 0, 1])] == [64, 128]
    ptr = pv.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == ptr for p in padded_rows(pv, SHAPES, [0, 1, 3]))  # views
    packed = PixelItems(_real(pv, SHAPES), SHAPES, row_offsets(SHAPES))
    assert len(packed.rows([1, 2, 3, 4])) == 1  # any lengths: one slice per run of consecutive items
    assert len(packed.rows([3, 4, 0, 2])) == 3


@pytest.mark.parametrize("batch", [[0, 1, 2, 3, 4], [3, 4, 0, 1], [2], [4, 0, 2, 1], [1, 3]])
def test_packed_and_padded_items_give_the_same_rows(batch):
    pv = _padded()
    padded = PixelItems(pv, SHAPES)
    packed = PixelItems(gather_rows(pv, SHAPES, torch.empty(220, 12)), SHAPES, row_offsets(SHAPES))
    want = _real(pv, SHAPES, batch)
    assert torch.equal(torch.cat(padded.rows(batch)), want)
    assert torch.equal(torch.cat(packed.rows(batch)), want)
    assert torch.equal(packed.rows([batch[0]])[0], padded.rows([batch[0]])[0])


def test_cpu_stager_gathers_into_fresh_tensors():
    """On a CPU device nothing is pinned and nothing is reused: a later call cannot overwrite an
    earlier result."""
    stager, pv = RowStager("cpu"), _padded()
    first = stager.upload(pv, SHAPES, torch.bfloat16)
    second = stager.upload(_padded(seed=1), SHAPES, torch.bfloat16)
    assert torch.equal(first, _real(pv, SHAPES).bfloat16()) and not torch.equal(first, second)
    assert stager.info() == {"calls": 2, "host_waits": 0, "grows": 0, "pinned_bytes": 0}


def _encoders(model, **kw):
    """The same model behind a plain GraphedEncoder (padded items, as before) and one that stages."""
    return GraphedEncoder(model, **kw), GraphedEncoder(model, stage_rows=True, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_items_leave_the_encoder_output_bit_identical(dtype, tiny_model):
    """Packed eager on the CPU and replays through the eager stand-in: staged (cast on the host)
    against padded (cast by the encoder), and both against the unchanged packed encoder."""
    model = tiny_model if dtype == torch.float32 else build_model("tiny", dtype=dtype)
    inputs = process_images(_images(), model)
    shapes = [tuple(s) for s in inputs["spatial_shapes"].tolist()]
    assert len(padded_rows(inputs["pixel_values"], shapes, list(range(len(shapes))))) == 2  # the case is what it says
    reference = GraphedEncoder(model).encoder.encode(inputs)  # pack_inputs: the path before staging
    for kw in ({}, {"record": eager_stand_in}):
        plain, staged = _encoders(model, **kw)
        if kw:
            plain.capture()
            staged.capture()
        a, b = plain.encode(inputs), staged.encode(inputs)
        assert staged.adapter.stager.info()["calls"] == 1 and plain.adapter.stager is None
        assert len(a) == len(b) == len(reference) == inputs["pixel_values"].shape[0]
        for x, y, r in zip(a, b, reference):
            assert x.dtype == dtype and torch.equal(x, y)
            if not kw:
                assert torch.equal(x, r)
        if kw:
            assert staged.stats.hits == len(a) and "staging_calls" in staged.stats.as_dict()


def test_staged_items_keep_the_finite_check(tiny_model):
    inputs = process_images(_images(), tiny_model)
    inputs["pixel_values"][1, 5, 0] = float("nan")
    _, staged = _encoders(tiny_model, check_finite=True)
    with pytest.raises(ValueError, match=r"item\(s\) \[1\]"):
        staged.encode(inputs)


def test_process_images_device_cpu_is_the_default():
    images = _images()
    a, b = process_images(images, "tiny"), process_images(images, "tiny", device="cpu")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_image_path_tools_on_the_cpu(tiny_model):
    images = _images()
    row = compare_processors(images, "tiny", "cpu")
    assert row["keys_equal"] and row["shapes_equal"] and row["spatial_shapes_equal"] and row["masks_equal"]
    assert row["max_abs_diff"] == 0.0 and row["max_diff_levels"] == 0.0 and row["items"] == 8
    t = time_processors(images[:1], "tiny", "cpu", repeats=2, warmup=0)
    assert len(t["cpu_ms"]) == len(t["device_ms"]) == 2 and t["cpu_ms_median"] > 0 and t["speedup"] > 0
    genc = GraphedEncoder(tiny_model)
    e = time_encode_sources(genc, process_images(images[2:], tiny_model), repeats=2, warmup=0)
    assert e["outputs_equal"] and e["items"] == 1 and len(e["gpu_ms"]) == len(e["cpu_padded_ms"]) == 2
    assert e["ratio"] > 0 and e["ratio_padded"] > 0
    assert e["staging"] is None  # a CPU encoder stages nothing: the path stays as it was
    staged = GraphedEncoder(tiny_model, stage_rows=True)
    e = time_encode_sources(staged, process_images(images[2:], tiny_model), repeats=2, warmup=0)
    # 2 checks + 2 turns each of cpu and "gpu" (on a CPU device, host input too); none from
    # cpu_padded, which ran unstaged, and staging is back on after it
    assert e["outputs_equal"] and e["staging"]["calls"] == 6 and staged.adapter.stage_rows is True


def test_compare_processors_sees_a_difference(monkeypatch):
    """The parity row is not blind: a shifted device output is reported in uint8 levels."""
    import lfm2vl_lab.measure.image_path as ip

    def shifted(images, model_or_preset, return_row_col_info=False, device=None):
        out = process_images(images, model_or_preset)
        if device is not None:
            out["pixel_values"] = out["pixel_values"] + 3 * 2 / 255  # 3 levels at std 0.5
        return out

    monkeypatch.setattr(ip, "process_images", shifted)
    row = ip.compare_processors(_images()[:1], "tiny", "cpu")
    assert row["max_diff_levels"] == pytest.approx(3.0, abs=1e-3)


# -- CUDA ------------------------------------------------------------------------------------------


def _cuda_model():
    return build_model("tiny", dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("captured,chunk_rows", [(False, None), (True, None), (True, 100)])
def test_staged_equals_device_resident_bit_exactly(captured, chunk_rows):
    """Staged rows (one upload, or pipelined in chunks of rows that cut items apart) give the same
    embeddings as device-resident input, bit for bit."""
    model = _cuda_model()
    genc = GraphedEncoder(model)
    genc.adapter._stager().chunk_rows = chunk_rows
    if captured:
        genc.capture()
    inputs = process_images(_images(), model)
    host = genc.encode(inputs)
    assert genc.adapter.stager.info()["calls"] == 1
    dev = genc.encode(on_device(inputs, "cuda"))
    assert genc.adapter.stager.info()["calls"] == 1  # device input is not staged
    assert genc.adapter.stager._buffers[0].is_pinned()
    assert all(torch.equal(a, b) for a, b in zip(host, dev)) and len(host) == len(dev) == 8


@pytest.mark.gpu
def test_queued_calls_reuse_the_pinned_buffers_without_a_sync():
    """Calls queued back to back behind a busy stream: no stream or device sync (sync debug mode
    raises on one), the pinned buffers are reused (no growth), the third call waits for the first
    one's upload before overwriting its buffer, and every result is right."""
    model = _cuda_model()
    genc = GraphedEncoder(model)
    genc.capture()
    calls = [process_images([synthetic_image(1024, 768, seed=s), synthetic_image(512, 512, seed=s)], model)
             for s in range(4)]
    want = [genc.encode(on_device(x, "cuda")) for x in calls]
    for x in calls[:2]:  # warm: both buffers grown, caches filled
        genc.encode(x)
    torch.cuda.synchronize()
    before = genc.adapter.stager.info()
    torch.cuda._sleep(int(1e9))  # hold the stream: the uploads below stay queued behind it
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [genc.encode(x) for x in calls]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    after = genc.adapter.stager.info()
    assert after["grows"] == before["grows"] and after["calls"] == before["calls"] + 4
    assert after["host_waits"] >= 1
    for g, w in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(g, w))


@pytest.mark.gpu
def test_cuda_processor_matches_the_cpu_one():
    row = compare_processors(_images(), "tiny", "cuda")
    assert row["pixel_values_device"].startswith("cuda")
    assert row["keys_equal"] and row["shapes_equal"] and row["spatial_shapes_equal"] and row["masks_equal"]
    assert row["max_diff_levels"] <= MAX_DIFF_LEVELS, row
    e = time_encode_sources(GraphedEncoder(_cuda_model()), process_images(_images()[2:], "tiny"), repeats=3)
    assert e["outputs_equal"] and e["staging"]["calls"] == 1 + 3 + 3 and e["ratio"] > 0  # check, warm-up, turns
