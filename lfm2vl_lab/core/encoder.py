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

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attention import resolve_attention
from ..kernels.fused import TANH_GELU_ACTS, add_layer_norm, linear_gelu, shared_linear
from .config import GraphOptions
from .packing import PackedBatch, PositionEmbeddingCache, model_limits, pack_inputs

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
    """One attention module's q/k/v projections as one (3C, C) weight and (3C,) bias
    (:func:`~lfm2vl_lab.kernels.fused.shared_linear`: the module's own q/k/v parameters become views
    into that storage, so transformers' forward and in-place weight loading still work).

    Done once per model, kept on the module: re-fusing would drop the storage that graphs captured
    earlier read (on the H200 a second encoder on the same model did exactly that: garbage and NaN
    from the first one's replays, then an illegal memory access). The separate tensors the
    parameters held before are not kept: re-pointing the parameters fires the registration hooks of
    :mod:`~.guard`, so a graph captured earlier without fused QKV is captured again before it
    replays, and reads the views. After ``model.to(...)`` the views are broken and the next call
    fuses again.
    """
    return shared_linear(sa, (sa.q_proj, sa.k_proj, sa.v_proj), "_lab_fused_qkv")


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
    MLP's bias + GELU in the GEMM epilogue (:mod:`lfm2vl_lab.kernels.fused`; on CUDA only, plain torch elsewhere).
    """

    def __init__(self, model, attention: str = GraphOptions.attention, fuse_qkv: bool = GraphOptions.fuse_qkv,
                 fuse_elementwise: bool = GraphOptions.fuse_elementwise):
        super().__init__()
        vt, proj, cfg = lfm2vl_parts(model)
        object.__setattr__(self, "root", model)  # the model itself (not registered: its parts are)
        self.vision = vt
        self.factor = cfg.downsample_factor
        self.projector = SplitProjector(proj, self.factor)
        self.embed_dim = cfg.vision_config.hidden_size
        self.num_heads = cfg.vision_config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.scale = self.head_dim**-0.5
        self.out_hidden_size = cfg.text_config.hidden_size
        self.patch_dim = vt.embeddings.patch_embedding.in_features
        self.max_num_patches = model_limits(model).max_num_patches  # the rows the processor pads each item to
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
        self._qkv_pointers = self._projection_pointers()

    def _projection_pointers(self) -> list[int]:
        return [t.data_ptr() for layer in self.vision.encoder.layers
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                for t in (proj.weight, proj.bias) if t is not None]

    def _qkv_current(self) -> bool:
        """False when any layer's q/k/v parameters no longer view the fused storage: the model was
        moved or cast (``.to`` breaks the views), a layer was swapped, or a weight given new storage."""
        return bool(self._qkv) and self._projection_pointers() == self._qkv_pointers

    def rebind(self) -> None:
        """Everything derived from the model, built again from the model as it is now (the manager
        calls it before every capture): the vision tower and projector it holds now, the position
        cache of its position embedding, the attention function, and every layer's fused q/k/v. A
        recapture then reads nothing of a module the model no longer holds."""
        vt, proj, _ = lfm2vl_parts(self.root)
        if vt is not self.vision:
            self.vision = vt
        if proj is not self.projector.inner:
            self.projector.inner = proj
        if self.pos_cache.embedding is not vt.embeddings.position_embedding:
            self.pos_cache = PositionEmbeddingCache(vt.embeddings.position_embedding, self.pos_cache.max_bytes)
        self._attn_cache = None
        if self.fuse_qkv:
            self._fuse_qkv()

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
        """``attn``: an attention function to use instead of the configured backend (the dense
        graphs pass batched dense attention: :mod:`~.dense`)."""
        x = self.embed(pixel_values, pos_embeds)
        x = self.encoder_layers(x, cu_seqlens, max_seqlen, attn)
        return self.projector.forward_with_gather_idx(x, gather_idx)

    # -- eager convenience ------------------------------------------------------------------------
    def pack(self, inputs: dict) -> PackedBatch:
        """Processor output → packed batch on this encoder's device, with position embeddings (the
        inputs are checked first: :func:`~.packing.lfm2vl_read_inputs`)."""
        return pack_inputs(
            inputs, max_num_patches=self.max_num_patches, factor=self.factor, pos_cache=self.pos_cache,
            device=self.device, patch_dim=self.patch_dim,
        )

    def forward_packed(self, batch: PackedBatch) -> torch.Tensor:
        return self(batch.pixel_values, batch.pos_embeds, batch.cu_seqlens, batch.max_seqlen, batch.gather_idx)

    @torch.no_grad()
    def encode(self, inputs: dict) -> list[torch.Tensor]:
        """Per-item embeddings in input order — the contract of transformers' ``get_image_features``."""
        batch = self.pack(inputs)
        out = self.forward_packed(batch)
        return list(out.split(batch.out_tokens))
