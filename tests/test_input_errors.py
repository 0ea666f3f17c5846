"""Every input a user hands the encoders, the pipeline or the text engine either works or is refused
up front with a one-line ``TypeError`` (a type or dtype) or ``ValueError`` (a shape or value) that
names the offending value, never a deep torch error from inside a kernel."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lfm2vl_lab import GraphedEncoder, PackedVisionEncoder, pack_inputs, process_images, random_processor_output
from lfm2vl_lab.core.packing import move_to
from lfm2vl_lab.core.staging import PixelItems
from lfm2vl_lab.serving.engine import TextEngine
from lfm2vl_lab.serving.pipeline import HfText, VlmPipeline

pytestmark = pytest.mark.filterwarnings("ignore:GraphedEncoder. no CUDA device")
SHAPES = [(4, 6), (2, 2)]  # two items of the tiny preset: 1024 padded rows of 768 values each


def raises(exc, fn, *names):
    """``fn()`` raises ``exc`` with a one-line message naming every string of ``names``."""
    with pytest.raises(exc) as e:
        fn()
    msg = str(e.value)
    assert type(e.value) is exc and "\n" not in msg, msg
    for name in names:
        assert name in msg, f"{name!r} not in {msg!r}"


def inputs(**changes) -> dict:
    x = random_processor_output(SHAPES, "tiny")
    for key, change in changes.items():
        x[key] = change(x[key]) if callable(change) else change
    if x.get("pixel_attention_mask", 0) is None:
        del x["pixel_attention_mask"]
    return x


def _mask_one_extra(m):
    m = m.clone()
    m[1, 4] = 1
    return m


# (case, the bad inputs, error type, what the message names)
BAD_INPUTS = [
    ("pixel row width", lambda: inputs(pixel_values=lambda p: p[..., :700]), ValueError, ["700", "768"]),
    ("uint8 pixels", lambda: inputs(pixel_values=lambda p: (p * 127 + 128).to(torch.uint8)), TypeError,
     ["torch.uint8", "normalised"]),
    ("int64 pixels", lambda: inputs(pixel_values=lambda p: p.long()), TypeError, ["torch.int64"]),
    ("bool pixels", lambda: inputs(pixel_values=lambda p: p > 0), TypeError, ["torch.bool"]),
    ("2-D pixels", lambda: inputs(pixel_values=lambda p: p[0]), ValueError, ["(1024, 768)"]),
    ("4-D pixels", lambda: inputs(pixel_values=lambda p: p[None]), ValueError, ["(1, 2, 1024, 768)"]),
    ("numpy pixels", lambda: inputs(pixel_values=lambda p: p.numpy()), TypeError, ["pixel_values", "ndarray"]),
    ("list pixels", lambda: inputs(pixel_values=lambda p: p.tolist()), TypeError, ["pixel_values", "list"]),
    ("float shapes", lambda: inputs(spatial_shapes=lambda s: s.float()), TypeError, ["spatial_shapes", "float32"]),
    ("shapes (2, 3)", lambda: inputs(spatial_shapes=torch.tensor([[4, 6, 1], [2, 2, 1]])), ValueError, ["(2, 3)"]),
    ("1-D shapes", lambda: inputs(spatial_shapes=torch.tensor([4, 6, 2, 2])), ValueError, ["(4,)"]),
    ("3 shapes, 2 items", lambda: inputs(spatial_shapes=torch.tensor([[4, 6], [2, 2], [2, 2]])), ValueError,
     ["2 items", "3"]),
    ("1 shape, 2 items", lambda: inputs(spatial_shapes=torch.tensor([[4, 6]])), ValueError, ["2 items", "1"]),
    ("numpy shapes", lambda: inputs(spatial_shapes=lambda s: s.numpy()), TypeError, ["spatial_shapes", "ndarray"]),
    ("zero side", lambda: inputs(spatial_shapes=torch.tensor([[4, 6], [0, 2]])), ValueError, ["item 1", "0x2"]),
    ("grid past the padded rows", lambda: inputs(pixel_values=lambda p: p[:, :20],
                                                 pixel_attention_mask=lambda m: m[:, :20]),
     ValueError, ["4x6 = 24", "20 per item"]),
    ("odd side", lambda: inputs(spatial_shapes=torch.tensor([[4, 6], [3, 2]]), pixel_attention_mask=None),
     ValueError, ["3x2"]),
    ("mask (2, 5)", lambda: inputs(pixel_attention_mask=torch.ones(2, 5)), ValueError, ["(2, 5)", "(2, 1024)"]),
    ("mask of 1 item", lambda: inputs(pixel_attention_mask=lambda m: m[:1]), ValueError, ["(1, 1024)"]),
    ("numpy mask", lambda: inputs(pixel_attention_mask=lambda m: m.numpy()), TypeError, ["pixel_attention_mask"]),
    ("mask disagrees", lambda: inputs(pixel_attention_mask=_mask_one_extra), ValueError, ["item 1", "5 rows"]),
    ("meta pixels", lambda: inputs(pixel_values=lambda p: p.to("meta")), ValueError, ["pixel_values", "meta"]),
    ("meta shapes", lambda: inputs(spatial_shapes=lambda s: s.to("meta")), ValueError, ["spatial_shapes", "meta"]),
    ("meta mask", lambda: inputs(pixel_attention_mask=lambda m: m.to("meta")), ValueError, ["mask", "meta"]),
    ("empty batch", lambda: inputs(pixel_values=lambda p: p[:0], spatial_shapes=lambda s: s[:0],
                                   pixel_attention_mask=lambda m: m[:0]), ValueError, ["empty", "(0, 1024, 768)"]),
    ("no spatial_shapes", lambda: {"pixel_values": inputs()["pixel_values"]}, ValueError, ["'spatial_shapes'"]),
    ("not a dict", lambda: None, TypeError, ["NoneType"]),
]


@pytest.fixture(scope="module")
def entries(tiny_model):
    """Every public door processor output comes through, by name."""
    genc, enc = GraphedEncoder(tiny_model), PackedVisionEncoder(tiny_model)
    pipe = VlmPipeline(tiny_model, "eager", "eager")
    ids = torch.ones(1, 8, dtype=torch.long)
    return {
        "GraphedEncoder.encode": genc.encode,
        "GraphedEncoder.stage": genc.stage,
        "PackedVisionEncoder.encode": enc.encode,
        "pack_inputs": lambda x: pack_inputs(x, patch_dim=enc.patch_dim),
        "VlmPipeline.run": lambda x: pipe.run(ids, x),
    }


@pytest.mark.parametrize("entry", ["GraphedEncoder.encode", "GraphedEncoder.stage", "PackedVisionEncoder.encode",
                                   "pack_inputs", "VlmPipeline.run"])
@pytest.mark.parametrize("case,bad,exc,names", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_processor_output_is_named(entries, entry, case, bad, exc, names):
    raises(exc, lambda: entries[entry](bad()), *names)


def test_what_is_accepted_gives_the_same_features(tiny_model):
    """Any float dtype, no mask or a bool/float one, and transformers' BatchFeature all work."""
    from transformers import BatchFeature

    genc = GraphedEncoder(tiny_model)
    half = inputs(pixel_values=lambda p: p.half())
    want = genc.encode(inputs(pixel_values=lambda p: p.half().float()))
    variants = [half, inputs(pixel_values=lambda p: p.half().double()), {**half, "pixel_attention_mask": None},
                {**half, "pixel_attention_mask": half["pixel_attention_mask"].bool()}, BatchFeature(half)]
    for x in variants:
        got = genc.encode({k: v for k, v in x.items() if v is not None} if isinstance(x, dict) else x)
        assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(genc.encode(genc.stage(half)), want))


