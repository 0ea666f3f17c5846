"""The text model as a serving engine runs it: LFM2's prefill and decode on a preallocated hybrid
cache, eager or under CUDA graphs.

Why: inside transformers' ``generate`` the text model runs eagerly, one kernel launch at a time,
and on the H200 that is mostly launch gaps (the reference set's ``ttft`` file times the text model
eager and graphed). An engine (vLLM) captures the text model too, so the encoder's saving is
measured against a text model that costs its GPU time only. This module is that text model, built
on transformers' own LFM2 modules (their weights, norms, projections, rotary embedding and MLPs);
what it adds is the part graphs need:

* **static buffers**: the prompt's embeddings ``[max_batch, max_len, hidden]``, each request's last
  prompt index, the decode input ids and positions, the logits and the sampled tokens;
* **a hybrid cache allocated once** and **shapes from a small set** (:mod:`.cache`): the conv state
  is gathered at each request's *real* last positions, and decode masks the cache past each
  request's own position, so right padding changes nothing;
* **the layers' math** (:mod:`.layers`), unfused, or with ``fuse=True`` compiled by inductor into
  far fewer kernels, captured inside the same graphs.

Three kinds of graph per batch size: ``prefill`` (per length bucket), ``sample`` (final norm, LM head
and argmax at each request's last position) and ``decode`` (one token for every request, sampled
greedily, fed back through ``ids``/``pos`` so replays chain with no host round trip), one per cache
span (:func:`~.cache.decode_spans`): a decode step's attention reads the cache up to the first
captured span past the positions in use, not all ``max_len`` of it, so a long cache costs a short
request nothing. A shape that
was not captured runs the same body eagerly and is counted in ``stats.eager``.

The graphs read the text model's weights where they were at capture (:mod:`lfm2vl_lab.core.guard`): when they
move or change dtype, the next ``prompt``/``prefill``/``sample``/``decode`` moves the engine's own
buffers (their contents too, so a request in flight goes on) and captures the same graphs again,
warning once and counting it in ``stats.recaptures``; on a CPU it keeps no graphs.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import dataclass, field

import torch

from ..core.capture import capture_graph, prepare_capture
from ..core.guard import WeightStamp
from ..core.lifecycle import GraphLifecycle
from ..core.serial import Serial, serialised
from ..kernels.router import decode_linear
from .cache import (
    BATCH_BUCKETS,
    LEN_BUCKET,
    HybridCache,
    bucket_batch,
    bucket_len,
    check_embeds,
    decode_spans,
    read_count,
    read_lengths,
    upload,
)
from .layers import attention_layer, conv_layer, lfm2_text_parts, lm_head, shared_weights

# What a capture that ran out of memory tells the user to do.
OOM_ADVICE = ("Capture fewer shapes, a smaller max_batch or max_len (the cache is allocated up front), "
              "or free GPU memory first (del what you no longer need, then torch.cuda.empty_cache()).")
# How the fused engine compiles its layer functions. The kit captures the graphs itself, so the mode
# leaves CUDA graphs out; ``dynamic=None`` compiles the first shape static and the next ones with
# the sizes that changed symbolic, so a grid of batch and length buckets costs a few compiles, not
# one per bucket.
FUSE_COMPILE = {"backend": "inductor", "fullgraph": True, "dynamic": None}
RECOMPILE_LIMIT = 64  # dynamo's default (8 per function) is fewer than two presets' shapes
PDL_MIN_CAPABILITY = (9, 0)  # programmatic dependent launch: Hopper and later


def pdl_available(device) -> bool:
    """Whether inductor can compile the fused decode step's kernels with programmatic dependent launch on
    ``device``: a GPU of sm90 or later and a torch whose inductor has the setting."""
    import torch._inductor.config as inductor_config

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device) < PDL_MIN_CAPABILITY:
        return False
    return hasattr(inductor_config.triton, "enable_pdl")


@dataclass
class EngineStats:
    replays: dict = field(default_factory=dict)  # "prefill BxT" / "sample B" / "decode BxSPAN" -> count
    eager: dict = field(default_factory=dict)  # the same keys: calls that found no graph (counted fallback)
    recaptures: int = 0  # times the text model's weights moved under the graphs and they were captured again

    def count(self, key: str, graphed: bool) -> None:
        d = self.replays if graphed else self.eager
        d[key] = d.get(key, 0) + 1


class TextEngine:
    """LFM2's text model on static buffers: ``load`` → ``prefill`` → ``sample`` → ``decode``.

    >>> eng = TextEngine(model, max_batch=8, max_len=2048)
    >>> eng.capture([(1, 280)])                 # graphs for 1 request of up to 320 positions
    >>> eng.prompt(1, 280).copy_(prompt_embeds)  # what VlmPipeline.merge does
    >>> eng.prefill([280]); first = eng.sample(); rest = eng.decode(15)

    ``graphs`` are captured only by :meth:`capture` (on CUDA); every other shape runs eagerly and is
    counted. Greedy sampling, as ``generate(do_sample=False)``.

    ``fuse=True``: the same math in far fewer kernels (:mod:`.layers`): shared q/k/v and w1/w3
    weights, and each layer kind's function and the LM head compiled by inductor
    (``FUSE_COMPILE``), once per shape class, at the first :meth:`capture` that needs it; its
    seconds are reported apart from the capture's (``capture()["compile_s"]``). Its linears of at most
    four rows run the Triton GEMV (:mod:`.layers`' "The linears"); ``gemv=False`` keeps torch's (an A/B).

    ``pdl=True`` (fused only; an experiment, off by default): the decode graphs' inductor kernels are
    compiled with programmatic dependent launch, so each may start while the kernel before it ends and
    waits inside for its writes (the prefill graphs keep ordinary launches). With the GEMV's own PDL
    launches (``LFM2VL_GEMV_PDL=1``, :mod:`lfm2vl_lab.kernels.gemv`) it took the 450M decode step from
    0.605 to 0.557 ms, but engines with it replayed other logits in more runs of two requests than without
    it (the probes of 2026-12-04), so it is not the kit's default until that is understood.
    """

    def __init__(self, model, max_batch: int = max(BATCH_BUCKETS), max_len: int = 2048, len_bucket: int = LEN_BUCKET,
                 fuse: bool = False, gemv: bool | None = None, pdl: bool = False):
        if gemv and not fuse:
            raise ValueError(f"gemv={gemv!r} needs fuse=True: the GEMV runs inside the fused engine's compiled layers")
        if pdl and not fuse:
            raise ValueError(f"pdl={pdl!r} needs fuse=True: it is how inductor compiles the fused decode step")
        self.model = model
        self.lm, self.lm_head = lfm2_text_parts(model)
        w = self.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        self.max_batch, self.len_bucket = bucket_batch(max_batch), len_bucket
        self.max_len = bucket_len(max_len, len_bucket)
        b, n, dev = self.max_batch, self.max_len, self.device
        self.cache = HybridCache(self.lm, b, n, self.dtype, dev)
        self.embeds = torch.zeros(b, n, self.lm.config.hidden_size, dtype=self.dtype, device=dev)
        self.last = torch.zeros(b, dtype=torch.long, device=dev)  # each request's last prompt index
        self.ids = torch.zeros(b, dtype=torch.long, device=dev)  # the token each request decodes next
        self.pos = torch.zeros(b, dtype=torch.long, device=dev)  # ... and its position
        self.hidden = torch.zeros(b, self.lm.config.hidden_size, dtype=self.dtype, device=dev)
        self.logits = torch.zeros(b, w.shape[0], dtype=self.dtype, device=dev)
        self.positions = torch.arange(n, device=dev)
        k = self.cache.kernel
        self.conv_offsets = torch.arange(1, k, device=dev)  # a request's last k-1 positions, in the padded input
        self.fuse = bool(fuse)
        if pdl and not pdl_available(dev):
            raise ValueError(f"pdl={pdl!r}: programmatic dependent launch needs a CUDA GPU of sm90 or later and a "
                             f"torch whose inductor has triton.enable_pdl; got {dev}, torch {torch.__version__}")
        self.pdl = bool(pdl)
        self.linear = decode_linear() if fuse and gemv is not False else None
        self.fns = self._layer_functions()
        self.shared = self._shared_weights()
        self.stats = EngineStats()
        # the graphs, their pool and the stamp of the text model's weights as they read them
        self.life = GraphLifecycle("TextEngine: the text model's", "every call runs eagerly", OOM_ADVICE)
        self.captured: list[tuple] = []  # every capture() call's (shapes, decode, record), for a recapture
        # one call at a time, one thread's request at a time: the buffers, the cache and the pool are shared
        self.serial = Serial("TextEngine")
        self._prompt_by = self._prefilled_by = None  # the threads that last called prompt() and prefill()
        if self.device.type == "cuda":
            prepare_capture(self.device)

    def _layer_functions(self) -> tuple:
        """(attention layer, conv layer, LM head): plain, or compiled (one compiled function per
        layer kind, shared by every layer of that kind)."""
        fns = (attention_layer, conv_layer, lm_head)
        if not self.fuse:
            return fns
        return tuple(torch.compile(fn, **FUSE_COMPILE) for fn in fns)

    def _shared_weights(self) -> list[dict]:
        """What each layer's function takes besides the cache: its shared weights, and the linear (a
        router of this engine's own, whose split-K workspaces no other engine's graphs share)."""
        return [{**(shared_weights(layer) if self.fuse else {}), "linear": self.linear} for layer in self.lm.layers]

    # -- the model under the graphs -------------------------------------------------------------------
    FLOAT_BUFFERS, INDEX_BUFFERS = ("embeds", "hidden", "logits"), ("last", "ids", "pos", "positions", "conv_offsets")

    def _stamp(self) -> WeightStamp:
        # the parts through the model, not a method of the engine: the stamp then holds no reference
        # back to the engine (core/lifecycle.py)
        inner = getattr(self.model, "model", None)
        holders = [self.model] + ([inner] if inner is not None else [])
        return WeightStamp(functools.partial(_text_parts, self.model), holders)

    @property
    def graphs(self) -> dict[str, torch.cuda.CUDAGraph]:
        """The captured graphs, by key (``"prefill 1x320"``, ``"sample 1"``, ``"decode 1x384"``)."""
        return self.life.graphs

    @property
    def pool(self):
        return self.life.pool

    @property
    def stamp(self) -> WeightStamp | None:
        return self.life.stamp

    def follow_model(self) -> None:
        """Before every call: when the text model's weights moved since capture, or a part of it was
        replaced, take the parts the model holds now, move the engine's buffers after them and
        capture the same graphs again (graphs never replay old addresses)."""
        if not self.life.current():
            self.life.follow(on_gpu=lambda: self.device.type == "cuda" or any(
                rec is not capture_graph for *_, rec in self.captured), moved=self._move, recapture=self._recapture,
                stats=self.stats, stacklevel=4)

    def _move(self) -> None:
        """Follow the text model: its parts as it holds them now, and the buffers where they are."""
        self.lm, self.lm_head = lfm2_text_parts(self.model)
        self.device, self.dtype = self.lm_head.weight.device, self.lm_head.weight.dtype
        for name in self.FLOAT_BUFFERS:
            setattr(self, name, getattr(self, name).to(self.device, self.dtype))
        for name in self.INDEX_BUFFERS:
            setattr(self, name, getattr(self, name).to(self.device))
        self.cache.to(self.device, self.dtype)
        self.shared = self._shared_weights()  # a move broke the shared storage's views

    def _recapture(self) -> bool:
        for shapes, decode, record in self.captured:
            self.capture(shapes, decode, record)
        return True

    def request(self):
        """One whole request (``prompt`` → ``prefill`` → ``sample`` → ``decode``) for the calling
        thread, as a ``with`` block: another thread's request waits until it ends. Threads that
        share an engine wrap every request in it (``VlmPipeline.run`` and ``chat`` do); outside it,
        the engine belongs to the first thread that starts a request, and others are refused."""
        return self.serial.request(self.device)

    # -- the bodies (what a graph captures) ----------------------------------------------------------
    def _layers(self, x, pos_ids, B: int, span: int | None = None):
        """Every layer; ``span``: a decode step attending over the cache's first ``span`` positions
        (None: a prefill)."""
        cos, sin = self.lm.rotary_emb(x, pos_ids)
        S = span or self.max_len
        if span is None:  # each request's last k-1 real positions, in its input padded by k-1 in front
            conv_idx, mask = self.last[:B, None] + self.conv_offsets, None
        else:
            conv_idx, mask = None, (self.positions[None, :S] <= self.pos[:B, None])[:, None, None, :]
        attn, conv, _ = self.fns
        cache, pos = self.cache, self.pos[:B]
        for i, layer in enumerate(self.lm.layers):
            if layer.is_attention_layer:
                x = attn(layer, x, cos, sin, cache.k[i][:B, :, :S], cache.v[i][:B, :, :S], pos, mask,
                         **self.shared[i])
            else:
                x = conv(layer, x, cache.conv[i][:B], conv_idx, **self.shared[i])
        return x

    def _prefill_body(self, B: int, T: int) -> None:
        x = self.embeds[:B, :T]
        if self.fuse:  # one layout for every layer's input: a strided slice would be compiled apart
            x = x.contiguous()
        x = self._layers(x, self.positions[None, :T], B)
        self.hidden[:B].copy_(x[torch.arange(B, device=x.device), self.last[:B]])

    def _sample_body(self, B: int) -> None:
        logits, ids = self.fns[2](self.lm.embedding_norm, self.lm_head, self.hidden[:B], self.linear)
        self.logits[:B].copy_(logits)
        self.ids[:B].copy_(ids)
        self.pos[:B].copy_(self.last[:B] + 1)

    def _decode_body(self, B: int, S: int) -> None:
        x = self._layers(self.lm.embed_tokens(self.ids[:B])[:, None], self.pos[:B, None], B, span=S)
        logits, ids = self.fns[2](self.lm.embedding_norm, self.lm_head, x[:, 0], self.linear)
        self.logits[:B].copy_(logits)
        self.ids[:B].copy_(ids)
        self.pos[:B].add_(1)

    def _run(self, key: str, body) -> None:
        g = self.graphs.get(key)
        self.stats.count(key, g is not None)
        if g is not None:
            g.replay()
        else:
            with self._compiling():
                body()

    def _pdl_compile(self, key: str):
        """Around a graph's first call, which compiles what it needs: inductor's PDL for a decode graph of
        an engine with ``pdl``."""
        if not (self.pdl and key.startswith("decode")):
            return contextlib.nullcontext()
        import torch._inductor.config as inductor_config

        return inductor_config.patch({"triton.enable_pdl": True})

    def _compiling(self):
        """Around every call of the bodies: room for the fused engine's recompiles."""
        if not self.fuse:
            return contextlib.nullcontext()
        return torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)

    # -- the API ------------------------------------------------------------------------------------
    @serialised(request=False)
    @torch.no_grad()
    def capture(self, shapes, decode: bool = True, record=capture_graph) -> dict:
        """Capture the graphs for ``shapes``, a list of ``(requests, prompt_len)``: prefill for each
        shape's buckets, then sample per batch bucket and (with ``decode``) decode per batch bucket
        and cache span past the prompt (:func:`~.cache.decode_spans`). All or nothing: if
        one capture fails, none of this call's graphs is kept (earlier calls' stay), the stream and the
        random generator are put back (:func:`lfm2vl_lab.core.capture.capture_failed`) and the error is
        raised (a ``KeyboardInterrupt`` as it is; memory running out as a ``torch.OutOfMemoryError``
        naming the graph and what to do). Returns the keys captured, the cache's MiB, and the seconds
        spent compiling (``compile_s``: a fused engine's first call of each body) and capturing
        (``capture_s``). ``record``:
        :func:`lfm2vl_lab.core.capture.eager_stand_in` runs the same path on a CPU."""
        # weights that moved since the last capture: recapture those graphs first, so the stamp taken
        # below never vouches for graphs that read the old storage (chat calls capture every turn)
        self.follow_model()
        real = record is capture_graph
        if real and self.device.type != "cuda":
            raise RuntimeError("TextEngine.capture needs a CUDA device; without one every call runs eagerly")
        todo = {}
        for n, length in shapes:
            B, T = self._shape(n, [length])
            todo[f"prefill {B}x{T}"] = (self._prefill_body, B, T)
            todo[f"sample {B}"] = (self._sample_body, B)
            for S in decode_spans(T, self.max_len) if decode else ():
                todo[f"decode {B}x{S}"] = (self._decode_body, B, S)
        life = self.life
        todo = {k: v for k, v in todo.items() if k not in life.graphs}
        pool = life.pool if life.pool is not None else life.new_pool(real and bool(todo))
        new, key = {}, None
        seconds = {"compile_s": 0.0, "capture_s": 0.0}
        if todo:  # (nothing new: no warm-up, no garbage collection, nothing to put back)
            # The warm-ups run the bodies on the engine's own buffers: they read the index buffers,
            # where a longer request's last position would index past a shorter bucket's prefill (in
            # chat's next, shorter turn: a device-side assert on the H200), so they start at 0; and
            # they write the cache, which a request still held (a recapture mid-request, or a bare
            # prefill's request) goes on reading, so that is kept too. All of it is put back after.
            state = [self.last, self.ids, self.pos]
            if self.serial.owner is not None:
                state += [self.hidden, self.logits, *(t for d in (self.cache.k, self.cache.v, self.cache.conv)
                                                      for t in d.values())]
            saved = [t.clone() for t in state]
            for t in (self.last, self.ids, self.pos):
                t.zero_()
            try:  # all or nothing: a failure (a stopped cell too) keeps no graph of the call
                with life.all_or_nothing(real, lambda: f"the text engine's {key!r} graph", undo=new.clear), \
                        self._compiling():
                    for key, (body, *args) in todo.items():
                        with self._pdl_compile(key):
                            new[key] = self._capture_one(lambda body=body, args=args: body(*args), record, pool,
                                                         seconds)
            finally:  # after the repair above, so the copies run on the caller's stream
                for t, s in zip(state, saved):
                    t.copy_(s)
        life.graphs.update(new)
        life.pool = pool
        if (list(shapes), decode, record) not in self.captured:
            self.captured.append((list(shapes), decode, record))
        life.stamped(self._stamp())
        return {"captured": sorted(new), "cache_mib": self.cache.nbytes() / 2**20, **seconds}

    def _capture_one(self, fn, record, pool, seconds: dict):
        """One graph; a fused engine first runs ``fn`` once, which compiles it (timed apart)."""
        if self.fuse:
            t0 = time.perf_counter()
            fn()
            self._sync()
            seconds["compile_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        graph = record(fn, pool=pool)
        self._sync()
        seconds["capture_s"] += time.perf_counter() - t0
        return graph

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _shape(self, n: int, lengths) -> tuple[int, int]:
        longest = max(lengths)
        if n < 1 or n > self.max_batch or longest < 1 or bucket_len(longest, self.len_bucket) > self.max_len:
            raise ValueError(f"{n} requests with prompt lengths {list(lengths)}: the engine holds 1..{self.max_batch} "
                             f"requests of 1..{self.max_len} positions (max_batch, max_len)")
        return bucket_batch(n), bucket_len(longest, self.len_bucket)

    def _prefilled(self, what: str) -> None:
        if getattr(self, "n", None) is None:
            raise RuntimeError(f"TextEngine.{what}() before prefill(): there is no prompt to continue")
        self.serial.check_request(what, self._prefilled_by)

    @serialised(request=True)
    def prompt(self, n: int, length: int) -> torch.Tensor:
        """Where ``n`` prompts of up to ``length`` positions are written before :meth:`prefill`."""
        self.follow_model()
        n, length = read_count("n", n), read_count("length", length)
        self._shape(n, [length])
        self._prompt_by = threading.get_ident()
        return self.embeds[:n, :length]

    @serialised(request=True)
    @torch.no_grad()
    def prefill(self, lengths, embeds: torch.Tensor | None = None) -> None:
        """Run the prompts in ``embeds[:n]`` (request ``i`` holds ``lengths[i]`` positions) and fill the
        cache; ``embeds``, when not the view :meth:`prompt` gave, is copied in first. The logits come
        from :meth:`sample`. ``embeds`` may have any float dtype and live on any device (it is cast
        and copied); a shape, dtype or length that does not fit is a ``ValueError``/``TypeError``."""
        self.follow_model()
        lengths = read_lengths(lengths)
        B, T = self._shape(len(lengths), lengths)
        if embeds is not None:
            check_embeds(embeds, lengths, self.embeds.shape[-1], self.max_len)
        if embeds is not None and embeds.data_ptr() != self.embeds.data_ptr():
            self.embeds[: embeds.shape[0], : embeds.shape[1]].copy_(embeds)
            self._prompt_by = threading.get_ident()  # the prompt buffer holds this thread's prompt now
        else:  # the prompt is what was written through prompt(): this thread's, or refused
            self.serial.check_request("prefill", self._prompt_by)
        last = torch.tensor(lengths + [lengths[0]] * (B - len(lengths))) - 1  # bucket rows repeat request 0
        self.last[:B].copy_(upload(last, self.device))
        self.n, self.lengths, self._prefilled_by = len(lengths), lengths, threading.get_ident()
        self.decoded = 0  # decode steps since the prompt: where the next token lands, known on the host
        self._run(f"prefill {B}x{T}", lambda: self._prefill_body(B, T))

    @serialised(request=True)
    @torch.no_grad()
    def sample(self) -> torch.Tensor:
        """The first token of every request (greedy), on the device; the logits stay in ``logits``."""
        self.follow_model()
        self._prefilled("sample")
        B = bucket_batch(self.n)
        self._run(f"sample {B}", lambda: self._sample_body(B))
        self.decoded = 0  # the sample put every request back at its prompt's end
        return self.ids[: self.n].clone()

    @serialised(request=True)
    @torch.no_grad()
    def decode(self, steps: int) -> torch.Tensor:
        """``steps`` more tokens per request after :meth:`sample`: ``[n, steps]`` on the device."""
        self.follow_model()
        steps = read_count("steps", steps)
        self._prefilled("decode")
        B, n, done = bucket_batch(self.n), self.n, self.decoded
        if max(self.lengths) + done + steps > self.max_len:
            raise ValueError(f"{steps} decode steps after prompts of {self.lengths} positions and {done} decoded "
                             f"steps pass the cache's {self.max_len} positions (max_len)")
        out = torch.empty(n, steps, dtype=torch.long, device=self.device)
        spans = self._spans(B)
        for s in range(steps):
            # this step writes each request's token at its length + done + s: the first span past the longest
            S = next(x for x in spans if x > max(self.lengths) + done + s)
            self._run(f"decode {B}x{S}", lambda S=S: self._decode_body(B, S))
            out[:, s].copy_(self.ids[:n])
            self.decoded += 1
        return out

    def _spans(self, B: int) -> list[int]:
        """The cache spans a decode of batch bucket ``B`` runs in: those captured for it (every
        capture's ladder ends at ``max_len``), else the ladder past this request's prefill bucket."""
        captured = sorted(int(k.rpartition("x")[2]) for k in self.graphs if k.startswith(f"decode {B}x"))
        return captured or decode_spans(bucket_len(max(self.lengths), self.len_bucket), self.max_len)


def _text_parts(model) -> dict:
    """The text model and LM head the graphs read, as ``model`` holds them now."""
    return dict(zip(("language_model", "lm_head"), lfm2_text_parts(model)))
