"""The packed split-forward vision encoder, on the transformers model's own parameters.

transformers runs LFM2-VL's vision path on a padded batch (every item padded to 1024 rows) and
ends in a per-image Python loop (unpad → reshape → pixel-unshuffle → projector). Both defeat CUDA
graphs: shapes depend on the data and the loop reads sizes on the host.

Here the same math runs on a packed batch (see :mod:`lfm2vl_lab.packing`):

    patch linear + pos  →  SigLIP2 layers with varlen attention over cu_seqlens  →  post-LN
    →  projector.forward_with_gather_idx(x, gather_idx)
         = index_select(gather_idx) → reshape(-1, 4C) → projector.forward_from_unshuffled
         = LayerNorm → Linear → GELU → Linear

Given its tensors on the GPU, ``PackedVisionEncoder.forward`` performs no host synchronisation,
so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import importlib.util
import itertools

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .fused import TANH_GELU_ACTS, add_layer_norm, linear_gelu
from .inputs import image_limits
from .packing import PackedBatch, PositionEmbeddingCache, pack_inputs

ATTENTION_BACKENDS = ("varlen", "sdpa_blockmask")
# The kernel options' defaults (PackedVisionEncoder explains them; the benchmark records them per row)
FUSE_QKV = True
FUSE_ELEMENTWISE = True


# --------------------------------------------------------------------------------------------
# Attention over packed sequences
# --------------------------------------------------------------------------------------------


def varlen_available() -> bool:
    """torch ships ``varlen_attn`` (2.11 on) and there is a GPU to run it (it has no CPU kernel)."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None and torch.cuda.is_available()


def attention_varlen(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """FlashAttention varlen (CUDA only): q/k/v (T, H, D), sequences given by ``cu_seqlens``."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale)


def _sdpa_rows(q, k, v, scale: float, mask=None):
    """SDPA over packed rows (T, H, D) as one batch entry: (1, H, T, D) in, (T, H, D) out."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, scale=scale,
    )
    return out.squeeze(0).transpose(0, 1)


def _segments(cu_seqlens, t: int, device) -> torch.Tensor:
    """Segment id of each of ``t`` packed rows: item ``i`` for rows in [cu[i], cu[i+1]), and one
    extra segment for rows past ``cu_seqlens[-1]`` (buffer padding), so they never mix with real rows."""
    rows = torch.arange(t, device=device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), rows, right=True)