def test_staged_inputs_are_checked(tiny_model):
    genc = GraphedEncoder(tiny_model)
    other = PixelItems(torch.zeros(28, 700), SHAPES, (0, 24, 28))  # staged for a model of another patch size
    raises(ValueError, lambda: genc.encode(other), "700", "768")


def test_images_that_are_not_images(tiny_model):
    raises(TypeError, lambda: process_images([None], tiny_model), "image 0", "NoneType")
    raises(TypeError, lambda: GraphedEncoder(tiny_model).encode(7), "processor's output", "int", "process_images")
    raises(TypeError, lambda: process_images([{"pixel_values": 1}], tiny_model), "dict")
    raises(ValueError, lambda: process_images([], tiny_model), "empty list")
    raises(ValueError, lambda: process_images(np.zeros((4, 4, 2), np.uint8), tiny_model), "(4, 4, 2)")


def test_a_copy_off_a_gpu_waits_for_its_data():
    """move_to queues copies onto a GPU (non_blocking) but not off one: the host would read a
    non_blocking device-to-host copy before it lands (seen here through a tensor that records .to)."""
    calls = []

    class Recorder(torch.Tensor):
        def to(self, *args, **kwargs):
            calls.append((args[0].type, kwargs["non_blocking"]))
            return self

    t = torch.zeros(2).as_subclass(Recorder)
    move_to(t, "cuda")
    move_to(t, torch.device("cpu"))
    assert calls == [("cuda", True), ("cpu", False)]


