"""The text model's peers side by side: how fast LFM2's prefill, first token and decode can run in one
process, and how far each way is from the GPU's memory-bandwidth floor.

Why: the text engine (:class:`~lfm2vl_lab.serving.engine.TextEngine`) is only worth its code if it
beats what a user gets for free. So the same prompt runs through five ways of running the same weights:

* ``generate``: transformers' ``generate`` (greedy) from the prompt's embeddings, eager, as a user
  calls it;
* ``hf-static-compile``: the same with ``cache_implementation="static"``, transformers' own fast path
  (it compiles the decode forward itself where it can: on CUDA). LFM2's cache is hybrid (attention
  K/V and short-conv state); where transformers cannot run it, the mode is recorded with its error;
* ``compile-ro``: ``torch.compile(mode="reduce-overhead")`` of transformers' ``Lfm2Model`` forward
  plus the LM head at the last position (the prefill), and of the engine's own eager decode body on
  its static cache (the decode step): what torch's own graphs make of the same code;
* ``engine``: the text engine, captured as CUDA graphs;
* ``engine-fused``: the engine with fused weights and compiled layer bodies (``fuse=True``).

The prompt is ONE request: a 512 px image and its text, as :func:`.ttft.prompt_for` builds it, turned
into embeddings by the pipeline's merge (transformers' image features at the image tokens). Every
mode is timed in alternating turns (:func:`.timing.time_paired`): prefill + sample is one call that
ends with the first token; decode per token is ``(time of 1 + N tokens - time of 1 token) / N``,
except for ``compile-ro``, whose decode steps run alone from a filled cache (``decode_timing``
says which). Tokens are checked against ``generate``'s, first-token logits against a float32 copy
of the same weights (judged as :func:`.ttft.ttft_parity` does, :func:`~lfm2vl_lab.model.parity.lowp_parity`).
"""

from __future__ import annotations

import copy
import time
import traceback

import torch

from ..model.inputs import process_images
from ..model.parity import lowp_parity
from ..serving import engine as engine_module
from ..serving.cache import decode_spans
from ..serving.engine import TextEngine, bucket_len
from ..serving.layers import lfm2_text_parts
from ..serving.pipeline import HfText, VlmPipeline
from .timing import sync
from .ttft import prompt_for

MODES = ("generate", "hf-static-compile", "compile-ro", "engine", "engine-fused")
ENGINE_MODES = ("engine", "engine-fused")
IMAGE = "1x512"  # the request every mode runs: one 512 px image
TOKENS_COMPARED = 16  # greedy tokens each mode's are matched against generate's
BATCH = 8  # the engines' batched decode
FIRST_CALLS = 3  # untimed calls per callable before timing: compile, graph record, one warm call
# The H200's HBM3e peak (NVIDIA's spec sheet): a decode step must read every weight once.
BANDWIDTH_B_PER_S = 4.8e12
DECODE_BODIES = ("_decode_body", "decode_body")  # the engine's eager decode step, under either name
# Off CUDA the compiling peers trace with dynamo and AOT autograd but generate no code: inductor's
# C++ build of a model takes minutes on a small CPU, and there are no CUDA graphs to capture.
CPU_COMPILE_BACKEND = "aot_eager"
PROMPT_SOURCE = (f"one {IMAGE} request (tools.ttft.prompt_for), its embeddings from VlmPipeline.merge with "
                 "transformers' image features")


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:300] if msg else ''}".rstrip(": ")


def prompt_embeds(model) -> torch.Tensor:
    """The prompt embeddings ``[1, L, hidden]`` of one :data:`IMAGE` request (see :data:`PROMPT_SOURCE`)."""
    images, ids = prompt_for(model, IMAGE, 1)
    pipe = VlmPipeline(model, "eager", "eager")
    with torch.no_grad():
        _, embeds = pipe.merge(ids, pipe.encode(pipe.to_device(process_images(images, model))))
    return embeds.clone()