def attention_sdpa_blockmask(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """Exact reference on any device: attention within each sequence of ``cu_seqlens``.

    Rows past ``cu_seqlens[-1]`` (buffer padding) get a segment of their own, so they never mix
    with real rows; zero-length sequences have no rows and change nothing.

    On CUDA (and whenever torch.compile traces it) this is one SDPA with a block-diagonal T×T
    mask: no host sync, so it can run inside a CUDA graph, but its work and memory grow as T²
    over *all* packed rows. On CPU tensors, where host reads are free, the same result is
    computed per item instead (:func:`attention_per_item`): 4 items of 1024 rows cost 4·1024²
    instead of 4096², which made the packed path slower than transformers' padded batch there.
    """
    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        return attention_per_item(q, k, v, cu_seqlens, max_seqlen, scale)
    return attention_blockmask_dense(q, k, v, cu_seqlens, max_seqlen, scale)


def attention_blockmask_dense(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """The block-diagonal T×T mask formulation (any device, no host sync): one SDPA over all rows."""
    seg = _segments(cu_seqlens, q.shape[0], q.device)
    return _sdpa_rows(q, k, v, scale, seg[:, None] == seg[None, :])


def attention_per_item(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """The block-mask attention computed segment by segment (same segments, same result).

    Reads ``cu_seqlens`` on the host, so it is for CPU tensors (a CUDA graph could not capture it).
    Segments of equal length share one batched SDPA call without a mask: (n, H, L, D).
    """
    t, out = q.shape[0], torch.empty_like(q)
    if t == 0:
        return out
    seg = _segments(cu_seqlens.cpu(), t, "cpu")
    # seg is non-decreasing, so each segment is one contiguous run of rows
    _, counts = torch.unique_consecutive(seg, return_counts=True)
    lengths = counts.tolist()
    starts = [0, *itertools.accumulate(lengths)][:-1]
    by_len: dict[int, list[int]] = {}
    for s, n in zip(starts, lengths):
        by_len.setdefault(n, []).append(s)
    for n, group in by_len.items():
        s, e = group[0], group[-1] + n
        if e - s == n * len(group):  # adjacent items (the usual case): (items, n) views, no copies
            qi, ki, vi = (x[s:e].unflatten(0, (len(group), n)).transpose(1, 2) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qi, ki, vi, scale=scale)
            out[s:e] = o.transpose(1, 2).flatten(0, 1)
            continue
        idx = (torch.tensor(group)[:, None] + torch.arange(n)).to(q.device)  # (items, n) row indices
        qi, ki, vi = (x[idx].transpose(1, 2) for x in (q, k, v))  # (items, H, n, D)
        o = F.scaled_dot_product_attention(qi, ki, vi, scale=scale)
        out[idx.reshape(-1)] = o.transpose(1, 2).reshape(-1, *q.shape[1:])
    return out


# cuDNN first: in a graph it beat FlashAttention-2 (dense and varlen) at every equal-length layout the H200
# probe timed (attention-*.json); the others serve shapes or devices cuDNN refuses (and CPUs).
DENSE_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                  SDPBackend.MATH]


def attention_dense_blocks(q, k, v, n_items: int, scale: float):
    """Dense SDPA over rows (T, H, D) that are ``n_items`` sequences of ``T / n_items`` rows each:
    one batched call on (n_items, H, L, D) views, no mask, cuDNN first."""
    t, h, d = q.shape
    q, k, v = (x.view(n_items, t // n_items, h, d).transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(DENSE_BACKENDS, set_priority=True):
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(t, h, d)


def dense_attention(n_items: int, item_rows: int, rest=None):
    """An attention function (same signature as the backends) for a batch that starts with
    ``n_items`` items of exactly ``item_rows`` rows: those rows go through batched dense SDPA and any
    rows after them through ``rest`` (a backend) with ``cu_seqlens`` counted from the rest's first
    row. Correct only for such batches: ``GraphedEncoder`` replays its dense graphs only then. Not a
    user-selectable backend, because on other batches it would silently mix items."""
    head = n_items * item_rows

    def attn(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
        out = attention_dense_blocks(q[:head], k[:head], v[:head], n_items, scale)
        if q.shape[0] == head:
            return out
        return torch.cat([out, rest(q[head:], k[head:], v[head:], cu_seqlens, max_seqlen, scale)])

    return attn


def attention_one_sequence(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """Dense SDPA over *all* rows as one sequence, ``cu_seqlens`` ignored: one item, no padding only."""
    return attention_dense_blocks(q, k, v, 1, scale)


VARLEN_DTYPES = (torch.float16, torch.bfloat16)  # varlen_attn is FlashAttention: fp32 fails inside the kernel


def resolve_attention(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """``auto`` → varlen on CUDA in half precision when torch has it, else the exact block-mask SDPA."""
    if name == "auto":
        ok = device.type == "cuda" and dtype in VARLEN_DTYPES and varlen_available()
        name = "varlen" if ok else "sdpa_blockmask"
    if name == "varlen":
        if device.type != "cuda" or dtype not in VARLEN_DTYPES:
            raise ValueError(f"attention='varlen' needs a CUDA device and fp16 or bf16 (torch's varlen_attn is "
                             f"FlashAttention); got {device.type}, {dtype}: use 'auto' or 'sdpa_blockmask'")
        return name, attention_varlen
    if name == "sdpa_blockmask":
        return name, attention_sdpa_blockmask
    raise ValueError(f"unknown attention backend {name!r}; choose from auto, {', '.join(ATTENTION_BACKENDS)}")


# --------------------------------------------------------------------------------------------
# The split projector
# --------------------------------------------------------------------------------------------


class SplitProjector(nn.Module):
    """transformers' ``Lfm2VlMultiModalProjector`` split in two, sharing its parameters.

    * ``forward_with_gather_idx(x, gather_idx)``: packed rows → pixel-unshuffle by index → MLP
    * ``forward_from_unshuffled(x)``: the MLP alone, on already unshuffled (tokens, 4C) rows
    * ``forward(features)``: eager convenience on one (1, h, w, C) item, same contract as the
      original module's forward (builds the index itself)
    """

    def __init__(self, projector: nn.Module, factor: int):
        super().__init__()
        self.inner = projector  # shared, not copied
        self.factor = factor

    def forward_from_unshuffled(self, x: torch.Tensor) -> torch.Tensor:
        p = self.inner
        if p.layer_norm is not None:
            x = p.layer_norm(x)
        return p.linear_2(p.act(p.linear_1(x)))

    def unshuffle(self, x: torch.Tensor, gather_idx: torch.Tensor) -> torch.Tensor:
        """Packed rows (T, C) → unshuffled tokens (T / factor², factor²·C): one index_select."""
        return x.index_select(0, gather_idx).reshape(-1, x.shape[-1] * self.factor**2)

    def forward_with_gather_idx(self, x: torch.Tensor, gather_idx: torch.Tensor) -> torch.Tensor:
        return self.forward_from_unshuffled(self.unshuffle(x, gather_idx))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        from .packing import lfm2vl_local_gather_idx

        b, h, w, c = features.shape
        assert b == 1, "SplitProjector.forward takes one item (1, h, w, C), like the per-image loop it replaces"
        idx = lfm2vl_local_gather_idx(h, w, self.factor).to(features.device)
        out = self.forward_with_gather_idx(features.reshape(h * w, c), idx)
        return out.reshape(1, h // self.factor, w // self.factor, -1)


# --------------------------------------------------------------------------------------------
# The packed encoder
# --------------------------------------------------------------------------------------------


def fused_qkv(sa: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention module's q/k/v projections as one (3C, C) weight and (3C,) bias.

    The module's own q/k/v parameters are re-pointed as views into that storage (same values,
    same memory; transformers' forward and in-place weight loading still work, and reach the fused
    GEMM too). Done once per model: the result is kept on the module, and a later call, from any
    encoder, returns the same tensors while the parameters still view them. Re-fusing would drop
    the storage that graphs captured earlier read (on the H200 a second encoder on the same model
    did exactly that: garbage and NaN from the first one's replays, then an illegal memory access).
    For the same reason the separate tensors the parameters held before are kept alive with it: a
    graph captured without fused QKV still reads them (this costs one copy of the q/k/v weights).
    After ``model.to(...)`` the views are broken and the next call fuses again.
    """
    projs = (sa.q_proj, sa.k_proj, sa.v_proj)
    kept = getattr(sa, "_lab_fused_qkv", None)
    if kept is not None:
        w, b = kept
        c = w.shape[0] // 3
        if all(p.weight.data_ptr() == w[i * c].data_ptr() and p.bias.data_ptr() == b[i * c :].data_ptr()
               for i, p in enumerate(projs)):
            return kept
    with torch.no_grad():
        unfused = [(p.weight, p.bias) for p in projs]
        w, b = torch.cat([p.weight for p in projs]), torch.cat([p.bias for p in projs])
        c = w.shape[0] // 3
        for i, p in enumerate(projs):
            p.weight = nn.Parameter(w[i * c : (i + 1) * c], requires_grad=p.weight.requires_grad)
            p.bias = nn.Parameter(b[i * c : (i + 1) * c], requires_grad=p.bias.requires_grad)
    sa._lab_fused_qkv = (w, b)
    sa._lab_unfused_qkv = unfused
    return w, b


def lfm2vl_parts(model):
    """(vision_tower, projector, config) from an Lfm2VlForConditionalGeneration or Lfm2VlModel."""
    inner = getattr(model, "model", model)
    if not hasattr(inner, "vision_tower") or not hasattr(inner, "multi_modal_projector"):
        raise TypeError(f"expected a transformers LFM2-VL model, got {type(model).__name__}")
    return inner.vision_tower, inner.multi_modal_projector, inner.config


class PackedVisionEncoder(nn.Module):
    """Packed varlen LFM2-VL vision encoder + split projector on a transformers model's weights.

    >>> enc = PackedVisionEncoder(model)                # no weight copies
    >>> feats = enc.encode(processor_output)            # list of (tokens_i, text_hidden) per item

    ``forward(pixel_values, pos_embeds, cu_seqlens, max_seqlen, gather_idx)`` is the graph body.

    Kernel options (all on by default; each changes only rounding, not the math): ``fuse_qkv``, one
    QKV GEMM per layer; ``fuse_elementwise``, residual add + LayerNorm as one Triton kernel and the
    MLP's bias + GELU in the GEMM epilogue (:mod:`~.fused`; on CUDA only, plain torch elsewhere).
    """

    def __init__(self, model, attention: str = "auto", fuse_qkv: bool = FUSE_QKV,
                 fuse_elementwise: bool = FUSE_ELEMENTWISE):
        super().__init__()
        vt, proj, cfg = lfm2vl_parts(model)
        self.vision = vt
        self.factor = cfg.downsample_factor
        self.projector = SplitProjector(proj, self.factor)
        self.embed_dim = cfg.vision_config.hidden_size
        self.num_heads = cfg.vision_config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.scale = self.head_dim**-0.5
        self.out_hidden_size = cfg.text_config.hidden_size
        self.patch_dim = vt.embeddings.patch_embedding.in_features
        self.max_num_patches = image_limits(model).max_num_patches  # the rows the processor pads each item to
        self.pos_cache = PositionEmbeddingCache(vt.embeddings.position_embedding)
        self.fuse_elementwise = fuse_elementwise
        self.tanh_gelu = cfg.vision_config.hidden_act in TANH_GELU_ACTS  # what the GEMM epilogue computes
        self.attention_name = attention
        self._attn_cache = None
        # One (3C × C) GEMM per layer instead of three: see fused_qkv (shared by every encoder on
        # this model, so graphs captured by one are never broken by another).
        self.fuse_qkv = fuse_qkv
        self._qkv: list[tuple[torch.Tensor, torch.Tensor]] = []
        if fuse_qkv:
            self._fuse_qkv()

    def _fuse_qkv(self) -> None:
        self._qkv = [fused_qkv(layer.self_attn) for layer in self.vision.encoder.layers]

    def _qkv_current(self) -> bool:
        """False when the model was moved/cast since fusing (``.to`` breaks the shared storage)."""
        sa = self.vision.encoder.layers[0].self_attn
        return bool(self._qkv) and sa.q_proj.weight.data_ptr() == self._qkv[0][0].data_ptr()

    # -- properties that follow the shared weights --------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.vision.embeddings.patch_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.vision.embeddings.patch_embedding.weight.dtype

    def attention_fn(self):
        key = (self.attention_name, self.device, self.dtype)
        if self._attn_cache is None or self._attn_cache[0] != key:
            self._attn_cache = (key, *resolve_attention(*key))
        return self._attn_cache[2]

    @property
    def attention_backend(self) -> str:
        self.attention_fn()
        return self._attn_cache[1]

    # -- the graph body -------------------------------------------------------------------------
    def embed(self, pixel_values: torch.Tensor, pos_embeds: torch.Tensor) -> torch.Tensor:
        pe = self.vision.embeddings.patch_embedding
        return pe(pixel_values.to(pe.weight.dtype)) + pos_embeds

    def layer(self, layer: nn.Module, x: torch.Tensor, h: torch.Tensor, next_norm: nn.Module, cu_seqlens,
              max_seqlen: int, attn, qkv=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One SigLIP2 encoder layer on packed rows (same modules, packed attention).

        Takes the residual stream ``x`` and ``h = layer_norm1(x)``; returns the new stream and
        ``next_norm`` of it (the next layer's ``layer_norm1``, or the post-LayerNorm), so that every
        residual add is fused with the LayerNorm after it."""
        sa, fused = layer.self_attn, self.fuse_elementwise
        if qkv is not None:
            q, k, v = F.linear(h, *qkv).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        else:
            q = sa.q_proj(h).view(-1, self.num_heads, self.head_dim)
            k = sa.k_proj(h).view(-1, self.num_heads, self.head_dim)
            v = sa.v_proj(h).view(-1, self.num_heads, self.head_dim)
        a = attn(q, k, v, cu_seqlens, max_seqlen, self.scale).reshape(-1, self.embed_dim)
        x, h = add_layer_norm(x, sa.out_proj(a), layer.layer_norm2, fused)
        mlp = layer.mlp
        m = linear_gelu(h, mlp.fc1, mlp.activation_fn, fused and self.tanh_gelu)
        return add_layer_norm(x, mlp.fc2(m), next_norm, fused)

    def encoder_layers(self, x, cu_seqlens, max_seqlen: int, attn=None) -> torch.Tensor:
        attn = attn if attn is not None else self.attention_fn()
        if self.fuse_qkv and not self._qkv_current():
            self._fuse_qkv()
        layers = self.vision.encoder.layers
        fused = self._qkv if self.fuse_qkv else [None] * len(layers)
        next_norms = [nxt.layer_norm1 for nxt in layers[1:]] + [self.vision.post_layernorm]
        h = layers[0].layer_norm1(x)
        for layer, qkv, next_norm in zip(layers, fused, next_norms):
            x, h = self.layer(layer, x, h, next_norm, cu_seqlens, max_seqlen, attn, qkv)
        return h

    def forward(self, pixel_values, pos_embeds, cu_seqlens, max_seqlen: int, gather_idx, attn=None) -> torch.Tensor:
        """``attn``: an attention function to use instead of the configured backend (the graph
        manager's single-item graphs pass ``attention_one_sequence``)."""
        x = self.embed(pixel_values, pos_embeds)
        x = self.encoder_layers(x, cu_seqlens, max_seqlen, attn)
        return self.projector.forward_with_gather_idx(x, gather_idx)

    # -- eager convenience ------------------------------------------------------------------------
    def pack(self, inputs: dict) -> PackedBatch:
        """Processor output → packed batch on this encoder's device, with position embeddings."""
        pv = inputs.get("pixel_values")
        if pv is not None and pv.dim() == 3 and pv.shape[-1] != self.patch_dim:
            raise ValueError(f"pixel_values rows have {pv.shape[-1]} values, "
                             f"the patch embedding takes {self.patch_dim}")
        return pack_inputs(
            inputs, max_num_patches=self.max_num_patches, factor=self.factor, pos_cache=self.pos_cache,
            device=self.device,
        )

    def forward_packed(self, batch: PackedBatch) -> torch.Tensor:
        return self(batch.pixel_values, batch.pos_embeds, batch.cu_seqlens, batch.max_seqlen, batch.gather_idx)

    @torch.no_grad()
    def encode(self, inputs: dict) -> list[torch.Tensor]:
        """Per-item embeddings in input order — the contract of transformers' ``get_image_features``."""
        batch = self.pack(inputs)
        out = self.forward_packed(batch)
        return list(out.split(batch.out_tokens))
