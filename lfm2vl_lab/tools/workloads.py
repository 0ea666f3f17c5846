"""Workloads: the shipped sample photos, seeded synthetic images and request streams, and
processor-shaped random inputs for parity checks."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.inputs import image_limits

IMAGE_DIR = Path(__file__).resolve().parents[2] / "data" / "images"

# The seeded workload: image sides are drawn from this table of (weight, (min_px, max_px)) bands.
# Small thumbnails (one item, fewer than 256 tokens), ~512 px photos (one item, 256 tokens), and
# large photos that the processor tiles into 512 px tiles (several items per image).
WORKLOAD_BANDS = (
    (0.30, (128, 384)),  # small: upscaled to at least 64 tokens, fewer than 1024 patch rows
    (0.45, (384, 720)),  # medium: one item, up to 256 tokens
    (0.25, (900, 2048)),  # large: tiled (2..10 tiles, plus a thumbnail where the preset uses one)
)


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


def random_processor_output(shapes, model_or_preset="tiny", seed: int = 0, dtype=torch.float32) -> dict:
    """Processor-shaped random input for the given patch grids (h, w), without running the processor.

    Useful for fresh random inputs in parity checks: the padded rows are zero and masked, exactly
    as the real processor leaves them.
    """
    lim = image_limits(model_or_preset)
    g = torch.Generator().manual_seed(seed)
    n, rows, dim = len(shapes), lim.max_num_patches, 3 * lim.patch_size**2
    pv = torch.zeros(n, rows, dim, dtype=dtype)
    mask = torch.zeros(n, rows, dtype=torch.int32)
    for i, (h, w) in enumerate(shapes):
        if h * w > rows:
            raise ValueError(f"item {i}: patch grid {h}x{w} = {h * w} rows exceeds max_num_patches={rows}")
        pv[i, : h * w] = torch.rand(h * w, dim, generator=g, dtype=torch.float32).to(dtype) * 2 - 1
        mask[i, : h * w] = 1
    return {"pixel_values": pv, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor(shapes, dtype=torch.int64).reshape(n, 2)}


def device_defaults(device) -> tuple[str, torch.dtype]:
    """The kit's choice of model for a device: LFM2-VL-450M in bf16 on CUDA (the real shapes, the
    dtype a server runs), the tiny preset in fp32 elsewhere (a CPU runs it in seconds)."""
    on_cuda = torch.device(device).type == "cuda"
    return ("lfm2-vl-450m", torch.bfloat16) if on_cuda else ("tiny", torch.float32)