# -- the pipeline ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(tiny_model):
    return VlmPipeline(tiny_model, "eager", "eager")


def prompt_ids(model, image_tokens: int, text_tokens: int = 4) -> torch.Tensor:
    img = torch.full((image_tokens,), model.config.image_token_id)
    return torch.cat([torch.ones(text_tokens, dtype=torch.long), img])[None]


@pytest.mark.parametrize("ids,exc,names", [
    ([[1, 2, 3]], TypeError, ["input_ids", "list"]),
    (torch.ones(1, 8), TypeError, ["torch.float32"]),
    (torch.ones(1, 8, dtype=torch.bool), TypeError, ["torch.bool"]),
    (torch.ones(1, 1, 8, dtype=torch.long), ValueError, ["(1, 1, 8)"]),
    (torch.ones(1, 0, dtype=torch.long), ValueError, ["(1, 0)", "no tokens"]),
    (torch.tensor([[1, -1, 2]]), ValueError, ["-1", "vocabulary"]),
    (torch.ones(1, 8, dtype=torch.long).to("meta"), ValueError, ["meta"]),
], ids=["list", "float", "bool", "3-D", "empty", "negative id", "meta"])
def test_bad_input_ids_are_named(pipe, ids, exc, names):
    raises(exc, lambda: pipe.run(ids, inputs()), *names)


def test_pipeline_arguments_are_named(tiny_model, pipe):
    vocab = pipe.embed.num_embeddings
    raises(ValueError, lambda: pipe.run(torch.tensor([[1, vocab]]), inputs()), str(vocab), f"0..{vocab - 1}")
    for bad, exc in ((0, ValueError), (-2, ValueError), (2.5, TypeError), ("3", TypeError)):
        raises(exc, lambda bad=bad: pipe.run(prompt_ids(tiny_model, 7), inputs(), bad), "new_tokens", str(bad))
    # the two items give 6 + 1 features
    raises(ValueError, lambda: pipe.run(prompt_ids(tiny_model, 5), inputs()), "5 image tokens", "7 features")
    raises(ValueError, lambda: pipe.run(prompt_ids(tiny_model, 7), inputs(pixel_attention_mask=None)),
           "pixel_attention_mask")


def test_one_dimensional_input_ids_are_one_request(tiny_model, pipe):
    ids = prompt_ids(tiny_model, 7)
    one = pipe.run(ids[0].int(), inputs(), 3)  # [length], int32: one request
    assert one.shape == (1, 3) and torch.equal(one, pipe.run(ids, inputs(), 3))


# -- the text engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_model):
    return TextEngine(tiny_model, max_batch=2, max_len=64)


