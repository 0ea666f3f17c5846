"""The text engine's memory and its shapes: the hybrid cache allocated once, the buckets a request
is padded to, and the checks its inputs pass before any kernel runs.

A CUDA graph replays fixed addresses and fixed shapes, so an engine that graphs the text model owns
its memory up front and runs every request in one of a few shapes:

* **the hybrid cache** (:class:`HybridCache`): K and V ``[batch, kv_heads, max_len, d]`` per
  attention layer, and per short-conv layer its last ``L_cache - 1`` inputs ``[batch, hidden, L-1]``;
* **the buckets**: a prefill runs right-padded to a multiple of ``LEN_BUCKET`` positions, a batch
  at a size in ``BATCH_BUCKETS``, and a decode step's attention over one of a few cache spans
  (:func:`decode_spans`). Right padding is safe because every LFM2 operator is causal: a real
  position never sees a later one, so the padded tail changes nothing before it.
"""

from __future__ import annotations

import operator

import torch

LEN_BUCKET = 64  # a prefill pads to a multiple of this: at most 63 wasted positions per request
BATCH_BUCKETS = (1, 2, 4, 8)  # vLLM's smallest decode capture sizes
# A decode step's attention reads the cache up to a span, not all of max_len: the first span past a
# prefill bucket is a multiple of this, the next ones double, the last is max_len (decode_spans).
DECODE_SPAN = 128


def upload(t: torch.Tensor, device) -> torch.Tensor:
    """A small host tensor onto ``device`` without a sync (pinned first on CUDA)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def bucket_len(n: int, bucket: int = LEN_BUCKET) -> int:
    """The prefill length ``n`` positions pad to."""
    return -(-n // bucket) * bucket


def decode_spans(prompt_len: int, max_len: int, step: int = DECODE_SPAN) -> list[int]:
    """The cache spans a decode after a prompt of ``prompt_len`` positions attends over, one graph
    each: the first multiple of ``step`` past the prompt, then doubling, capped at ``max_len`` (always
    the last). A token at position ``p`` runs in the first span above ``p``, so attention reads at
    most twice the positions in use, where a single graph over ``max_len`` would read all of them."""
    spans, s = [], min(bucket_len(prompt_len + 1, step), max_len)
    while s < max_len:
        spans.append(s)
        s = min(2 * s, max_len)
    return spans + [max_len]


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
