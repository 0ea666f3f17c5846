"""From a processed request to its tokens, the way a serving engine runs LFM2-VL, in named phases.

``generate`` does this in one call; an engine does it as steps it can schedule and graph, and so
does :class:`VlmPipeline`:

1. ``h2d``      the processor's (CPU) output onto the GPU
2. ``encoder``  image features: transformers' eager path, or the
   :class:`~lfm2vl_lab.core.graphed_encoder.GraphedEncoder`
3. ``merge``    token embeddings with the image features written at the image-token positions
4. ``prefill``  the text model over the prompt
5. ``sample``   the first token (greedy: final norm, LM head, argmax at the last position)
6. ``decode``   the rest, one token per step

Each of the two models has two modes: ``encoder_mode`` "eager" (transformers' ``get_image_features``,
fed the padded float32 pixels the way transformers moves them) or "graphed" (the graphed encoder,
fed only the real rows); ``text_mode`` "eager" (transformers' ``Lfm2Model`` with its own
``DynamicCache``: :class:`HfText`) or "graphed" (:class:`~.engine.TextEngine` after ``capture``).

The pipeline knows nothing about timing: ``run(..., mark=fn)`` calls ``mark(phase)`` after each
phase, which is where the instrument (:mod:`lfm2vl_lab.measure.ttft`) records its CUDA events.
"""

from __future__ import annotations

import threading

import torch

from ..core.encoder import lfm2vl_parts
from ..core.packing import lfm2vl_check_shapes, lfm2vl_read_inputs
from ..core.serial import Serial, serialised
from ..model.hf import hf_image_features
from ..model.inputs import image_limits
from .cache import check_embeds, read_count, read_lengths, upload
from .engine import TextEngine
from .layers import lfm2_text_parts

MODES = ("eager", "graphed")
PHASES = ("h2d", "encoder", "merge", "prefill", "sample", "decode")


class HfText:
    """transformers' own LFM2 text model, eager, with its ``DynamicCache``: ``text_mode="eager"``.

    The same interface as :class:`~.engine.TextEngine` (``prompt``, ``prefill``, ``sample``,
    ``decode``), and the same greedy choice ``generate(do_sample=False)`` makes. Every request of a
    batch must have the same length (``generate`` would pad them; this reference does not)."""

    def __init__(self, model):
        self.model, self.stats = model, None
        self.serial = Serial("HfText")  # its cache and last token are one request's, as a TextEngine's
        self._prefilled_by = None

    @property
    def lm(self):  # the parts the model holds now (a replaced text model is the one that runs)
        return lfm2_text_parts(self.model)[0]

    @property
    def lm_head(self):
        return lfm2_text_parts(self.model)[1]

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def request(self):
        """One whole request for the calling thread (:meth:`~.engine.TextEngine.request`)."""
        return self.serial.request(self.device)

    def prompt(self, n: int, length: int) -> torch.Tensor:
        return torch.empty(n, length, self.lm.config.hidden_size, dtype=self.dtype, device=self.device)

    @serialised(request=True)
    @torch.no_grad()
    def prefill(self, lengths, embeds: torch.Tensor) -> None:
        lengths = read_lengths(lengths)
        if len(set(lengths)) != 1:
            raise ValueError(f"HfText runs requests of one length; got lengths {list(lengths)}")
        check_embeds(embeds, lengths, self.lm.config.hidden_size)
        embeds = embeds[:, : lengths[0]].to(self.device, self.dtype)
        out = self.lm(inputs_embeds=embeds, use_cache=True)
        self.cache, self.hidden = out.past_key_values, out.last_hidden_state[:, -1]
        self._prefilled_by = threading.get_ident()

    @serialised(request=True)
    @torch.no_grad()
    def sample(self) -> torch.Tensor:
        self.serial.check_request("sample", self._prefilled_by)
        self.logits = self.lm_head(self.hidden)
        self.ids = self.logits.argmax(-1)
        return self.ids

    @serialised(request=True)
    @torch.no_grad()
    def decode(self, steps: int) -> torch.Tensor:
        self.serial.check_request("decode", self._prefilled_by)
        out = []
        for _ in range(steps):
            h = self.lm(inputs_embeds=self.lm.embed_tokens(self.ids)[:, None], past_key_values=self.cache,
                        use_cache=True).last_hidden_state[:, -1]
            self.logits = self.lm_head(h)
            self.ids = self.logits.argmax(-1)
            out.append(self.ids)
        return torch.stack(out, 1) if out else torch.empty(len(self.ids), 0, dtype=torch.long, device=self.device)


