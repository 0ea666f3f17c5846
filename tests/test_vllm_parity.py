"""Parity with vLLM's own LFM2-VL encoder-graph helpers (VLLM_VERSION of lfm2vl_lab/measure/vllm_release.py).

Skipped where vLLM is not installed. CI runs this file in a separate venv that has it
(see .ci/run). Every comparison uses fresh random inputs; vLLM's methods that only need a
``factor`` or a static helper from ``self`` are called with a minimal stand-in object.

The model folder the kit writes (``lfm2vl_lab.model.folder``) is checked against vLLM's own code: its
model's weight loader (built on the meta device, every preset), its multimodal processor and its
incremental detokenizer.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from lfm2vl_lab.core.config import auto_budgets, auto_max_items, pad_cu_seqlens_repeat_last
from lfm2vl_lab.core.manager import pad_default
from lfm2vl_lab.core.packing import PositionEmbeddingCache, lfm2vl_cu_seqlens, lfm2vl_gather_idx, lfm2vl_pack_pixels
from lfm2vl_lab.core.plan import plan_batches

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


# -- which items replay together: plan_batches beside vLLM's own greedy packing ----------------------------


def vllm_batches(tokens: list[int], budgets: list[int], max_items: int) -> tuple[list, list[int]]:
    """The batches vLLM's manager forms for items of ``tokens`` output tokens: its own
    ``_execute_local`` on a manager built without a GPU (no capture), whose model side only says how
    many tokens each item has and whose graph replay only records what it was asked to run.
    Returns (graph batches with their budget, items run eagerly)."""
    specs = [vllm_graphs.EncoderItemSpec(input_size=4 * t, output_tokens=t) for t in tokens]
    replays, eager = [], []

    def eager_forward(kw):
        eager.extend(kw["items"])
        return torch.zeros(sum(tokens[i] for i in kw["items"]), 1)

    def replay(kw, budget, path="default"):
        replays.append((list(kw["items"]), budget))
        return torch.zeros(budget, 1)

    def postprocess(output, batch, per_item, out, **_):
        out.update((i, output[:1]) for i in batch)

    manager = object.__new__(Manager)
    manager.config = SimpleNamespace(enable_dual_path_graph=False)
    manager.token_budgets, manager.max_batch_size = sorted(budgets), max_items
    manager.graph_hits = manager.graph_misses = 0
    manager.model = SimpleNamespace(get_encoder_cudagraph_item_specs=lambda kw: specs,
                                    select_encoder_cudagraph_items=lambda kw, idx: {"items": list(idx)},
                                    encoder_eager_forward=eager_forward, postprocess_encoder_output=postprocess)
    manager._run_budget_graph = replay
    assert len(manager._execute_local({})) == len(tokens)
    return replays, eager


@pytest.mark.parametrize("seed", range(40))
def test_plan_batches_replays_as_often_as_vllm(seed):
    """The kit packs largest first, vLLM smallest first: both cut one sorted sequence greedily into
    runs under the same two limits (tokens ≤ the largest budget, items ≤ the item limit), so both
    make the fewest such runs: the same number of replays, and the same items left to eager. Where
    every item has the same tokens (a stream of one image size), the batches have the same sizes."""
    rng = random.Random(seed)
    lo, hi = rng.choice([(64, 1024), (64, 4096), (256, 2048), (100, 700)])
    budgets = auto_budgets(lo, hi)
    max_items = rng.choice([auto_max_items(budgets, lo), rng.randint(1, 8)])
    same = seed % 4 == 0
    size = rng.randint(16, hi)
    tokens = [size if same else rng.randint(16, hi + hi // 4) for _ in range(rng.randint(1, 14))]

    replays, vllm_eager = vllm_batches(tokens, budgets, max_items)
    batches, eager = plan_batches(tokens, max(budgets), max_items)

    assert sorted(eager) == sorted(vllm_eager) == sorted(i for i, t in enumerate(tokens) if t > max(budgets))
    assert len(batches) == len(replays), (tokens, max_items, batches, replays)
    assert sorted(i for b in batches for i in b) == sorted(set(range(len(tokens))) - set(eager))
    assert all(sum(tokens[i] for i in b) <= max(budgets) and len(b) <= max_items for b in batches)
    if same:
        assert sorted(map(len, batches)) == sorted(len(b) for b, _ in replays)


# -- the model folder (lfm2vl_lab.model.folder): vLLM's own model, processor and detokenizer read it --------

FOLDER_PRESETS = ("tiny", "lfm2-vl-450m", "lfm2-vl-1.6b", "lfm2-vl-3b")


@pytest.fixture(scope="module")
def vllm_on_cpu():
    """What building vLLM's model needs outside its engine: a platform that picks attention backends
    (on a machine without a GPU the CUDA wheel finds none, so vLLM's CPU platform stands in) and a
    one-process gloo group for its tensor-parallel layers."""
    import socket

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.platforms.cpu import CpuPlatform

    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setattr("vllm.platforms.current_platform", CpuPlatform())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{port}")
            initialize_model_parallel(1, 1)
        yield
        destroy_model_parallel()
        destroy_distributed_environment()


def vllm_model_on_meta(folder):
    """vLLM's ``Lfm2VLForConditionalGeneration`` for the folder's config.json, built on the meta device."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(model_config=ModelConfig(model=str(folder), skip_tokenizer_init=True),
                        device_config=DeviceConfig("cpu"))
    with set_current_vllm_config(config), torch.device("meta"):
        return VllmLfm2(vllm_config=config)


