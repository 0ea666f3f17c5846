"""Inputs a user really has: every PIL mode, numpy arrays and file paths → RGB; odd image sizes
end to end; a loaded checkpoint that knows its processor; the position cache in the stats."""

import json
import logging
import types
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from lfm2vl_lab import GraphedEncoder, available_presets, hf_image_features, load_model, max_rel_error, synthetic_image
from lfm2vl_lab.core.packing import tokens_for
from lfm2vl_lab.model.inputs import (
    ALPHA_BACKGROUND,
    image_limits,
    item_image,
    process_images,
    processor_for,
    to_rgb,
)
from lfm2vl_lab.model.presets import Preset, build_config, make_processor

WHITE = np.array(ALPHA_BACKGROUND, dtype=np.uint8)


def rgb_array(w=6, h=4, seed=0) -> np.ndarray:
    return np.asarray(synthetic_image(w, h, seed=seed))


def gray_array(w=6, h=4) -> np.ndarray:
    return ((np.arange(w * h).reshape(h, w) * 9) % 256).astype(np.uint8)


def as_rgb(image) -> np.ndarray:
    out = to_rgb(image)
    assert out.mode == "RGB"
    return np.asarray(out)


# --------------------------------------------------------------------------------------------
# PIL modes
# --------------------------------------------------------------------------------------------


def test_rgb_passes_through_unchanged():
    a = rgb_array()
    assert np.array_equal(as_rgb(Image.fromarray(a)), a)


@pytest.mark.parametrize("mode", ["L", "1"])
def test_greyscale_and_bilevel_become_grey_rgb(mode):
    img = Image.fromarray(gray_array()).convert(mode)
    grey = np.asarray(img.convert("L"))
    assert np.array_equal(as_rgb(img), np.stack([grey] * 3, -1))


def test_palette_image_keeps_its_colours():
    a = rgb_array()
    pal = Image.fromarray(a).quantize(colors=8)
    assert pal.mode == "P" and "transparency" not in pal.info
    assert np.array_equal(as_rgb(pal), np.asarray(pal.convert("RGB")))


def test_cmyk_round_trips_to_the_same_rgb():
    a = rgb_array()
    assert np.array_equal(as_rgb(Image.fromarray(a).convert("CMYK")), a)


@pytest.mark.parametrize("mode", ["I;16", "I"])
def test_16_bit_greyscale_is_scaled_not_clipped(mode):
    g8 = gray_array()
    img = Image.fromarray((g8.astype(np.uint16) * 257).astype(np.uint16 if mode == "I;16" else np.int32))
    assert img.mode == mode
    # PIL's own convert("RGB") would clip everything above 255: a nearly white image.
    assert np.array_equal(as_rgb(img), np.stack([g8] * 3, -1))


def test_float_mode_uses_pils_0_to_255_scale():
    g8 = gray_array()
    img = Image.fromarray(g8.astype(np.float32))
    assert img.mode == "F"
    assert np.array_equal(as_rgb(img), np.stack([g8] * 3, -1))


def test_rgba_is_composited_on_white():
    colour = np.array([200, 40, 10], np.uint8)
    a = np.zeros((2, 3, 4), np.uint8)
    a[..., :3] = colour
    a[0, :, 3] = [0, 128, 255]  # transparent, half, opaque
    out = as_rgb(Image.fromarray(a, "RGBA")).astype(int)
    assert np.array_equal(out[0, 0], WHITE)
    assert np.array_equal(out[0, 2], colour)
    half = WHITE * (1 - 128 / 255) + colour * (128 / 255)
    assert np.abs(out[0, 1] - half).max() <= 1
    assert np.array_equal(out[1, 0], WHITE)  # alpha 0 in the whole second row


@pytest.mark.parametrize("mode", ["LA", "La", "PA", "RGBa"])
def test_other_alpha_modes_are_composited_on_white(mode):
    a = np.zeros((2, 2, 4), np.uint8)
    a[..., :3] = 30
    a[0, 0, 3], a[1, 1, 3] = 0, 255
    if mode == "La":  # PIL's RGBA → La drops the alpha; premultiplied bytes made by hand instead
        img = Image.frombytes("La", (2, 2), bytes([0, 0, 0, 0, 0, 0, 30, 255]))
    else:
        img = Image.fromarray(a, "RGBA").convert(mode)
    out = as_rgb(img)
    assert np.array_equal(out[0, 0], WHITE)
    assert np.array_equal(out[1, 1], [30, 30, 30])