def read_input_ids(input_ids, vocab_size: int) -> torch.Tensor:
    """Prompt token ids ``[length]`` (one request) or ``[requests, length]`` of an integer dtype, as
    a 2-D long tensor. On the host (where the pipeline takes them) every id is checked to lie in
    ``0..vocab_size-1``: on a GPU an id past the embedding table is a device-side assert that kills
    the CUDA context. On a device they are not read (that would sync)."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor [requests, length], got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() not in (1, 2):
        raise ValueError(f"input_ids must be [length] or [requests, length], got shape {tuple(input_ids.shape)}")
    ids = input_ids if input_ids.dim() == 2 else input_ids[None]
    if ids.numel() == 0:
        raise ValueError(f"input_ids of shape {tuple(input_ids.shape)} hold no tokens")
    if ids.device.type == "meta":
        raise ValueError(f"input_ids of shape {tuple(input_ids.shape)} is on the meta device: it has no data")
    if ids.device.type == "cpu":
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"input_ids hold token id {bad}, outside the vocabulary 0..{vocab_size - 1}")
    return ids.long()


def prompt_lengths(lengths, n: int, length: int) -> list[int]:
    """Each request's prompt length: ``lengths`` checked against a batch of ``n`` rows of ``length``
    ids, or ``length`` for every request when it is None."""
    if lengths is None:
        return [length] * n
    lengths = read_lengths(lengths)
    if len(lengths) != n or max(lengths) > length:
        raise ValueError(f"lengths {list(lengths)} do not fit {n} prompt rows of {length} ids")
    return lengths


def image_positions(input_ids: torch.Tensor, image_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request, position) of every image token, in the order the features fill them (row-major,
    as transformers' ``masked_scatter``)."""
    b, t = (input_ids == image_token_id).nonzero(as_tuple=True)
    return b, t


