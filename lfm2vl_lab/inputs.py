"""Images in: the real LFM2-VL image processor, the shipped sample photos, a seeded workload.

Every image goes through transformers' own ``Lfm2VlImageProcessor`` configured from a preset, so
tiles, patch grids and token counts are exactly what the model would see.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .presets import Preset, as_preset

IMAGE_DIR = Path(__file__).resolve().parent.parent / "data" / "images"

# The seeded workload: image sides are drawn from this table of (weight, (min_px, max_px)) bands.
# Small thumbnails (one item, fewer than 256 tokens), ~512 px photos (one item, 256 tokens), and
# large photos that the processor tiles into 512 px tiles (several items per image).
WORKLOAD_BANDS = (
    (0.30, (128, 384)),  # small: upscaled to at least 64 tokens, fewer than 1024 patch rows
    (0.45, (384, 720)),  # medium: one item, up to 256 tokens
    (0.25, (900, 2048)),  # large: tiled (2..10 tiles, plus a thumbnail where the preset uses one)
)


def make_processor(preset: "str | Preset"):
    """transformers' ``Lfm2VlImageProcessor`` with the preset's settings."""
    from transformers import Lfm2VlImageProcessor

    p = as_preset(preset).processor
    return Lfm2VlImageProcessor(
        downsample_factor=p["downsample_factor"],
        encoder_patch_size=p["patch_size"],
        tile_size=p["tile_size"],
        min_tiles=p["min_tiles"],
        max_tiles=p["max_tiles"],
        use_thumbnail=p["use_thumbnail"],
        min_image_tokens=p["min_image_tokens"],
        max_image_tokens=p["max_image_tokens"],
        max_pixels_tolerance=p["max_pixels_tolerance"],
        image_mean=p["image_mean"],
        image_std=p["image_std"],
    )


def process_images(images, preset: "str | Preset", return_row_col_info: bool = False) -> dict:
    """Run the real processor: PIL images (or HWC uint8 arrays) → dict of tensors.

    Returns ``pixel_values`` (items, max_num_patches, 3·p·p), ``pixel_attention_mask`` (items,
    max_num_patches) and ``spatial_shapes`` (items, 2) in patches; one image may become several
    items (tiles + thumbnail).
    """
    if not isinstance(images, (list, tuple)):
        images = [images]
    if len(images) == 0:
        raise ValueError("process_images got an empty list of images")
    out = make_processor(preset)(images=list(images), return_tensors="pt", return_row_col_info=return_row_col_info)
    return dict(out)


def item_image(inputs: dict, i: int, preset: "str | Preset" = "tiny") -> np.ndarray:
    """Item ``i`` of the processor's output turned back into an (H, W, 3) image in [0, 1]
    (un-patchify the real rows, undo the normalisation) — to look at what the encoder sees."""
    p = as_preset(preset)
    ps = p.patch_size
    h, w = (int(v) for v in inputs["spatial_shapes"][i].tolist())
    rows = inputs["pixel_values"][i, : h * w].float()
    img = rows.reshape(h, w, ps, ps, 3).permute(0, 2, 1, 3, 4).reshape(h * ps, w * ps, 3)
    mean, std = torch.tensor(p.processor["image_mean"]), torch.tensor(p.processor["image_std"])
    return (img * std + mean).clamp(0, 1).numpy()


def sample_image_paths() -> list[Path]:
    return sorted(p for p in IMAGE_DIR.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"})


def load_sample_images():
    """The photographs shipped in ``data/images`` (see its README for licences)."""
    from PIL import Image

    return [Image.open(p).convert("RGB") for p in sample_image_paths()]


def synthetic_image(width: int, height: int, seed: int = 0):
    """A deterministic RGB image of the given size: smooth gradients plus seeded noise."""
    from PIL import Image

    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / max(width, 1), y / max(height, 1), 0.5 + 0.5 * np.sin((x + y) / 37.0)], -1)
    img = np.clip(base * 200 + rng.normal(0, 25, size=base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(img, "RGB")


@dataclass(frozen=True)
class Request:
    """One request of a workload: an image size (pixels) and the seed that draws its content."""

    width: int
    height: int
    seed: int

    def image(self):
        return synthetic_image(self.width, self.height, self.seed)


def synthetic_workload(n: int, seed: int = 0) -> list[Request]:
    """``n`` requests whose image sizes follow ``WORKLOAD_BANDS`` (seeded, reproducible)."""
    if n < 1:
        raise ValueError(f"a workload needs at least one request, got n={n}")
    rng = random.Random(seed)
    weights = [w for w, _ in WORKLOAD_BANDS]
    out = []
    for i in range(n):
        lo, hi = rng.choices([b for _, b in WORKLOAD_BANDS], weights)[0]
        side = rng.randint(lo, hi)
        aspect = rng.uniform(0.6, 1.67)
        w, h = max(16, int(side * aspect**0.5)), max(16, int(side / aspect**0.5))
        out.append(Request(w, h, seed * 100003 + i))
    return out


def random_processor_output(shapes, preset: "str | Preset" = "tiny", seed: int = 0, dtype=torch.float32) -> dict:
    """Processor-shaped random input for the given patch grids (h, w), without running the processor.

    Useful for fresh random inputs in parity checks: the padded rows are zero and masked, exactly
    as the real processor leaves them.
    """
    p = as_preset(preset)
    g = torch.Generator().manual_seed(seed)
    n, rows, dim = len(shapes), p.max_num_patches, 3 * p.patch_size**2
    pv = torch.zeros(n, rows, dim, dtype=dtype)
    mask = torch.zeros(n, rows, dtype=torch.int32)
    for i, (h, w) in enumerate(shapes):
        if h * w > rows:
            raise ValueError(f"item {i}: patch grid {h}x{w} = {h * w} rows exceeds max_num_patches={rows}")
        pv[i, : h * w] = torch.rand(h * w, dim, generator=g, dtype=torch.float32).to(dtype) * 2 - 1
        mask[i, : h * w] = 1
    return {"pixel_values": pv, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor(shapes, dtype=torch.int64).reshape(n, 2)}