def test_palette_transparency_is_composited_on_white():
    pal = Image.new("P", (2, 1))
    pal.putpalette([255, 0, 0, 0, 0, 255])
    pal.putpixel((1, 0), 1)
    pal.info["transparency"] = 0  # palette entry 0 (red) is see-through
    out = as_rgb(pal)
    assert np.array_equal(out[0, 0], WHITE)
    assert np.array_equal(out[0, 1], [0, 0, 255])


def test_empty_pil_image_is_refused():
    with pytest.raises(ValueError, match="empty 0x0 image"):
        to_rgb(Image.new("RGB", (0, 0)))


# --------------------------------------------------------------------------------------------
# numpy arrays
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["HW", "HW1"])
def test_numpy_greyscale(shape):
    g = gray_array()
    a = g if shape == "HW" else g[..., None]
    assert np.array_equal(as_rgb(a), np.stack([g] * 3, -1))


def test_numpy_rgb_and_a_non_contiguous_view():
    a = rgb_array()
    assert np.array_equal(as_rgb(a), a)
    bgr = a[..., ::-1]
    assert np.array_equal(as_rgb(bgr), np.ascontiguousarray(bgr))


def test_numpy_rgba_is_composited_on_white():
    a = np.concatenate([rgb_array(), np.zeros((4, 6, 1), np.uint8)], -1)
    a[0, 0, 3] = 255
    out = as_rgb(a)
    assert np.array_equal(out[0, 0], a[0, 0, :3])
    assert (out.reshape(-1, 3)[1:] == WHITE).all()


def test_numpy_dtypes_agree_with_uint8():
    a = rgb_array()
    assert np.array_equal(as_rgb(a.astype(np.uint16) * 257), a)
    assert np.array_equal(as_rgb(a.astype(np.float32) / 255), a)
    assert np.array_equal(as_rgb(a.astype(np.float64) / 255), a)
    mask = gray_array() > 100
    assert np.array_equal(as_rgb(mask), np.stack([mask * 255] * 3, -1).astype(np.uint8))


# --------------------------------------------------------------------------------------------
# File paths
# --------------------------------------------------------------------------------------------


def test_paths_as_str_and_pathlib(tmp_path):
    a = rgb_array(8, 5)
    Image.fromarray(a).save(tmp_path / "photo.png")
    assert np.array_equal(as_rgb(tmp_path / "photo.png"), a)
    assert np.array_equal(as_rgb(str(tmp_path / "photo.png")), a)


def test_rgba_png_screenshot_from_disk(tmp_path):
    a = np.zeros((4, 4, 4), np.uint8)
    a[..., 0] = 255
    a[:2, :, 3] = 255  # top half opaque red, bottom half transparent
    Image.fromarray(a, "RGBA").save(tmp_path / "shot.png")
    out = as_rgb(tmp_path / "shot.png")
    assert (out[:2] == [255, 0, 0]).all() and (out[2:] == WHITE).all()


def test_16_bit_png_from_disk(tmp_path):
    g8 = gray_array()
    Image.fromarray(g8.astype(np.uint16) * 257).save(tmp_path / "scan.png")
    assert np.array_equal(as_rgb(tmp_path / "scan.png"), np.stack([g8] * 3, -1))


