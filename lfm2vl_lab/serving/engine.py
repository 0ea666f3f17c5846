"""The text model as a serving engine runs it: LFM2's prefill and decode on a preallocated hybrid
cache, eager or under CUDA graphs.

Why: inside transformers' ``generate`` the text model runs eagerly, one kernel launch at a time,
and on the H200 that is mostly launch gaps (the reference set's ``ttft`` file times the text model
eager and graphed). An engine (vLLM) captures
the text model too, so the encoder's saving is measured against a text model that costs its GPU
time only. This module is that text model, built on transformers' own LFM2 modules (their weights,
norms, projections, rotary embedding and MLPs); what it adds is the part graphs need:

* **static buffers**: the prompt's embeddings ``[max_batch, max_len, hidden]``, each request's last
  prompt index, the decode input ids and positions, the logits and the sampled tokens;
* **a hybrid cache allocated once** (:class:`HybridCache`): K and V ``[batch, kv_heads, max_len, d]``
  per attention layer, and per short-conv layer its last ``L_cache - 1`` inputs ``[batch, hidden, L-1]``;
* **shapes from a small set**: a prefill runs right-padded to a multiple of ``LEN_BUCKET`` positions
  and a batch to a size in ``BATCH_BUCKETS``. Right padding is safe because every LFM2 operator is
  causal: a real position never sees a later one, so the padded tail changes nothing before it;
  the conv state is gathered at each request's *real* last positions, and decode masks the cache
  past each request's own position.

Three graphs per batch size: ``prefill`` (per length bucket), ``sample`` (final norm, LM head and
argmax at each request's last position) and ``decode`` (one token for every request, sampled
greedily, fed back through ``ids``/``pos`` so replays chain with no host round trip). A shape that
was not captured runs the same body eagerly and is counted in ``stats.eager``.

The graphs read the text model's weights where they were at capture (:mod:`lfm2vl_lab.core.guard`): when they
move or change dtype, the next ``prompt``/``prefill``/``sample``/``decode`` moves the engine's own
buffers (their contents too, so a request in flight goes on) and captures the same graphs again,
warning once and counting it in ``stats.recaptures``; on a CPU it keeps no graphs.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..core.capture import capture_failed, capture_graph, prepare_capture
from ..core.guard import WeightStamp, change_warning

LEN_BUCKET = 64  # a prefill pads to a multiple of this: at most 63 wasted positions per request
BATCH_BUCKETS = (1, 2, 4, 8)  # vLLM's smallest decode capture sizes
# What a capture that ran out of memory tells the user to do.
OOM_ADVICE = ("Capture fewer shapes, a smaller max_batch or max_len (the cache is allocated up front), "
              "or free GPU memory first (del what you no longer need, then torch.cuda.empty_cache()).")


def lfm2_text_parts(model):
    """transformers' LFM2 text model (``Lfm2Model``) and LM head inside an LFM2-VL model."""
    inner = getattr(model, "model", model)
    return inner.language_model, model.lm_head


def upload(t: torch.Tensor, device) -> torch.Tensor:
    """A small host tensor onto ``device`` without a sync (pinned first on CUDA)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def bucket_len(n: int, bucket: int = LEN_BUCKET) -> int:
    """The prefill length ``n`` positions pad to."""
    return -(-n // bucket) * bucket


def bucket_batch(n: int, buckets=BATCH_BUCKETS) -> int:
    """The captured batch size ``n`` requests run in (ValueError past the largest)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} requests: more than the largest batch bucket {max(buckets)}")


def read_count(name: str, value, minimum: int = 0) -> int:
    """An integer argument (a Python or numpy int, a 0-d integer tensor) of at least ``minimum``."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})") from None
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def read_lengths(lengths) -> list[int]:
    """Prompt lengths, one per request, each >= 1, as ints (``TypeError``/``ValueError`` naming the bad one)."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"lengths must be a list of prompt lengths (one per request), got {type(lengths).__name__}")
    out = [read_count(f"lengths[{i}]", n, 1) for i, n in enumerate(lengths)]
    if not out:
        raise ValueError("lengths is empty: a prefill needs at least one request")
    return out