def bandwidth_floor(model, bandwidth: float = BANDWIDTH_B_PER_S) -> dict:
    """The least time one decode step can take: every weight it reads, read once at ``bandwidth``.

    A step reads the language model's layers, final norm and LM head whole, but one row of the
    embedding table (unless the LM head is tied to it, then the head reads it whole). Shared tensors
    count once. The cache's K/V and conv state are left out (``cache_bytes_left_out`` says why)."""
    lm, head = lfm2_text_parts(model)
    emb = lm.embed_tokens.weight
    tied = emb.data_ptr() == head.weight.data_ptr()
    unique = {p.data_ptr(): p for p in (*lm.parameters(), *head.parameters())}
    if not tied:
        unique.pop(emb.data_ptr(), None)
    weights = sum(p.numel() * p.element_size() for p in unique.values())
    row = 0 if tied else emb.shape[1] * emb.element_size()
    total = weights + row
    return {"param_bytes": total, "weight_bytes": weights, "embedding_row_bytes": row, "tied_lm_head": tied,
            "dtype": str(head.weight.dtype).removeprefix("torch."), "bandwidth_B_per_s": bandwidth,
            "bandwidth_source": "NVIDIA H200 HBM3e peak (spec sheet)", "formula": "param_bytes / bandwidth_B_per_s",
            "floor_ms": total / bandwidth * 1e3,
            "cache_bytes_left_out": "the K/V and conv state a step reads depend on the prompt; weights dominate"}


def first_calls(calls: dict, device) -> dict:
    """Each callable run :data:`FIRST_CALLS` times, untimed by the statistics: wall seconds per call
    (compile and graph recording land in the first ones). ``first_call_s``: the first calls' sum."""
    walls = {}
    for name, fn in calls.items():
        walls[name] = []
        for _ in range(FIRST_CALLS):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            walls[name].append(time.perf_counter() - t0)
    return {"first_call_s": sum(w[0] for w in walls.values()), "compile_s": None, "capture_s": None,
            "calls_s": walls}


