"""transformers' side: its own image path (the reference) and the plug that swaps ours in."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .encoder import lfm2vl_parts


def hf_image_features(model, inputs: dict) -> list[torch.Tensor]:
    """transformers' own eager image path (the reference), inputs moved to the model's device."""
    vt = lfm2vl_parts(model)[0]
    dev, dt = vt.embeddings.patch_embedding.weight.device, vt.embeddings.patch_embedding.weight.dtype
    with torch.no_grad():
        out = model.get_image_features(
            pixel_values=inputs["pixel_values"].to(dev, dt),
            spatial_shapes=inputs["spatial_shapes"].to(dev),
            pixel_attention_mask=inputs["pixel_attention_mask"].to(dev),
        )
    return list(out.pooler_output if hasattr(out, "pooler_output") else out)


def image_features_fn(encode):
    """A drop-in for ``Lfm2VlModel.get_image_features`` that computes the features with ``encode``
    (processor-output dict → per-item embeddings), e.g. a ``GraphedEncoder``'s."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def get_image_features(pixel_values, spatial_shapes, pixel_attention_mask=None, **kwargs):
        feats = encode({"pixel_values": pixel_values, "spatial_shapes": spatial_shapes.cpu(),
                        "pixel_attention_mask": pixel_attention_mask})
        return BaseModelOutputWithPooling(last_hidden_state=None, pooler_output=feats)

    return get_image_features


@contextmanager
def installed(model, encode):
    """Within the block, ``model`` computes its image features — in ``forward`` and so in
    ``generate`` — with ``encode``. Nesting-safe: the previous override (if any) comes back after."""
    inner = getattr(model, "model", model)
    prev = inner.__dict__.get("get_image_features")  # an earlier override, if any (nesting)
    inner.get_image_features = image_features_fn(encode)
    try:
        yield model
    finally:
        if prev is None:
            del inner.get_image_features  # back to the class's own method
        else:
            inner.get_image_features = prev
