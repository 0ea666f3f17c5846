"""lab.chat on a checkpoint folder made in the test (``tiny_checkpoint``: the tiny shapes with random
weights, a toy word-level tokenizer, an LFM2-VL chat template): text in and text out on the CPU with
``generate``'s tokens, the same tokens graphed and eager, the stop at the end of the turn, one-line
errors for bad folders, and LFM2VL_CHECKPOINT reaching the notebooks' check and the bench's
provenance. On a GPU: real graphs, ``generate``'s tokens in float32."""

import hashlib
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

import lfm2vl_lab as lab
from lfm2vl_lab.core.capture import eager_stand_in
from lfm2vl_lab.model.presets import CHECKPOINT_ENV, Preset
from lfm2vl_lab.serving.chat import NO_CUDA_NOTE, build_prompt, end_ids, random_weights
from lfm2vl_lab.serving.pipeline import PHASES

PROMPT = "Describe this image."


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return lab.load_model(tiny_checkpoint, dtype=torch.float32)


@pytest.fixture(scope="module")
def photo():
    return lab.load_sample_images()[1]


def decode_calls(counts: dict) -> int:
    """Decode steps among an engine's counted calls, whatever cache span each ran in."""
    return sum(v for k, v in counts.items() if k.startswith("decode 1x"))


def generate_answer(model, photo, new_tokens: int, processor=None) -> list[int]:
    """transformers' ``generate`` (greedy) on the same chat prompt, cut at the first end-of-turn token."""
    proc = processor or model.lab_chat_processor
    ids, inputs = build_prompt(proc, [photo], PROMPT)
    dev, stop = model.device, end_ids(proc.tokenizer)
    out = model.generate(input_ids=ids.to(dev), attention_mask=torch.ones_like(ids).to(dev),
                         pixel_values=inputs["pixel_values"].to(dev, model.dtype),
                         pixel_attention_mask=inputs["pixel_attention_mask"].to(dev),
                         spatial_shapes=inputs["spatial_shapes"], max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=stop, pad_token_id=proc.tokenizer.pad_token_id)
    answer = out[0, ids.shape[1]:].tolist()
    return answer[:next((i for i, t in enumerate(answer) if t in stop), len(answer))]


def test_chat_on_a_checkpoint_answers_with_generates_tokens(model, photo):
    reply = lab.chat(model, [photo], PROMPT, max_new_tokens=12, graphs=False)
    assert reply.token_ids == generate_answer(model, photo, 12)
    assert len(set(reply.token_ids)) > 2  # the toy checkpoint's tokens vary: this compares sequences
    tok = model.lab_chat_processor.tokenizer
    assert reply.text and reply.text == tok.decode(reply.token_ids, skip_special_tokens=True).strip()
    ids, _ = build_prompt(model.lab_chat_processor, [photo], PROMPT)
    assert reply.prompt_tokens == ids.shape[1] and ids[0, 0] == tok.convert_tokens_to_ids("<|startoftext|>")
    assert list(reply.timings_ms) == ["process", *PHASES] and all(v >= 0 for v in reply.timings_ms.values())
    assert not reply.graphs and not reply.stopped  # eager as asked; 12 tokens and no end of turn among them
    # random weights (the tiny shapes): said, with the tokens shown
    assert reply.meaningless and "means nothing" in str(reply) and str(reply.token_ids) in str(reply)
    assert repr(reply) == str(reply)


def test_graphs_on_and_off_give_the_same_tokens(model, photo):
    eager = lab.chat(model, [photo], PROMPT, max_new_tokens=12, graphs=False)
    genc = lab.GraphedEncoder(model, record=eager_stand_in)  # the replay path without a GPU
    genc.capture()
    engine = lab.TextEngine(model, max_batch=1, max_len=512)
    graphed = lab.chat(model, [photo], PROMPT, max_new_tokens=12, genc=genc, engine=engine)
    assert graphed.token_ids == eager.token_ids and graphed.text == eager.text
    assert graphed.encoder_graphed and genc.stats.hits == 1 and genc.stats.eager_calls == 0
    assert not graphed.text_graphed and engine.stats.eager["prefill 1x320"] == 1  # no text graphs on a CPU
    default = lab.chat(model, photo, PROMPT, max_new_tokens=12)  # graphs=True, the model's own encoder and engine
    assert default.token_ids == eager.token_ids and NO_CUDA_NOTE in default.notes and not default.graphs