class GeneratePeer:
    """``generate`` from the prompt embeddings; ``static``: with transformers' static cache (and its
    own compile of the decode forward, where transformers compiles: CUDA)."""

    decode_from_prefill = True

    def __init__(self, model, embeds, decode_tokens: int, static: bool = False):
        self.model, self.n, self.static, self.prefill_len = model, decode_tokens, static, int(embeds.shape[1])
        self.kw = {"inputs_embeds": embeds, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
        if static:
            self.kw["cache_implementation"] = "static"

    def run(self, tokens: int):
        out = self.model.generate(**self.kw, max_new_tokens=tokens, min_new_tokens=tokens)
        return out[:, -tokens:]  # from embeddings generate returns the new tokens only; the slice holds either way

    def call(self, new: int):
        """The call that ends with ``1 + new`` tokens (``new=0``: prefill and the first token)."""
        return lambda: self.run(1 + new)

    def setup(self, device) -> dict:
        first = first_calls(timed_calls(self), device)
        if self.static:
            first["compiled_by_transformers"] = hasattr(self.model, "_compiled_call")
            if not first["compiled_by_transformers"]:
                first["note"] = "transformers did not compile (it compiles on CUDA): static cache, eager forward"
        return first

    def tokens(self, n: int) -> list[int]:
        return self.run(n)[0].tolist()

    def first_logits(self) -> torch.Tensor:
        out = self.model.generate(**self.kw, max_new_tokens=1, output_logits=True, return_dict_in_generate=True)
        return out.logits[0].to(torch.float32, copy=True)


def decode_body(engine: TextEngine):
    """The engine's eager decode step (one token for every request), whichever name it has."""
    for name in DECODE_BODIES:
        if hasattr(engine, name):
            return getattr(engine, name)
    raise AttributeError(f"TextEngine has no decode body (looked for {', '.join(DECODE_BODIES)})")


class CompileRoPeer:
    """``torch.compile`` of transformers' prefill and of the engine's decode step. On CUDA with
    ``mode="reduce-overhead"`` (inductor and CUDA graphs); elsewhere with :data:`CPU_COMPILE_BACKEND`."""

    decode_from_prefill = False

    def __init__(self, model, embeds, decode_tokens: int):
        cuda = embeds.device.type == "cuda"
        self.options = {"mode": "reduce-overhead"} if cuda else {"backend": CPU_COMPILE_BACKEND}
        self.embeds, self.n, self.prefill_len = embeds, decode_tokens, int(embeds.shape[1])
        lm, head = lfm2_text_parts(model)

        def prefill(e):
            logits = head(lm(inputs_embeds=e, use_cache=False).last_hidden_state[:, -1])
            return logits.argmax(-1), logits

        self.prefill = torch.compile(prefill, **self.options)
        length = embeds.shape[1]
        self.eng = TextEngine(model, max_batch=1, max_len=bucket_len(length) + max(decode_tokens, TOKENS_COMPARED) + 1)
        # the cache spans the engine's decode graphs attend over: each step runs in the engine's
        self.spans = decode_spans(bucket_len(length), self.eng.max_len)
        if cuda:  # at fixed addresses (as transformers' StaticCache does) the graphs write them in place, uncopied
            e, c = self.eng, self.eng.cache
            for t in (*c.k.values(), *c.v.values(), *c.conv.values(), e.ids, e.pos, e.logits, e.positions, e.last):
                torch._dynamo.mark_static_address(t)
        self.step = torch.compile(decode_body(self.eng), **self.options)

    def setup(self, device) -> dict:
        e, length = self.eng, self.embeds.shape[1]
        e.prompt(1, length).copy_(self.embeds)  # the eager engine fills the cache the compiled steps continue
        e.prefill([length])
        e.sample()
        # the state after the prompt, which every timed call and the token check start from: the
        # next token and position, and the conv layers' last inputs (the K/V past the prompt are
        # written before they are read, so they need no reset)
        self.start = (e.ids[:1].clone(), e.pos[:1].clone(), {i: s.clone() for i, s in e.cache.conv.items()})
        skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
        first = first_calls(timed_calls(self), device)
        first["options"] = {k: str(v) for k, v in self.options.items()}
        # reduce-overhead falls back to no CUDA graph for a body it cannot graph; this says so
        first["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - skips
        return first

    def _first(self):
        torch.compiler.cudagraph_mark_step_begin()
        return self.prefill(self.embeds)

    def _decode(self, steps: int) -> torch.Tensor:
        self.eng.ids[:1].copy_(self.start[0])  # back to the state after the prompt: every call decodes alike
        self.eng.pos[:1].copy_(self.start[1])
        for i, s in self.start[2].items():
            self.eng.cache.conv[i].copy_(s)
        out = []
        for s in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            self.step(1, next(x for x in self.spans if x > self.prefill_len + s))
            out.append(self.eng.ids[:1].clone())
        return torch.stack(out, 1)

    def call(self, new: int):
        """``new=0``: the compiled prefill and first token; else ``new`` compiled decode steps alone."""
        return (lambda: self._first()[0]) if new == 0 else (lambda: self._decode(new))

    def tokens(self, n: int) -> list[int]:
        first = int(self._first()[0][0])
        return [first] + (self._decode(n - 1)[0].tolist() if n > 1 else [])

    def first_logits(self) -> torch.Tensor:
        return self._first()[1].to(torch.float32, copy=True)


class EnginePeer:
    """The text engine, captured on CUDA (on a CPU it runs its bodies eagerly); ``fuse``: the fused
    engine (off CUDA compiled with :data:`CPU_COMPILE_BACKEND`)."""

    decode_from_prefill = True

    def __init__(self, model, embeds, decode_tokens: int, fuse: bool = False):
        self.embeds, self.n, self.length = embeds, decode_tokens, int(embeds.shape[1])
        self.prefill_len = bucket_len(self.length)  # the engine pads a prompt to its length bucket
        max_len = bucket_len(self.length) + max(decode_tokens, TOKENS_COMPARED) + 1
        if not fuse:
            self.eng = TextEngine(model, max_batch=BATCH, max_len=max_len)
            return
        options, kept = engine_module.FUSE_COMPILE, dict(engine_module.FUSE_COMPILE)
        if embeds.device.type != "cuda":  # read when the engine wraps its functions, in its constructor
            options["backend"] = CPU_COMPILE_BACKEND
        try:
            self.eng = TextEngine(model, max_batch=BATCH, max_len=max_len, fuse=True)
            self.backend = options["backend"]
        finally:
            options.clear()
            options.update(kept)

    def run(self, new: int, batch: int = 1) -> torch.Tensor:
        e = self.eng
        e.prompt(batch, self.length).copy_(self.embeds)  # where the pipeline's merge writes (broadcast per request)
        e.prefill([self.length] * batch)
        first = e.sample()[:, None]
        return torch.cat([first, e.decode(new)], 1) if new else first

    def call(self, new: int, batch: int = 1):
        return lambda: self.run(new, batch)

    def setup(self, device) -> dict:
        info, wall = {}, None
        if torch.device(device).type == "cuda":
            t0 = time.perf_counter()
            info = dict(self.eng.capture([(1, self.length), (BATCH, self.length)]))
            sync(device)
            wall = time.perf_counter() - t0
        first = first_calls(timed_calls(self), device)
        first.update(compile_s=info.get("compile_s", 0.0 if wall is not None else None),
                     capture_s=info.get("capture_s", wall), capture_wall_s=wall, graphs=info.get("captured", []))
        if wall is None:
            first["note"] = "no CUDA: no graphs, the engine's bodies ran eagerly"
        if getattr(self, "backend", None):
            first["compile_backend"] = self.backend
        return first

    def tokens(self, n: int) -> list[int]:
        return self.run(n - 1)[0].tolist()

    def first_logits(self) -> torch.Tensor:
        self.run(0)
        return self.eng.logits[:1].to(torch.float32, copy=True)


def build_peer(mode: str, model, embeds, decode_tokens: int):
    """The peer object of ``mode`` (one of :data:`MODES`)."""
    if mode in ("generate", "hf-static-compile"):
        return GeneratePeer(model, embeds, decode_tokens, static=mode == "hf-static-compile")
    if mode == "compile-ro":
        return CompileRoPeer(model, embeds, decode_tokens)
    if mode in ENGINE_MODES:
        return EnginePeer(model, embeds, decode_tokens, fuse=mode == "engine-fused")
    raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")


def timed_calls(peer) -> dict:
    """The calls a peer is timed with, by name: ``decode`` (1 + N tokens, or N steps alone) before
    ``prefill`` (the first token); the engines add both for :data:`BATCH` requests."""
    calls = {"decode": peer.call(peer.n), "prefill": peer.call(0)}
    if isinstance(peer, EnginePeer):
        calls.update({f"decode x{BATCH}": peer.call(peer.n, BATCH), f"prefill x{BATCH}": peer.call(0, BATCH)})
    return calls


def matching(tokens: list[int], want: list[int]) -> int:
    """How many leading tokens two greedy sequences share."""
    n = 0
    for a, b in zip(tokens, want):
        if a != b:
            break
        n += 1
    return n


@torch.no_grad()
def references(model, embeds) -> dict:
    """What every mode is judged against: ``generate``'s greedy tokens and first-token logits
    (transformers' own path in the model's dtype) and the first-token logits of a float32 copy of the
    same weights run through transformers' eager text model (the model itself when it is float32)."""
    ref = {}
    gen = GeneratePeer(model, embeds, 1)
    try:
        ref["tokens"], ref["logits"] = gen.tokens(TOKENS_COMPARED), gen.first_logits()
    except Exception as exc:  # recorded: the modes are then judged against float32 alone
        ref["error"] = one_line(exc)
    ref32 = model if model.dtype == torch.float32 else copy.deepcopy(model).float()
    text = HfText(ref32)
    text.prefill([embeds.shape[1]], embeds)
    text.sample()
    ref["fp32_logits"] = text.logits.to(torch.float32, copy=True)
    del text, ref32
    return ref


def judged(peer, ref: dict) -> dict:
    """A peer's first token, its :data:`TOKENS_COMPARED` greedy tokens against ``generate``'s, and its
    first-token logits against float32 (:func:`~lfm2vl_lab.model.parity.lowp_parity`)."""
    tokens, logits, fp32 = peer.tokens(TOKENS_COMPARED), peer.first_logits(), ref["fp32_logits"]
    judge = lowp_parity([logits], [ref.get("logits", fp32)], [fp32])
    return {"first_token": tokens[0], "tokens": tokens,
            "matching_tokens": matching(tokens, ref["tokens"]) if "tokens" in ref else None,
            "rel_err_vs_fp32": judge["rel_err"], "hf_rel_err_vs_fp32": judge["hf_rel_err"] if "logits" in ref else None,
            "logits_ok": judge["pass"], "finite": bool(torch.isfinite(logits).all()),
            "first_token_as_fp32": bool(logits.argmax(-1).item() == fp32.argmax(-1).item())}


def _recover(device) -> None:
    """After a mode failed, put torch's stream and CUDA RNG back in case it failed inside a capture."""
    if torch.device(device).type == "cuda":
        from ..core.capture import recover_from_failed_capture

        try:
            recover_from_failed_capture()
        except Exception:  # the next mode then shows what is still broken
            pass


def set_up(mode: str, model, embeds, decode_tokens: int, ref: dict):
    """Build, set up (first calls: compile, capture) and judge one mode; ``(peer, row)``, or
    ``(None, row with "error")``: a mode that fails is recorded, and the others still run."""
    row = {"preset": model.lab_preset.name, "mode": mode, "requests": 1}
    try:
        peer = build_peer(mode, model, embeds, decode_tokens)
        row["prefill_len"] = peer.prefill_len
        row["first_call"] = peer.setup(model.device)
        row.update(judged(peer, ref))
        return peer, row
    except Exception as exc:
        row.update(error=one_line(exc), traceback=traceback.format_exc(limit=-8))
        _recover(model.device)
        return None, row

