"""transformers' own image path: the reference every graphed output is judged against."""

from __future__ import annotations

import torch

from ..core.encoder import lfm2vl_parts


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