def check_embeds(embeds, lengths: list[int], hidden: int, max_len: int | None = None) -> torch.Tensor:
    """Prompt embeddings ``[len(lengths), >= max(lengths), hidden]`` of a float dtype (cast on copy)
    and on any device with data (copied to the engine's); host-side checks only."""
    if not isinstance(embeds, torch.Tensor):
        raise TypeError(f"embeds must be a torch.Tensor [requests, length, {hidden}], got {type(embeds).__name__}")
    if embeds.device.type == "meta":
        raise ValueError(f"embeds of shape {tuple(embeds.shape)} is on the meta device: it has no data")
    if not embeds.dtype.is_floating_point:
        raise TypeError(f"embeds must be float embeddings, got dtype {embeds.dtype} (token ids? embed them first)")
    n, longest = len(lengths), max(lengths)
    if embeds.dim() != 3 or embeds.shape[0] != n or embeds.shape[2] != hidden:
        raise ValueError(f"embeds of shape {tuple(embeds.shape)} do not fit {n} request(s) of hidden size {hidden}: "
                         f"expected [{n}, >= {longest}, {hidden}]")
    if embeds.shape[1] < longest:
        raise ValueError(f"embeds hold {embeds.shape[1]} positions but lengths {lengths} ask for {longest}")
    if max_len is not None and embeds.shape[1] > max_len:
        raise ValueError(f"embeds hold {embeds.shape[1]} positions, more than the engine's {max_len} (max_len)")
    return embeds


class HybridCache:
    """LFM2's decode state, allocated once: K/V per attention layer, last conv inputs per conv layer."""

    def __init__(self, lm, batch: int, max_len: int, dtype: torch.dtype, device):
        cfg = lm.config
        self.kernel = cfg.conv_L_cache
        self.k, self.v, self.conv = {}, {}, {}
        for i, layer in enumerate(lm.layers):
            if layer.is_attention_layer:
                a = layer.self_attn
                shape = (batch, cfg.num_key_value_heads, max_len, a.head_dim)
                self.k[i] = torch.zeros(shape, dtype=dtype, device=device)
                self.v[i] = torch.zeros(shape, dtype=dtype, device=device)
            else:
                self.conv[i] = torch.zeros(batch, cfg.hidden_size, self.kernel - 1, dtype=dtype, device=device)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.k, self.v, self.conv) for t in d.values())

    def to(self, device, dtype: torch.dtype) -> None:
        """Move the cache, keeping what it holds."""
        for d in (self.k, self.v, self.conv):
            for i, t in d.items():
                d[i] = t.to(device, dtype)