@pytest.mark.parametrize("preset", FOLDER_PRESETS)
def test_the_folders_weights_are_vllms_parameters(preset, tmp_path, vllm_on_cpu):
    """vLLM's own loader (names mapped, q/k/v and w1/w3 stacked, shapes checked) takes every tensor
    the writer would write, and they fill every parameter of vLLM's model: no memory, meta tensors."""
    from lfm2vl_lab import build_model
    from lfm2vl_lab.model.folder import checkpoint_tensors, write_config

    model = build_model(preset, device="meta", text_layers="full")
    write_config(model, tmp_path)
    theirs = vllm_model_on_meta(tmp_path)
    loaded = theirs.load_weights(checkpoint_tensors(model).items())
    assert loaded == {name for name, _ in theirs.named_parameters()}


def test_vllm_refuses_other_names_and_shapes(tmp_path, vllm_on_cpu):
    """The check above can fail: transformers' own layout (no ``vision_model.``) and a wrong shape."""
    from lfm2vl_lab import build_model
    from lfm2vl_lab.model.folder import checkpoint_tensors, write_config

    model = build_model("tiny", device="meta", text_layers="full")
    write_config(model, tmp_path)
    saved = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match="no module or parameter named 'embeddings' in Siglip2Model"):
        vllm_model_on_meta(tmp_path).load_weights(saved.items())
    tensors = checkpoint_tensors(model)
    tensors["model.language_model.layers.0.feed_forward.w1.weight"] = torch.empty(3, 64, device="meta")
    with pytest.raises((AssertionError, ValueError, RuntimeError)):
        vllm_model_on_meta(tmp_path).load_weights(tensors.items())


@pytest.fixture(scope="module")
def thumbnail_folder(tmp_path_factory):
    """The tiny preset written with LFM2-VL-1.6B's image processor (same patches, thumbnail on), so a
    tiled image's prompt holds every kind of image token."""
    from lfm2vl_lab import build_model
    from lfm2vl_lab.model.folder import write_model_folder
    from lfm2vl_lab.model.presets import make_processor

    model = build_model("tiny", text_layers="full")
    model.lab_processor = make_processor("lfm2-vl-1.6b")
    return write_model_folder(model, tmp_path_factory.mktemp("folder") / "tiny-thumbnail")


@pytest.mark.parametrize("size", [(512, 512), (1536, 1024)], ids=["one tile", "tiled"])
def test_vllms_processor_builds_transformers_prompt(thumbnail_folder, size):
    """vLLM's multimodal processor for LFM2-VL, on the folder, expands ``<image>`` into the ids
    transformers' ``Lfm2VlProcessor`` gives for the same chat-template text and image."""
    from transformers import AutoProcessor
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from lfm2vl_lab import synthetic_image

    ours = AutoProcessor.from_pretrained(thumbnail_folder, local_files_only=True)
    theirs = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(thumbnail_folder)))
    image = synthetic_image(*size)
    content = [{"type": "image"}, {"type": "text", "text": "describe this image"}]
    text = ours.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=False)
    want = ours(text=text, images=[image], return_tensors="pt")["input_ids"][0].tolist()
    got = theirs(text, theirs.info.parse_mm_data({"image": [image]}))["prompt_token_ids"]
    assert got == want
    tokens = set(ours.tokenizer.convert_ids_to_tokens(got))
    tiled = {"<|img_thumbnail|>", "<|img_row_1_col_1|>"}
    assert {"<|image_start|>", "<image>", "<|image_end|>"} <= tokens and (tiled <= tokens) == (size != (512, 512))


@pytest.mark.parametrize("skip_special", [True, False])
def test_vllms_detokenizer_reads_the_toy_tokenizer(thumbnail_folder, skip_special):
    """vLLM's incremental detokenizer (the tokenizers library's DecodeStream over the fast tokenizer)
    streams the word-level toy tokenizer's text: ``decode``'s, but for the space before the first
    word (the tokenizer joins words with spaces, the prompt's last one included)."""
    from vllm import SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer, IncrementalDetokenizer

    tok = get_tokenizer(str(thumbnail_folder))
    prompt = tok.apply_chat_template([{"role": "user", "content": "describe this image"}],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
    answer = torch.randint(0, tok.vocab_size, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    request = SimpleNamespace(request_id="r", prompt_token_ids=prompt,
                              sampling_params=SamplingParams(max_tokens=64, skip_special_tokens=skip_special))
    detok = IncrementalDetokenizer.from_new_request(tok, request)
    assert isinstance(detok, FastIncrementalDetokenizer)
    for token in answer:
        detok.update([token], False)
    text = detok.get_next_output_text(True, False)
    assert text == " " + tok.decode(answer, skip_special_tokens=skip_special)


def test_vllm_counts_a_thumbnail_the_450m_processor_does_not_make(tmp_path):
    """Why the ``vllm`` A/B leaves out LFM2-VL-450M's tiled image (``vllm_ab.vllm_cases``): for a tiled
    image vLLM's LFM2-VL processing counts one item more than transformers' processor makes when the
    processor has no thumbnail, so the prompt's placeholders outnumber the encoder's features."""
    from transformers import AutoProcessor
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from lfm2vl_lab import build_model, synthetic_image
    from lfm2vl_lab.model.folder import write_model_folder
    from lfm2vl_lab.model.presets import make_processor

    for preset, thumbnail in (("lfm2-vl-450m", False), ("lfm2-vl-1.6b", True)):
        model = build_model("tiny", text_layers="full")
        model.lab_processor = make_processor(preset)
        folder = write_model_folder(model, tmp_path / preset)
        ours = AutoProcessor.from_pretrained(folder, local_files_only=True)
        info = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(folder))).info
        items = ours.image_processor(images=[synthetic_image(1024, 768)], return_tensors="pt")["pixel_values"]
        counted = info.get_num_patches(image_width=1024, image_height=768, processor=info.get_hf_processor(),
                                       mm_kwargs={})
        assert counted == items.shape[0] + (0 if thumbnail else 1), preset