class VlmPipeline:
    """LFM2-VL from processor output and prompt ids to greedy tokens, in :data:`PHASES`.

    ``genc``: a :class:`~lfm2vl_lab.core.graphed_encoder.GraphedEncoder` (needed for
    ``encoder_mode="graphed"``); ``engine``: a :class:`~.engine.TextEngine` (needed for
    ``text_mode="graphed"``). Both are shared across pipelines of one model, so four pipelines (the
    modes' grid) cost one capture each.
    """

    def __init__(self, model, encoder_mode: str = "graphed", text_mode: str = "graphed", genc=None,
                 engine: TextEngine | None = None):
        for name, mode in (("encoder_mode", encoder_mode), ("text_mode", text_mode)):
            if mode not in MODES:
                raise ValueError(f"{name} must be one of {MODES}, got {mode!r}")
        if encoder_mode == "graphed" and genc is None:
            raise ValueError("encoder_mode='graphed' needs genc= (a GraphedEncoder)")
        if text_mode == "graphed" and engine is None:
            raise ValueError("text_mode='graphed' needs engine= (a TextEngine)")
        self.model, self.genc = model, genc
        self.encoder_mode, self.text_mode = encoder_mode, text_mode
        self.text = engine if text_mode == "graphed" else HfText(model)
        self.image_token_id = model.config.image_token_id
        self.patch_dim = lfm2vl_parts(model)[0].embeddings.patch_embedding.in_features
        self.limits = image_limits(model)  # what the eager encoder mode checks processor output against

    @property
    def embed(self):
        """The token embedding the model holds now."""
        return lfm2_text_parts(self.model)[0].embed_tokens

    @property
    def name(self) -> str:
        return f"text {self.text_mode}, encoder {self.encoder_mode}"

    def to_device(self, inputs: dict) -> dict:
        """Phase ``h2d``. Eager: every padded float32 row, as transformers moves them. Graphed: what
        the graphed encoder reads (``GraphedEncoder.stage``: the real rows, in the model's dtype)."""
        dev = self.text.device
        if self.encoder_mode == "graphed":
            return self.genc.stage(inputs)  # checks them (lfm2vl_read_inputs)
        _, shapes, mask = lfm2vl_read_inputs(inputs, self.patch_dim)
        lfm2vl_check_shapes(shapes, self.limits.max_num_patches, self.limits.downsample_factor)
        if mask is None:
            raise ValueError("inputs lack 'pixel_attention_mask', which transformers' eager image path needs")
        return {"pixel_values": inputs["pixel_values"].to(dev, self.text.dtype),
                "pixel_attention_mask": inputs["pixel_attention_mask"].to(dev),
                "spatial_shapes": inputs["spatial_shapes"]}

    def encode(self, dev_inputs: dict) -> list[torch.Tensor]:
        """Phase ``encoder``: per-item image features."""
        if self.encoder_mode == "graphed":
            return self.genc.encode(dev_inputs)
        return hf_image_features(self.model, dev_inputs)

    @torch.no_grad()
    def merge(self, input_ids: torch.Tensor, feats: list[torch.Tensor], lengths=None) -> tuple[list[int], torch.Tensor]:
        """Phase ``merge``: the prompt's embeddings, image features at the image tokens, written where
        the text model reads them. Returns the lengths and the embeddings.

        ``lengths`` (one per request; default: every request fills the row): prompts of different
        lengths, right-padded in ``input_ids``; what lies past a request's length is never read, and
        an image token there is not one of its image's."""
        input_ids = read_input_ids(input_ids, self.embed.num_embeddings)
        n, length = input_ids.shape
        ragged = lengths is not None
        lengths = prompt_lengths(lengths, n, length)
        in_prompt = input_ids
        if ragged:  # the padding past each prompt holds no image token of it
            pos = torch.arange(length, device=input_ids.device)[None]
            in_prompt = input_ids.masked_fill(pos >= torch.tensor(lengths, device=input_ids.device)[:, None], -1)
        b, t = image_positions(in_prompt, self.image_token_id)
        rows = sum(f.shape[0] for f in feats)
        if rows != b.numel():
            raise ValueError(f"the prompt holds {b.numel()} image tokens but the images give {rows} features")
        dev = self.text.device
        dst = self.text.prompt(n, length)
        dst.copy_(self.embed(upload(input_ids, dev)))
        dst[upload(b, dev), upload(t, dev)] = torch.cat(feats).to(dst.dtype)
        return lengths, dst

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, inputs: dict, new_tokens: int = 1, mark=None, stop_ids=None,
            check_every: int = 8, lengths=None) -> torch.Tensor:
        """Greedy tokens ``[requests, new_tokens]`` (on the device) for prompts ``input_ids`` (host,
        ``[requests, length]``, or ``[length]`` for one request) and their images' processor output
        ``inputs``. Every input is checked before the first phase runs, except the image-token count,
        which ``merge`` checks against the features.

        ``stop_ids`` (token ids, e.g. the end of turn): decode in chunks of ``check_every`` steps and
        stop after the chunk in which every request has produced one of them, so the result may be
        shorter than ``new_tokens`` and hold tokens after a stop token (cut them where you read it).
        Each check reads the tokens on the host: one sync per chunk.

        ``lengths``: the prompts' lengths where they differ (right-padded ids; :meth:`merge`). Only
        the graphed text model runs such a batch: transformers' (``HfText``) refuses it.

        Threads: one request at a time. The whole request holds the text model's lock
        (``text.request()``), which every pipeline sharing that engine shares, so a second thread's
        request waits for the first to end; the encoder's own lock covers ``h2d`` and ``encoder``."""
        with self.text.request():
            return self._request(input_ids, inputs, new_tokens, mark, stop_ids, check_every, lengths)

    def _request(self, input_ids, inputs, new_tokens, mark, stop_ids, check_every, lengths) -> torch.Tensor:
        new_tokens = read_count("new_tokens", new_tokens, 1)
        input_ids = read_input_ids(input_ids, self.embed.num_embeddings)
        mark = mark or (lambda phase: None)
        dev_inputs = self.to_device(inputs)
        mark("h2d")
        feats = self.encode(dev_inputs)
        mark("encoder")
        lengths, embeds = self.merge(input_ids, feats, lengths)
        mark("merge")
        self.text.prefill(lengths, embeds)
        mark("prefill")
        first = self.text.sample()
        mark("sample")
        if new_tokens == 1:
            return first[:, None]
        if stop_ids is None:
            rest = self.text.decode(new_tokens - 1)
        else:
            rest = self._decode_until(first, new_tokens - 1, stop_ids, check_every)
        mark("decode")
        return torch.cat([first[:, None], rest], 1)

    def _decode_until(self, first: torch.Tensor, steps: int, stop_ids, check_every: int) -> torch.Tensor:
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        stop = torch.tensor(sorted(set(stop_ids)), device=first.device)
        done = torch.isin(first, stop)
        chunks = [first.new_empty(len(first), 0)]
        while steps > 0 and not bool(done.all()):
            k = min(check_every, steps)
            chunks.append(self.text.decode(k))
            done |= torch.isin(chunks[-1], stop).any(1)
            steps -= k
        return torch.cat(chunks, 1)
