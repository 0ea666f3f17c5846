"""Workloads: the shipped sample photos, seeded synthetic images and request streams,
processor-shaped random inputs for parity checks, and the benchmark's named workloads.

Named workloads: ``NxS`` (N synthetic S×S images, e.g. ``1x512``, ``4x512``), ``A..BxS``
(doubling N from A to B: ``1..16x512`` → 1, 2, 4, 8, 16 images; ``1..16`` alone means
``1..16x512``), ``tiled`` (one ``TILED_SIZE`` image → tiles, plus a thumbnail on presets that use
one) and ``stream`` (requests from :func:`synthetic_workload`, each timed once).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.packing import tokens_for
from ..kernels.attention import cuda_capability
from ..model.inputs import image_limits

IMAGE_DIR = Path(__file__).resolve().parents[2] / "data" / "images"
DEFAULT_WORKLOADS = ("1x512", "1x256", "4x512", "tiled")
TILED_SIZE = (1024, 768)  # width, height of the ``tiled`` workload's one image
NXS = re.compile(r"(\d+)x(\d+)")  # an ``NxS`` workload name: N images of S×S pixels
_RANGE = re.compile(r"(\d+)\.\.(\d+)(?:x(\d+))?")

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
    shapes_t = torch.tensor(shapes, dtype=torch.int64).reshape(n, 2)
    return {"pixel_values": pv, "pixel_attention_mask": mask, "spatial_shapes": shapes_t}


def default_device() -> torch.device:
    """CUDA when this machine has it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")

# bf16 tensor cores arrived with Ampere (sm80); on a T4 (sm75) bf16 runs emulated, if at all
BF16_MIN_CAPABILITY = (8, 0)


def device_defaults(device) -> tuple[str, torch.dtype]:
    """The kit's choice of model for a device: LFM2-VL-450M in bf16 on CUDA (the real shapes, the
    dtype a server runs), the tiny preset in fp32 elsewhere (a CPU runs it in seconds). GPUs older
    than sm80 (a T4) have no bf16 arithmetic, so they get fp16."""
    if torch.device(device).type != "cuda":
        return "tiny", torch.float32
    cap = cuda_capability(device)
    return "lfm2-vl-450m", torch.bfloat16 if cap is None or cap >= BF16_MIN_CAPABILITY else torch.float16


def parse_nxs(name) -> tuple[int, int] | None:
    """``"4x512"`` → ``(4, 512)`` (images, side); None for any other name (``tiled``, ``stream``)."""
    m = NXS.fullmatch(str(name))
    return (int(m[1]), int(m[2])) if m else None


def _expand_one(part: str) -> list[str]:
    if m := _RANGE.fullmatch(part):
        a, b, side = int(m[1]), int(m[2]), int(m[3] or 512)
        if a < 1 or b < a:
            raise ValueError(f"workload range {part!r}: need 1 <= A <= B")
        out, n = [], a
        while n < b:
            out.append(f"{n}x{side}")
            n *= 2
        return out + [f"{b}x{side}"]
    if nxs := parse_nxs(part):
        if min(nxs) < 1:
            raise ValueError(f"workload {part!r}: need at least one image of positive size")
        return [part]
    if part in ("tiled", "stream"):
        return [part]
    raise ValueError(f"unknown workload {part!r}: use NxS (e.g. 4x512), A..BxS, tiled or stream")


def expand_workloads(specs) -> list[str]:
    """Workload specs (strings or comma lists) → workload names, ranges expanded, order kept."""
    if isinstance(specs, str):
        specs = [specs]
    out = [name for spec in specs for part in str(spec).split(",") if part.strip()
           for name in _expand_one(part.strip())]
    return list(dict.fromkeys(out))


def workload_images(name: str, seed: int = 0) -> list:
    """The PIL images of a fixed workload (``NxS`` or ``tiled``)."""
    if name == "tiled":
        return [synthetic_image(*TILED_SIZE, seed=seed)]
    nxs = parse_nxs(name)
    if nxs is None:
        raise ValueError(f"{name!r} is not a fixed workload (NxS or tiled)")
    n, side = nxs
    if n < 1 or side < 1:
        raise ValueError(f"workload {name!r}: need at least one image of positive size")
    return [synthetic_image(side, side, seed=seed + i) for i in range(n)]


def to_device(inputs: dict, device, dtype) -> dict:
    """Processor output on the device: pixel values in the model dtype, the mask alongside, and
    ``spatial_shapes`` kept on the CPU (the encoders read it on the host)."""
    return {
        "pixel_values": inputs["pixel_values"].to(device, dtype),
        "pixel_attention_mask": inputs["pixel_attention_mask"].to(device),
        "spatial_shapes": inputs["spatial_shapes"].cpu(),
    }


def input_stats(inputs: dict, factor: int = 2) -> dict:
    """Items, output tokens and patch rows of one processor output."""
    shapes = [(int(h), int(w)) for h, w in inputs["spatial_shapes"].tolist()]
    return {"n_items": len(shapes), "tokens": sum(tokens_for(s, factor) for s in shapes),
            "patch_rows": sum(h * w for h, w in shapes)}


def stream_requests(n: int, preset, seed: int = 0, progress: bool = False) -> tuple[list[dict], dict]:
    """Processor output (CPU) of ``n`` seeded requests (:func:`synthetic_workload`), and totals over them."""
    from tqdm.auto import tqdm

    from ..model.inputs import process_images

    reqs = []
    for r in tqdm(synthetic_workload(n, seed), desc="processing stream images", leave=False, disable=not progress):
        out = process_images([r.image()], preset)
        reqs.append({k: out[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")})
    totals = [input_stats(r) for r in reqs]
    return reqs, {"n_images": n, **{k: sum(t[k] for t in totals) for k in ("n_items", "tokens", "patch_rows")}}