def test_chat_stops_at_the_end_of_turn_token(model, photo, tiny_checkpoint):
    from transformers import Lfm2VlProcessor

    proc = Lfm2VlProcessor.from_pretrained(tiny_checkpoint, local_files_only=True)
    full = generate_answer(model, photo, 16, proc)
    k = next(i for i in range(2, len(full)) if full[i] not in full[:i])
    proc.tokenizer.eos_token = proc.tokenizer.convert_ids_to_tokens(full[k])  # this token now ends the turn
    assert full[k] in end_ids(proc.tokenizer)
    engine = lab.TextEngine(model, max_batch=1, max_len=512)
    reply = lab.chat(model, photo, PROMPT, max_new_tokens=16, processor=proc, genc=lab.GraphedEncoder(model),
                     engine=engine, check_every=2)
    assert reply.stopped and reply.token_ids == full[:k]
    assert decode_calls(engine.stats.eager) == -(-k // 2) * 2 < 15  # decoding stopped after the chunk with it


def test_a_random_weight_preset_chats_through_the_toy_tokenizer(photo):
    built = lab.build_model("tiny", text_layers="full")
    reply = lab.chat(built, photo, "What is this?", max_new_tokens=3, graphs=False)
    assert reply.meaningless and len(reply.token_ids) <= 3 and "means nothing" in str(reply)
    assert built.lab_chat_processor.tokenizer.convert_tokens_to_ids("<image>") == built.config.image_token_id
    real = Preset.from_name("lfm2-vl-450m")
    assert not random_weights(SimpleNamespace(lab_checkpoint={"name": "LFM2-VL-450M"}, lab_preset=real))
    assert not random_weights(SimpleNamespace(lab_checkpoint={"name": "x"}, lab_preset=None))
    assert random_weights(SimpleNamespace(lab_preset=real))  # built from a preset: random weights
    with pytest.raises(ValueError, match="carries no tokenizer"):
        lab.chat(SimpleNamespace(device=torch.device("cpu")), photo, PROMPT)


def _copy(src, dst, drop=(), **files):
    """``src`` as a new folder: weights linked, ``drop`` left out, ``files`` (name=text) written over."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in drop:
            (dst / f.name).symlink_to(f) if f.suffix == ".safetensors" else shutil.copy(f, dst / f.name)
    for name, text in files.items():
        (dst / name.replace("__", ".")).write_text(text)
    return dst


TEXT_ONLY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                      "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
                      "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def test_bad_folders_give_one_line_errors(tiny_checkpoint, tmp_path, photo):
    def one_line(exc_info):
        assert "\n" not in str(exc_info.value), str(exc_info.value)

    no_tok = lab.load_model(_copy(tiny_checkpoint, tmp_path / "no-tok", drop=(
        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")), dtype=torch.float32)
    assert no_tok.lab_chat_processor is None and no_tok.lab_processor is not None  # the vision path still works
    with pytest.raises(ValueError, match="checkpoint 'no-tok' has no tokenizer") as e:
        lab.chat(no_tok, photo, PROMPT)
    one_line(e)
    text_only = lab.load_model(_copy(tiny_checkpoint, tmp_path / "text-only", chat_template__jinja=TEXT_ONLY_TEMPLATE),
                               dtype=torch.float32)
    with pytest.raises(ValueError, match=r"chat template has no image support: it placed 0 '<image>' for 1") as e:
        lab.chat(text_only, photo, PROMPT)
    one_line(e)
    no_template = lab.load_model(_copy(tiny_checkpoint, tmp_path / "no-template", drop=("chat_template.jinja",)),
                                 dtype=torch.float32)
    with pytest.raises(ValueError, match="has no chat template") as e:
        lab.chat(no_template, photo, PROMPT)
    one_line(e)
    other = _copy(tiny_checkpoint, tmp_path / "llama", config__json=json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="holds a 'llama' checkpoint, not an LFM2-VL one") as e:
        lab.load_model(other)
    one_line(e)


def test_checkpoint_from_env_reaches_model_for_and_the_environment_check(monkeypatch, tiny_checkpoint, tmp_path):
    from lfm2vl_lab.report.notebook import environment_lines

    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    assert lab.checkpoint_from_env() is None and not hasattr(lab.model_for("tiny"), "lab_checkpoint")
    assert not any("checkpoint" in line for line in environment_lines("cpu", {}))
    monkeypatch.setenv(CHECKPOINT_ENV, str(tiny_checkpoint))
    assert lab.checkpoint_from_env() == tiny_checkpoint
    loaded = lab.model_for("lfm2-vl-450m", dtype=torch.float32)  # the checkpoint wins over the preset
    sha = hashlib.sha256((tiny_checkpoint / "config.json").read_bytes()).hexdigest()
    assert loaded.lab_checkpoint == {"name": "LFM2-VL-tiny", "config_sha256": sha}
    lines = environment_lines("cpu", {})
    assert lines[1] == "  model: the checkpoint LFM2-VL-tiny (from LFM2VL_CHECKPOINT) in float32; " \
                       "encoder attention (auto): sdpa_blockmask"
    monkeypatch.setenv(CHECKPOINT_ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"LFM2VL_CHECKPOINT='.*missing' is not a folder"):
        lab.checkpoint_from_env()
    assert "is not a folder" in environment_lines("cpu", {})[2]  # said, not raised, in the first cell


def test_bench_on_a_checkpoint_names_it_in_the_provenance(monkeypatch, tiny_checkpoint):
    from lfm2vl_lab.measure.bench import run_bench

    monkeypatch.setenv(CHECKPOINT_ENV, str(tiny_checkpoint))
    res = run_bench(modes=("hf-eager", "lab-eager"), workloads=("1x256",), repeats=1, warmup=0, device="cpu",
                    progress=False)
    sha = hashlib.sha256((tiny_checkpoint / "config.json").read_bytes()).hexdigest()
    assert res["provenance"]["checkpoint"] == {"name": "LFM2-VL-tiny", "config_sha256": sha}
    assert str(tiny_checkpoint.parent) not in json.dumps(res)  # never a machine path
    assert not res["errors"] and {r["mode"] for r in res["rows"]} == {"hf-eager", "lab-eager"}
    # the parity column judged the lab encoder against transformers on the checkpoint's weights
    assert all(r["max_rel_err_vs_hf"] <= 1e-4 for r in res["rows"])


@pytest.mark.gpu
def test_chat_with_real_graphs_gives_generates_tokens_in_fp32(tiny_checkpoint, photo):
    """On CUDA, float32: chat with the encoder and the text model captured gives ``generate``'s tokens."""
    model = lab.load_model(tiny_checkpoint, dtype=torch.float32, device="cuda")
    want = generate_answer(model, photo, 16)
    first = lab.chat(model, [photo], PROMPT, max_new_tokens=16)
    again = lab.chat(model, [photo], PROMPT, max_new_tokens=16)  # graphs kept on the model: no new capture
    for reply in (first, again):
        assert reply.graphs, str(reply)  # encoder replays and text-engine replays, no eager fallback
        assert reply.token_ids == want, (reply.token_ids, want)
    assert first.setup_ms > 0 and again.setup_ms == 0
    engine = model.__dict__["_lab_chat_graphs"]["engine"]
    assert not engine.stats.eager and decode_calls(engine.stats.replays) >= 2 * (len(want) - 1)