def test_exif_orientation_is_applied(tmp_path):
    img = synthetic_image(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    img.save(tmp_path / "phone.jpg", exif=exif)
    assert to_rgb(tmp_path / "phone.jpg").size == (20, 40)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.png"
    with pytest.raises(FileNotFoundError, match="nope.png"):
        to_rgb(missing)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        to_rgb("https://example.com/cat.png")


def test_a_file_that_is_not_an_image(tmp_path):
    (tmp_path / "notes.txt").write_text("not pixels")
    with pytest.raises(ValueError, match="notes.txt.*not an image file"):
        to_rgb(tmp_path / "notes.txt")


# --------------------------------------------------------------------------------------------
# Bad inputs: clear errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, exc, words", [
    (np.zeros((4, 4, 2), np.uint8), ValueError, ["(4, 4, 2)", "C in (1, 3, 4)"]),
    (np.zeros((4, 4, 5), np.uint8), ValueError, ["(4, 4, 5)"]),
    (np.zeros((2, 4, 4, 3), np.uint8), ValueError, ["(2, 4, 4, 3)", "list of images"]),
    (np.zeros((3, 8, 8), np.uint8), ValueError, ["(3, 8, 8)", "channels first"]),
    (np.zeros(5, np.uint8), ValueError, ["(5,)"]),
    (np.zeros((0, 4, 3), np.uint8), ValueError, ["empty", "(0, 4, 3)"]),
    (np.zeros((4, 4), np.int64), TypeError, ["int64"]),
    (np.full((4, 4), 2.0), ValueError, ["[0, 1]", "2"]),
    (np.full((4, 4), np.nan, np.float32), ValueError, ["NaN"]),
    (42, TypeError, ["int"]),
    (None, TypeError, ["NoneType"]),
    (torch.zeros(3, 8, 8), TypeError, ["Tensor", "permute"]),
])
def test_bad_inputs_name_the_problem(bad, exc, words):
    with pytest.raises(exc) as e:
        to_rgb(bad)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_errors_name_the_image_index():
    with pytest.raises(ValueError, match=r"^image 2: .*\(4, 4, 2\)"):
        process_images([rgb_array(), gray_array(), np.zeros((4, 4, 2), np.uint8)], "tiny")
    with pytest.raises(ValueError, match="empty list"):
        process_images([], "tiny")


# --------------------------------------------------------------------------------------------
# Through the processor
# --------------------------------------------------------------------------------------------


def test_every_form_gives_the_same_processor_output_as_its_rgb_twin(tmp_path):
    g = np.asarray(synthetic_image(300, 200, seed=2).convert("L"))
    twin = process_images(Image.fromarray(np.stack([g] * 3, -1)), "tiny")
    Image.fromarray(g).save(tmp_path / "g.png")
    for form in (Image.fromarray(g), g, g[..., None], g.astype(np.float32) / 255, (g.astype(np.uint16) * 257),
                 Image.fromarray(g.astype(np.uint16) * 257), tmp_path / "g.png"):
        out = process_images(form, "tiny")
        for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):
            assert torch.equal(out[key], twin[key]), (type(form), key)


def test_a_tiny_image_is_read_channels_last():
    # A 3x3 array is (3, 3, 3) either way round; transformers would guess channels-first and mix
    # rows into colours. Pure red must come out pure red.
    red = np.zeros((3, 3, 3), np.uint8)
    red[..., 0] = 255
    out = item_image(process_images(red, "tiny"), 0, "tiny")
    assert np.allclose(out.reshape(-1, 3).mean(0), [1, 0, 0], atol=1e-6)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_1x1_image_gives_no_ambiguous_channel_warning():
    from transformers.utils import logging as hf_logging

    logger, handler = logging.getLogger("transformers"), _Records()
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    logger.addHandler(handler)
    try:
        dot = Image.new("RGB", (1, 1), (10, 200, 30))
        make_processor("tiny")(images=[dot], return_tensors="pt")  # the control: transformers alone warns
        assert any("ambiguous" in m for m in handler.messages), handler.messages
        handler.messages.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = process_images([dot, np.array(dot)], "tiny")
        assert not [m for m in handler.messages if "ambiguous" in m]
        assert not [w for w in caught if "ambiguous" in str(w.message) or "writable" in str(w.message)]
    finally:
        logger.removeHandler(handler)
        hf_logging.set_verbosity(level)
    assert out["spatial_shapes"].tolist() == [[16, 16], [16, 16]]
    assert np.allclose(item_image(out, 0, "tiny")[0, 0], [10 / 255, 200 / 255, 30 / 255], atol=1e-6)


# --------------------------------------------------------------------------------------------
# Odd sizes end to end (all passed on the H200; here on the CPU with the tiny preset)
# --------------------------------------------------------------------------------------------