@dataclass
class EngineStats:
    replays: dict = field(default_factory=dict)  # "prefill B x T" / "sample B" / "decode B" -> count
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
    """

    def __init__(self, model, max_batch: int = max(BATCH_BUCKETS), max_len: int = 2048, len_bucket: int = LEN_BUCKET):
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
        self.conv_offsets = torch.arange(-(k - 2), 1, device=dev)  # the last k-1 positions, ending at `last`
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.stats = EngineStats()
        self.stamp: WeightStamp | None = None  # the text model's weights as the graphs read them
        self.captured: list[tuple] = []  # every capture() call's (shapes, decode, record), for a recapture
        self.warned_change = False
        if self.device.type == "cuda":
            prepare_capture(self.device)

    # -- the model under the graphs -------------------------------------------------------------------
    FLOAT_BUFFERS, INDEX_BUFFERS = ("embeds", "hidden", "logits"), ("last", "ids", "pos", "positions", "conv_offsets")

    def follow_model(self) -> None:
        """Before every call: when the text model's weights moved since capture, move the engine's
        buffers after them and capture the same graphs again (graphs never replay old addresses)."""
        if self.stamp is None or self.stamp.current():
            return
        changes = self.stamp.changes()
        if not changes:
            self.stamp.rearm()
            return
        self.device, self.dtype = self.lm_head.weight.device, self.lm_head.weight.dtype
        for name in self.FLOAT_BUFFERS:
            setattr(self, name, getattr(self, name).to(self.device, self.dtype))
        for name in self.INDEX_BUFFERS:
            setattr(self, name, getattr(self, name).to(self.device))
        self.cache.to(self.device, self.dtype)
        self.graphs, self.pool, self.stamp = {}, None, None
        on_gpu = self.device.type == "cuda" or any(rec is not capture_graph for *_, rec in self.captured)
        said = change_warning(self, "TextEngine: the text model's", changes, on_gpu, "every call runs eagerly")
        if said:
            warnings.warn(said, stacklevel=4)
        if on_gpu:
            for shapes, decode, record in self.captured:
                self.capture(shapes, decode, record)
            self.stats.recaptures += 1

    # -- the bodies (what a graph captures) ----------------------------------------------------------
    def _attn(self, attn, h, cos, sin, i: int, B: int, T: int | None):
        """Self-attention of a prefill (``T`` positions from 0) or of one decode token (``T=None``)."""
        from transformers.models.lfm2.modeling_lfm2 import apply_rotary_pos_emb

        L = h.shape[1]
        q = attn.q_layernorm(attn.q_proj(h).view(B, L, -1, attn.head_dim)).transpose(1, 2)
        k = attn.k_layernorm(attn.k_proj(h).view(B, L, -1, attn.head_dim)).transpose(1, 2)
        v = attn.v_proj(h).view(B, L, -1, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        kc, vc = self.cache.k[i][:B], self.cache.v[i][:B]
        if T is not None:
            kc[:, :, :T].copy_(k)
            vc[:, :, :T].copy_(v)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
        else:  # write this token at each request's own position, attend to positions <= it
            idx = self.pos[:B].view(B, 1, 1, 1).expand(B, k.shape[1], 1, k.shape[3])
            kc.scatter_(2, idx, k)
            vc.scatter_(2, idx, v)
            mask = (self.positions[None, :] <= self.pos[:B, None])[:, None, None, :]
            o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
        return attn.out_proj(o.transpose(1, 2).reshape(B, L, -1))

    def _conv(self, conv, h, i: int, B: int, prefill: bool):
        """LFM2's gated short convolution; the state keeps each request's last ``L_cache - 1`` inputs."""
        b, c, x = conv.in_proj(h).transpose(-1, -2).chunk(3, dim=-2)
        bx = b * x  # [B, hidden, L]
        state, k = self.cache.conv[i][:B], self.cache.kernel
        weight = conv.conv.weight  # [hidden, 1, k]: depthwise, as transformers' causal_conv1d_fn
        if prefill:
            padded = F.pad(bx, (k - 1, 0))  # positions before 0 read as zeros, like the conv's own padding
            idx = (self.last[:B, None] + self.conv_offsets + (k - 1))[:, None, :].expand(B, bx.shape[1], k - 1)
            state.copy_(torch.gather(padded, 2, idx))
            y = F.conv1d(bx, weight, conv.conv.bias, padding=k - 1, groups=bx.shape[1])[..., : bx.shape[-1]]
        else:
            window = torch.cat([state, bx], dim=-1)  # [B, hidden, k]
            y = F.conv1d(window, weight, conv.conv.bias, groups=bx.shape[1])
            state.copy_(window[..., 1:])
        return conv.out_proj((c * y).transpose(-1, -2).contiguous())

    def _layers(self, x, pos_ids, B: int, T: int | None):
        cos, sin = self.lm.rotary_emb(x, pos_ids)
        for i, layer in enumerate(self.lm.layers):
            h = layer.operator_norm(x)
            if layer.is_attention_layer:
                h = self._attn(layer.self_attn, h, cos, sin, i, B, T)
            else:
                h = self._conv(layer.conv, h, i, B, prefill=T is not None)
            x = h + x
            x = x + layer.feed_forward(layer.ffn_norm(x))
        return x

    def _prefill_body(self, B: int, T: int) -> None:
        x = self._layers(self.embeds[:B, :T], self.positions[None, :T], B, T)
        self.hidden[:B].copy_(x[torch.arange(B, device=x.device), self.last[:B]])

    def _sample_body(self, B: int) -> None:
        logits = self.lm_head(self.lm.embedding_norm(self.hidden[:B]))
        self.logits[:B].copy_(logits)
        self.ids[:B].copy_(logits.argmax(-1))
        self.pos[:B].copy_(self.last[:B] + 1)

    def _decode_body(self, B: int) -> None:
        x = self._layers(self.lm.embed_tokens(self.ids[:B])[:, None], self.pos[:B, None], B, None)
        logits = self.lm_head(self.lm.embedding_norm(x[:, 0]))
        self.logits[:B].copy_(logits)
        self.ids[:B].copy_(logits.argmax(-1))
        self.pos[:B].add_(1)

    def _run(self, key: str, body) -> None:
        g = self.graphs.get(key)
        self.stats.count(key, g is not None)
        if g is not None:
            g.replay()
        else:
            body()

    # -- the API ------------------------------------------------------------------------------------
    @torch.no_grad()
    def capture(self, shapes, decode: bool = True, record=capture_graph) -> dict:
        """Capture the graphs for ``shapes``, a list of ``(requests, prompt_len)``: prefill for each
        shape's buckets, then sample and (with ``decode``) decode per batch bucket. All or nothing: if
        one capture fails, none of this call's graphs is kept (earlier calls' stay), the stream and the
        random generator are put back (:func:`lfm2vl_lab.core.capture.capture_failed`) and the error is
        raised (a ``KeyboardInterrupt`` as it is; memory running out as a ``torch.OutOfMemoryError``
        naming the graph and what to do). Returns the keys captured. ``record``:
        :func:`lfm2vl_lab.core.capture.eager_stand_in` runs the same path on a CPU."""
        real = record is capture_graph
        if real and self.device.type != "cuda":
            raise RuntimeError("TextEngine.capture needs a CUDA device; without one every call runs eagerly")
        todo = {}
        for n, length in shapes:
            B, T = self._shape(n, [length])
            todo[f"prefill {B}x{T}"] = (self._prefill_body, B, T)
            todo[f"sample {B}"] = (self._sample_body, B)
            if decode:
                todo[f"decode {B}"] = (self._decode_body, B)
        pool = self.pool if self.pool is not None or not real else torch.cuda.graph_pool_handle()
        new, key, caller = {}, None, torch.cuda.current_stream() if real else None
        saved = [t.clone() for t in (self.last, self.ids, self.pos)]  # warm-up runs write the buffers
        try:
            for key, (body, *args) in todo.items():
                if key not in self.graphs:
                    new[key] = record(lambda body=body, args=args: body(*args), pool=pool)
        except BaseException as exc:  # KeyboardInterrupt too: a stopped cell keeps no graph of the call
            new = {}
            err = capture_failed(exc, f"the text engine's {key!r} graph", caller, cuda=real, advice=OOM_ADVICE)
            if err is exc:
                raise
            raise err from exc
        finally:  # after the repair above, so the copies run on the caller's stream
            for t, s in zip((self.last, self.ids, self.pos), saved):
                t.copy_(s)
        self.graphs.update(new)
        self.pool = pool
        if (list(shapes), decode, record) not in self.captured:
            self.captured.append((list(shapes), decode, record))
        self.stamp = WeightStamp({"language_model": self.lm, "lm_head": self.lm_head})
        return {"captured": sorted(new), "cache_mib": self.cache.nbytes() / 2**20}

    def _shape(self, n: int, lengths) -> tuple[int, int]:
        longest = max(lengths)
        if n < 1 or n > self.max_batch or longest < 1 or bucket_len(longest, self.len_bucket) > self.max_len:
            raise ValueError(f"{n} requests with prompt lengths {list(lengths)}: the engine holds 1..{self.max_batch} "
                             f"requests of 1..{self.max_len} positions (max_batch, max_len)")
        return bucket_batch(n), bucket_len(longest, self.len_bucket)

    def _prefilled(self, what: str) -> None:
        if getattr(self, "n", None) is None:
            raise RuntimeError(f"TextEngine.{what}() before prefill(): there is no prompt to continue")

    def prompt(self, n: int, length: int) -> torch.Tensor:
        """Where ``n`` prompts of up to ``length`` positions are written before :meth:`prefill`."""
        self.follow_model()
        n, length = read_count("n", n), read_count("length", length)
        self._shape(n, [length])
        return self.embeds[:n, :length]

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
        last = torch.tensor(lengths + [lengths[0]] * (B - len(lengths))) - 1  # bucket rows repeat request 0
        self.last[:B].copy_(upload(last, self.device))
        self.n, self.lengths = len(lengths), lengths
        self._run(f"prefill {B}x{T}", lambda: self._prefill_body(B, T))

    @torch.no_grad()
    def sample(self) -> torch.Tensor:
        """The first token of every request (greedy), on the device; the logits stay in ``logits``."""
        self.follow_model()
        self._prefilled("sample")
        B = bucket_batch(self.n)
        self._run(f"sample {B}", lambda: self._sample_body(B))
        return self.ids[: self.n].clone()

    @torch.no_grad()
    def decode(self, steps: int) -> torch.Tensor:
        """``steps`` more tokens per request after :meth:`sample`: ``[n, steps]`` on the device."""
        self.follow_model()
        steps = read_count("steps", steps)
        self._prefilled("decode")
        B, n = bucket_batch(self.n), self.n
        if max(self.lengths) + steps > self.max_len:
            raise ValueError(f"{steps} decode steps after prompts of {self.lengths} positions pass the cache's "
                             f"{self.max_len} positions (max_len)")
        out = torch.empty(n, steps, dtype=torch.long, device=self.device)
        for s in range(steps):
            self._run(f"decode {B}", lambda: self._decode_body(B))
            out[:, s].copy_(self.ids[:n])
        return out
