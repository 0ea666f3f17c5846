"""Text in, text out: one chat turn about images through the :class:`~.pipeline.VlmPipeline`.

>>> model = load_model("~/models/LFM2-VL-450M", device="cuda")   # a folder you fetched yourself
>>> reply = chat(model, [photo], "Describe this image.")         # graphs on: encoder and text model
>>> print(reply)                                                 # the text, its tokens, ms per phase

What :func:`chat` does, in order:

1. **prompt**: the user message (one image item per image, then the text) through the checkpoint's
   own chat template (``apply_chat_template`` of the folder's ``Lfm2VlProcessor``, which
   :func:`~lfm2vl_lab.model.presets.load_model` keeps as ``model.lab_chat_processor``), then the processor over the
   text and the images (tokenizer, and the image processor's tiles and patch rows): phase ``process``;
2. **the pipeline**: ``graphs=True`` runs the graphed encoder and the graphed text engine (captured on
   CUDA the first time, kept on the model; ``setup_ms`` says what capture cost), ``graphs=False``
   transformers' eager encoder and text model; phases ``h2d`` … ``decode`` (:data:`~.pipeline.PHASES`);
3. **greedy decoding** until the tokenizer's end-of-turn token (LFM2: ``<|im_end|>``) or its
   end-of-sequence token: the pipeline decodes in chunks of ``check_every`` steps and stops after
   the chunk that produced one, and the answer is cut at it;
4. **the text**: the answer's tokens decoded, special tokens dropped.

Timings are host wall time (``time.perf_counter``) between phases, with the current stream
synchronized at each phase's end on CUDA (the stream, not the device: a device-wide synchronize would
break another thread's graph capture), so the phases add up to the call's wall time (the syncs cost a few µs).

A model built from a preset has random weights and no tokenizer: ``chat`` then uses the kit's toy
tokenizer (:mod:`lfm2vl_lab.model.toy_processor`) and the reply says that its text means nothing, showing its tokens.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field

import torch

from ..core.graphed_encoder import GraphedEncoder
from ..model.inputs import to_rgb
from .engine import TextEngine
from .pipeline import VlmPipeline

CHAT_MAX_LEN = 4096  # positions the chat's text engine holds (prompt + answer); a longer turn gets a larger one
CHECK_EVERY = 8  # decode steps between two looks for the end-of-turn token
END_OF_TURN = "<|im_end|>"  # LFM2's
MEANINGLESS_NOTE = "random weights, so this text means nothing; its tokens are shown below"
NO_CUDA_NOTE = "no CUDA device: the graphed encoder and text engine ran their bodies eagerly (no graphs)"
_GRAPH_CACHE = "_lab_chat_graphs"  # where a model keeps its chat encoder and engine


@dataclass(repr=False)
class ChatReply:
    """One chat turn's answer: ``text``, its ``token_ids`` (up to, not including, the end-of-turn
    token), the prompt's length in tokens, ms per phase, and whether the graphs replayed."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    timings_ms: dict[str, float]
    encoder_graphed: bool
    text_graphed: bool
    stopped: bool  # True: the model ended its turn; False: max_new_tokens ran out first
    meaningless: bool = False  # random weights: the text means nothing
    notes: list[str] = field(default_factory=list)
    setup_ms: float = 0.0  # graph capture before this call's phases (0 once the graphs exist)

    @property
    def graphs(self) -> bool:
        """Both the encoder and the text model replayed CUDA graphs in this call."""
        return self.encoder_graphed and self.text_graphed

    @property
    def total_ms(self) -> float:
        return sum(self.timings_ms.values())

    def __str__(self) -> str:
        def on(flag: bool) -> str:
            return "on" if flag else "off"

        end = "ended its turn" if self.stopped else "max_new_tokens reached"
        phases = " | ".join(f"{k} {v:.1f}" for k, v in self.timings_ms.items())
        lines = [f"({MEANINGLESS_NOTE}) {self.text}" if self.meaningless else self.text]
        if self.meaningless:
            lines.append(f"-- tokens: {self.token_ids}")
        lines.append(f"-- {len(self.token_ids)} tokens ({end}), prompt {self.prompt_tokens} tokens; "
                     f"graphs: encoder {on(self.encoder_graphed)}, text {on(self.text_graphed)}")
        lines.append(f"-- ms: {phases} | total {self.total_ms:.1f}"
                     + (f" (graph capture before it: {self.setup_ms:.0f})" if self.setup_ms else ""))
        lines += [f"-- note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def random_weights(model) -> bool:
    """Whether ``model`` holds random weights: built from a preset, or loaded from a folder whose
    shapes are a synthetic preset's (``tiny``: no real checkpoint has them)."""
    preset = getattr(model, "lab_preset", None)
    if getattr(model, "lab_checkpoint", None) is None:
        return preset is not None
    return preset is not None and "synthetic" in preset.status.values()


def chat_processor(model):
    """The ``Lfm2VlProcessor`` chat uses for ``model``: its checkpoint's (``lab_chat_processor``), the
    toy one for a random-weight preset, else a one-line ``ValueError`` saying what is missing."""
    proc = getattr(model, "lab_chat_processor", None)
    if proc is not None:
        return proc
    ck = getattr(model, "lab_checkpoint", None)
    if ck is not None:
        raise ValueError(f"checkpoint {ck['name']!r} has no tokenizer (tokenizer.json, tokenizer_config.json): "
                         "chat needs the folder's tokenizer and chat template; fetch the whole model folder")
    if getattr(model, "lab_preset", None) is not None:
        from ..model.toy_processor import toy_processor

        proc = toy_processor(model)
        model.lab_chat_processor = proc
        return proc
    raise ValueError("this model carries no tokenizer: load it with lab.load_model(folder), or pass "
                     "processor= (an Lfm2VlProcessor)")


def end_ids(tokenizer) -> list[int]:
    """The ids that end a turn: the tokenizer's ``<|im_end|>`` and its end-of-sequence token."""
    ids = {tokenizer.eos_token_id}
    if END_OF_TURN in tokenizer.get_vocab():
        ids.add(tokenizer.convert_tokens_to_ids(END_OF_TURN))
    ids.discard(None)
    if not ids:
        raise ValueError(f"the tokenizer has neither {END_OF_TURN!r} nor an end-of-sequence token: "
                         "chat cannot tell where the answer ends")
    return sorted(ids)


def build_prompt(proc, images: list, prompt: str) -> tuple[torch.Tensor, dict]:
    """The prompt's ids ``[1, length]`` and the images' processor output, through ``proc``'s chat
    template; one-line errors for a template that is missing or places no image."""
    if not getattr(proc, "chat_template", None):
        raise ValueError("the checkpoint's processor has no chat template (chat_template.jinja): chat cannot "
                         "build a prompt")
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt}]
    text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=False)
    placed = text.count(proc.image_token)
    if placed != len(images):
        raise ValueError(f"the chat template has no image support: it placed {placed} {proc.image_token!r} "
                         f"for {len(images)} image(s); use the LFM2-VL folder's own chat_template.jinja")
    out = proc(images=[to_rgb(im, i) for i, im in enumerate(images)], text=text, return_tensors="pt")
    inputs = {k: out[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")}
    return out["input_ids"], inputs


_BUILDING = threading.Lock()  # chat_graphs: one thread builds the graphs a model keeps


def chat_graphs(model, prompt_len: int, new_tokens: int) -> tuple[GraphedEncoder, TextEngine, float]:
    """The graphed encoder and text engine chat runs ``model`` with, built once and kept on the model
    (an engine of :data:`CHAT_MAX_LEN` positions, more when the prompt and its answer need them). On
    CUDA they are captured here: the encoder's budgets once, the text model for this prompt's length
    bucket (sample and decode once). Returns them and the ms that capture took (0 when nothing new).
    Two threads' first turns build and capture them once: the second waits for the first."""
    with _BUILDING:
        return _chat_graphs(model, prompt_len, new_tokens)


def _chat_graphs(model, prompt_len: int, new_tokens: int) -> tuple[GraphedEncoder, TextEngine, float]:
    cache = model.__dict__.setdefault(_GRAPH_CACHE, {})
    cuda = model.device.type == "cuda"
    t0, captured = time.perf_counter(), False
    if cache.get("genc") is None:
        cache["genc"] = GraphedEncoder(model)
        if cuda:
            cache["genc"].capture()
            captured = True
    if cache.get("engine") is None or cache["engine"].max_len < prompt_len + new_tokens:
        cache["engine"] = TextEngine(model, max_batch=1, max_len=max(CHAT_MAX_LEN, prompt_len + new_tokens))
    if cuda:
        captured |= bool(cache["engine"].capture([(1, prompt_len)])["captured"])
        torch.cuda.current_stream().synchronize()
    return cache["genc"], cache["engine"], (time.perf_counter() - t0) * 1e3 if captured else 0.0


class _Clock:
    """``mark(phase)``: ms since the previous mark (synchronized on CUDA), in ``ms``."""

    def __init__(self, cuda: bool):
        self.cuda, self.ms, self.t = cuda, {}, time.perf_counter()

    def mark(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        now = time.perf_counter()
        self.ms[phase], self.t = (now - self.t) * 1e3, now


def _graph_counts(genc, engine) -> tuple[int, int]:
    """Calls that ran without a graph so far: encoder (eager calls and misses) and text engine."""
    enc = genc.stats.eager_calls + genc.stats.misses if genc is not None else 0
    return enc, sum(engine.stats.eager.values()) if engine is not None else 0


def chat(model, images, prompt: str, max_new_tokens: int = 64, graphs: bool = True, processor=None,
         genc=None, engine=None, check_every: int = CHECK_EVERY) -> ChatReply:
    """One chat turn: ``images`` (one image or a list: PIL, numpy arrays, file paths) and ``prompt``
    in, the model's greedy answer out, as a :class:`ChatReply` (text, tokens, ms per phase).

    ``graphs=True``: the graphed encoder and text engine (:func:`chat_graphs`, or ``genc``/``engine``
    when given); ``graphs=False``: transformers' eager encoder and text model. ``processor``: an
    ``Lfm2VlProcessor`` instead of the model's own (:func:`chat_processor`). At most
    ``max_new_tokens`` tokens; decoding stops at the end-of-turn token (checked every
    ``check_every`` steps). From several threads at once: one turn at a time on a model's graphs
    (:meth:`VlmPipeline.run`), each thread getting its own answer."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    images = list(images) if isinstance(images, (list, tuple)) else [images]
    if not images:
        raise ValueError("chat needs at least one image")
    cuda = model.device.type == "cuda"
    clock = _Clock(cuda)
    proc = processor if processor is not None else chat_processor(model)
    ids, inputs = build_prompt(proc, images, prompt)
    clock.mark("process")
    setup_ms, notes = 0.0, []
    if graphs and (genc is None or engine is None):
        g, e, setup_ms = chat_graphs(model, ids.shape[1], max_new_tokens)
        genc, engine = genc or g, engine or e
    if not graphs:
        genc = engine = None
    pipe = VlmPipeline(model, "graphed" if graphs else "eager", "graphed" if graphs else "eager",
                       genc=genc, engine=engine)
    before = _graph_counts(genc, engine)
    stop = end_ids(proc.tokenizer)
    clock.t = time.perf_counter()  # graph capture (setup_ms) is no phase of the call
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="GraphedEncoder: no CUDA device")
        tokens = pipe.run(ids, inputs, max_new_tokens, mark=clock.mark, stop_ids=stop, check_every=check_every)
    answer = tokens[0, :max_new_tokens].tolist()
    cut = next((i for i, t in enumerate(answer) if t in stop), None)
    kept = answer if cut is None else answer[:cut]
    after = _graph_counts(genc, engine)
    enc_graphed = graphs and genc.captured and after[0] == before[0]
    text_graphed = graphs and after[1] == before[1]
    if graphs and not cuda:
        notes.append(NO_CUDA_NOTE)
    meaningless = random_weights(model)
    return ChatReply(text=proc.tokenizer.decode(kept, skip_special_tokens=True).strip(), token_ids=kept,
                     prompt_tokens=ids.shape[1], timings_ms=clock.ms, encoder_graphed=bool(enc_graphed),
                     text_graphed=bool(text_graphed), stopped=cut is not None, meaningless=meaningless,
                     notes=notes, setup_ms=setup_ms)