ODD_SIZES = [(2000, 300), (300, 2000), (64, 64), (33, 517), (4000, 4000), (1, 1), (16, 4000)]


@pytest.fixture(scope="module")
def tiny_graphed(tiny_model):
    return GraphedEncoder(tiny_model)


@pytest.mark.parametrize("w, h", ODD_SIZES)
def test_odd_sizes_encode_like_transformers(tiny_model, tiny_graphed, w, h):
    # Smooth content at any size without drawing millions of random numbers.
    img = synthetic_image(64, 64, seed=w + h).resize((w, h), Image.BILINEAR)
    inputs = process_images(img, tiny_model, return_row_col_info=True)
    rows, cols = inputs["image_rows"][0], inputs["image_cols"][0]
    assert len(inputs["spatial_shapes"]) == rows * cols  # tiny: tiles only, no thumbnail
    lim = image_limits(tiny_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no CUDA device, so encode() runs the packed eager encoder"
        feats = tiny_graphed.encode(process_images(img, tiny_model))
    f = lim.downsample_factor
    tokens = [(hh // f) * (ww // f) for hh, ww in inputs["spatial_shapes"].tolist()]
    assert [t.shape[0] for t in feats] == tokens
    assert all(lim.min_item_tokens <= t <= lim.max_item_tokens for t in tokens)
    assert all(torch.isfinite(t).all() for t in feats)
    assert max_rel_error(feats, hf_image_features(tiny_model, inputs)) <= 1e-4


# --------------------------------------------------------------------------------------------
# Which processor: presets, built models, loaded checkpoints
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", available_presets())
def test_image_limits_of_a_preset_are_its_processors(name):
    p = Preset.from_name(name)
    lim = image_limits(name)
    assert (lim.patch_size, lim.downsample_factor, lim.min_item_tokens, lim.max_item_tokens, lim.max_num_patches) == (
        p.patch_size, p.downsample_factor, p.min_image_tokens, p.max_image_tokens, p.max_num_patches)


def test_processor_for_accepts_presets_models_and_processors(tiny_model):
    proc = make_processor("tiny")
    assert processor_for(proc) is proc
    assert processor_for(types.SimpleNamespace(image_processor=proc)) is proc  # a full Lfm2VlProcessor
    for source in ("tiny", Preset.from_name("tiny"), tiny_model):
        assert processor_for(source).to_dict() == proc.to_dict()


def test_a_model_without_a_processor_says_so():
    from transformers import Lfm2VlForConditionalGeneration

    bare = Lfm2VlForConditionalGeneration(build_config("tiny")).eval()
    with pytest.raises(ValueError, match="no image processor.*preprocessor_config.json"):
        process_images(synthetic_image(32, 32), bare)
    # The encoder itself still works, with transformers' default processor limits.
    genc = GraphedEncoder(bare)
    assert (genc.encoder.max_num_patches, min(genc.config.budgets)) == (1024, 64)


def _save(model, folder, processor=None):
    model.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)
    return folder


def test_load_model_uses_the_folders_processor(tmp_path, tiny_model):
    _save(tiny_model, tmp_path, make_processor("tiny"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the folder has everything: nothing to warn about
        loaded = load_model(tmp_path, dtype=torch.float32)
    assert loaded.lab_processor.to_dict() == make_processor("tiny").to_dict()
    assert loaded.lab_preset.name == "tiny"
    images = [synthetic_image(700, 300, seed=1), Image.new("LA", (40, 90), (90, 200))]
    inputs = process_images(images, loaded)
    ref_inputs = process_images(images, "tiny")
    assert all(torch.equal(inputs[k], ref_inputs[k]) for k in ref_inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no CUDA: packed eager"
        ours = GraphedEncoder(loaded).encode(process_images(images, loaded))
        ref = GraphedEncoder(tiny_model).encode(process_images(images, tiny_model))
    assert len(ours) == len(ref) and all(torch.equal(a, b) for a, b in zip(ours, ref))
    assert max_rel_error(ours, hf_image_features(loaded, inputs)) <= 1e-4


def test_load_model_processor_settings_win_over_the_preset(tmp_path, tiny_model):
    # A checkpoint whose processor differs from the preset (e.g. a smaller minimum: the
    # LFM2.5-VL-450M card says 32 tokens): its own settings are the ones used.
    own = make_processor("tiny")
    own.min_image_tokens, own.max_image_tokens = 32, 128
    _save(tiny_model, tmp_path, own)
    loaded = load_model(tmp_path, dtype=torch.float32)
    lim = image_limits(loaded)
    assert (lim.min_item_tokens, lim.max_item_tokens) == (32, 128)
    genc = GraphedEncoder(loaded)
    assert min(genc.config.budgets) == 32
    img = synthetic_image(512, 512)

    def tokens(inputs):
        return [tokens_for(s) for s in inputs["spatial_shapes"].tolist()]

    assert tokens(process_images(img, "tiny")) == [256]
    (ours,) = tokens(process_images(img, loaded))
    assert 32 <= ours <= 128


def test_load_model_without_processor_file_finds_the_matching_preset(tmp_path, tiny_model):
    _save(tiny_model, tmp_path)
    with pytest.warns(UserWarning, match="no preprocessor_config.json.*'tiny'"):
        loaded = load_model(tmp_path, dtype=torch.float32)
    assert loaded.lab_processor.to_dict() == make_processor("tiny").to_dict() and loaded.lab_preset.name == "tiny"
    img = synthetic_image(300, 300, seed=4)
    assert torch.equal(process_images(img, loaded)["pixel_values"], process_images(img, "tiny")["pixel_values"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = GraphedEncoder(loaded).encode(process_images(img, loaded))
    assert max_rel_error(ours, GraphedEncoder(tiny_model).encode(process_images(img, "tiny"))) == 0


def test_load_model_with_no_processor_and_no_matching_preset(tmp_path):
    from transformers import Lfm2VlForConditionalGeneration

    cfg = build_config("tiny")
    cfg.projector_hidden_size = 48  # no shipped preset has this projector
    _save(Lfm2VlForConditionalGeneration(cfg), tmp_path)
    with pytest.warns(UserWarning, match="no preset matches"):
        loaded = load_model(tmp_path, dtype=torch.float32)
    assert not hasattr(loaded, "lab_preset") and loaded.lab_processor is None
    with pytest.raises(ValueError, match="no image processor"):
        process_images(synthetic_image(32, 32), loaded)


def test_load_model_refuses_a_processor_that_does_not_fit_the_model(tmp_path, tiny_model):
    _save(tiny_model, tmp_path, make_processor("tiny"))
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), encoder_patch_size=14)))
    with pytest.raises(ValueError, match="patch size is 14 but the model's is 16"):
        load_model(tmp_path, dtype=torch.float32)


# --------------------------------------------------------------------------------------------
# The position-embedding cache in GraphedEncoder's stats
# --------------------------------------------------------------------------------------------


def test_stats_report_the_position_cache(tiny_model):
    from lfm2vl_lab.measure.workloads import random_processor_output

    genc = GraphedEncoder(tiny_model)
    cache = genc.encoder.pos_cache
    c = tiny_model.config.vision_config.hidden_size

    def entry(h, w):  # bytes of one fp32 resized grid
        return h * w * c * 4

    cache.max_bytes = entry(16, 16) + entry(8, 8)
    shapes = [(16, 16), (8, 8), (16, 16), (6, 8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        genc.encode(random_processor_output(shapes[:3]))
        d = genc.stats.as_dict()
        assert (d["pos_cache_entries"], d["pos_cache_bytes"], d["pos_cache_evictions"]) == (2, cache.max_bytes, 0)
        assert (d["pos_cache_hits"], d["pos_cache_misses"]) == (1, 2)
        genc.encode(random_processor_output(shapes[3:]))  # (6, 8) pushes out the least recent: (8, 8)
    genc.reset_stats()  # resets the replay counters, keeps reporting the cache
    d = genc.stats.as_dict()
    assert d["eager_calls"] == 0
    got = (d["pos_cache_entries"], d["pos_cache_bytes"], d["pos_cache_evictions"])
    assert got == (2, entry(16, 16) + entry(6, 8), 1)
    assert d["pos_cache_bytes"] <= d["pos_cache_max_bytes"] == cache.max_bytes