def test_bad_lengths_are_named(tiny_model, engine):
    H = engine.embeds.shape[-1]
    raises(ValueError, lambda: engine.prefill([]), "lengths is empty")
    raises(ValueError, lambda: engine.prefill([0]), "lengths[0]", "0")
    raises(ValueError, lambda: engine.prefill([5, -1]), "lengths[1]", "-1")
    raises(TypeError, lambda: engine.prefill([2.5]), "lengths[0]", "2.5")
    raises(TypeError, lambda: engine.prefill(5), "lengths", "int")
    raises(TypeError, lambda: engine.prefill("12"), "lengths", "str")
    raises(TypeError, lambda: engine.prompt(1.5, 10), "n", "1.5")
    raises(ValueError, lambda: engine.prompt(3, 10), "3 requests")
    raises(ValueError, lambda: HfText(tiny_model).prefill([4], torch.zeros(1, 4, H + 1)), f"(1, 4, {H + 1})",
           f"hidden size {H}")
    raises(ValueError, lambda: HfText(tiny_model).prefill([0], torch.zeros(1, 4, H)), "lengths[0]", "0")


@pytest.mark.parametrize("embeds,exc,names", [
    (lambda H: torch.zeros(1, 8, H + 3), ValueError, ["(1, 8, {H3})", "hidden size {H}"]),
    (lambda H: torch.zeros(2, 8, H), ValueError, ["(2, 8, {H})", "1 request"]),
    (lambda H: torch.zeros(1, 6, H), ValueError, ["6 positions", "8"]),
    (lambda H: torch.zeros(1, 65, H), ValueError, ["65 positions", "64"]),
    (lambda H: torch.zeros(8, H), ValueError, ["(8, {H})"]),
    (lambda H: torch.zeros(1, 8, H, dtype=torch.long), TypeError, ["torch.int64"]),
    (lambda H: np.zeros((1, 8, H), np.float32), TypeError, ["ndarray"]),
    (lambda H: torch.zeros(1, 8, H, device="meta"), ValueError, ["meta"]),
], ids=["hidden", "requests", "shorter", "past max_len", "2-D", "int", "numpy", "meta"])
def test_bad_embeds_are_named(engine, embeds, exc, names):
    H = engine.embeds.shape[-1]
    raises(exc, lambda: engine.prefill([8], embeds(H)), *(n.format(H=H, H3=H + 3) for n in names))


def test_embeds_of_another_float_dtype_are_cast(engine):
    e = torch.randn(1, 8, engine.embeds.shape[-1])
    engine.prefill([8], e)
    want = engine.sample()
    engine.prefill([8], e.double())
    assert torch.equal(engine.sample(), want)


def test_decode_arguments_and_order(tiny_model):
    eng = TextEngine(tiny_model, max_batch=1, max_len=64)
    raises(RuntimeError, eng.sample, "sample() before prefill()")
    raises(RuntimeError, lambda: eng.decode(1), "decode() before prefill()")
    eng.prefill([4], torch.zeros(1, 4, eng.embeds.shape[-1]))
    eng.sample()
    raises(ValueError, lambda: eng.decode(-1), "steps", "-1")
    raises(TypeError, lambda: eng.decode("2"), "steps", "'2'")
    assert eng.decode(0).shape == (1, 0)


# -- device mix (on a GPU) ------------------------------------------------------------------------


@pytest.mark.gpu
def test_inputs_on_another_device_are_moved(tiny_model):
    """Pixel values on the GPU for a CPU model, and on the host for a GPU model, both work; so do
    prompt embeddings on the GPU for a CPU engine."""
    x = inputs()
    want = GraphedEncoder(tiny_model).encode(x)
    on_gpu = {**x, "pixel_values": x["pixel_values"].cuda(), "pixel_attention_mask": x["pixel_attention_mask"].cuda()}
    for got in (GraphedEncoder(tiny_model).encode(on_gpu), PackedVisionEncoder(tiny_model).encode(on_gpu)):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    cuda_model = copy.deepcopy(tiny_model).cuda()
    for got in (GraphedEncoder(cuda_model).encode(x), PackedVisionEncoder(cuda_model).encode(x)):
        for g, w in zip(got, want):  # fp32 on the GPU against fp32 on the CPU
            assert g.device.type == "cuda" and ((g.cpu() - w).norm() / w.norm()).item() < 1e-3
    eng = TextEngine(tiny_model, max_batch=1, max_len=64)
    e = torch.randn(1, 8, eng.embeds.shape[-1])
    eng.prefill([8], e)
    want_ids = eng.sample()
    eng.prefill([8], e.cuda())
    assert torch.equal(eng.sample(), want_ids)
