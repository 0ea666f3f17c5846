"""Images in: any image a user holds → RGB, then the real LFM2-VL image processor. (The shipped
sample photos and seeded workloads are the instrument's: :mod:`lfm2vl_lab.measure.workloads`.)

Every image goes through transformers' own ``Lfm2VlImageProcessor`` — configured from a preset, or
the one a checkpoint folder ships (see :func:`processor_for`) — so tiles, patch grids and token
counts are exactly what the model would see. Before that, :func:`to_rgb` turns whatever the user
holds (a PIL image in any mode, a numpy array, a file path) into the 8-bit RGB image the
processor expects: transformers itself crashes on greyscale and RGBA input.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..core.packing import ImageLimits
from .presets import Preset, available_presets, make_processor

# Transparent pixels are shown over this colour: white, the way a browser or a document shows a
# PNG screenshot or logo (over black, dark text on a transparent background would vanish).
ALPHA_BACKGROUND = (255, 255, 255)


# --------------------------------------------------------------------------------------------
# Any image → RGB
# --------------------------------------------------------------------------------------------


def _where(index: int | None) -> str:
    return f"image {index}: " if index is not None else ""


def _to_uint8(a: np.ndarray, index: int | None, sixteen_bit: bool = False) -> np.ndarray:
    """Pixel values → uint8. uint8 as is; uint16 (and any 16-bit PIL data) scaled from 0..65535;
    bool → 0/255; floats must be finite and lie in [0, 1]."""
    kind, size = a.dtype.kind, a.dtype.itemsize
    if kind == "b":
        return a.astype(np.uint8) * 255
    if kind == "u" and size == 1 and not sixteen_bit:
        return a
    if (kind == "u" and size == 2) or (sixteen_bit and kind in "iu"):
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > 65535:
            raise ValueError(f"{_where(index)}16-bit pixel values must lie in [0, 65535], got [{lo}, {hi}]")
        return ((a.astype(np.uint32) + 128) // 257).astype(np.uint8)  # the exact inverse of v8 * 257
    if kind == "f":
        if not np.isfinite(a).all():
            raise ValueError(f"{_where(index)}float pixel values must be finite; the image holds NaN or Inf")
        lo, hi = float(a.min()), float(a.max())
        if lo < 0 or hi > 1:
            raise ValueError(
                f"{_where(index)}float pixel values must lie in [0, 1], got [{lo:g}, {hi:g}]; "
                "for values on a 0..255 scale pass array.astype(np.uint8)"
            )
        return np.rint(a * 255).astype(np.uint8)
    raise TypeError(f"{_where(index)}unsupported pixel dtype {a.dtype}; use uint8, uint16, bool or float in [0, 1]")


def _pil_to_rgb(image, index: int | None):
    from PIL import Image

    bands = image.getbands()
    if "A" in bands or "a" in bands or "transparency" in image.info:
        if image.mode == "La":  # premultiplied alpha: PIL converts it to LA, not to RGBA
            image = image.convert("LA")
        # convert("RGBA") also turns a palette's or a colour key's transparency into alpha.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, ALPHA_BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I"):
        # 16-bit greyscale: "I;16*" is how Pillow reads a 16-bit PNG ("I" in older Pillow). PIL's own
        # convert("RGB") clips every value above 255, so a 16-bit photo would come out nearly white.
        return Image.fromarray(_to_uint8(np.asarray(image), index, sixteen_bit=True), "L").convert("RGB")
    try:
        return image.convert("RGB")  # 1, L, P, CMYK, YCbCr, HSV, LAB, and F on PIL's 0..255 scale
    except (ValueError, OSError) as exc:
        raise ValueError(f"{_where(index)}cannot convert a PIL image of mode {image.mode!r} to RGB ({exc})") from exc


def _array_to_rgb(a: np.ndarray, index: int | None):
    from PIL import Image

    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
        hint = ""
        if a.ndim == 4:
            hint = " (a batch? pass a list of images)"
        elif a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] > 4:
            hint = " (channels first? pass array.transpose(1, 2, 0))"
        raise ValueError(
            f"{_where(index)}an image array must be (H, W) or (H, W, C) with C in (1, 3, 4); got shape {a.shape}{hint}"
        )
    if a.size == 0:
        raise ValueError(f"{_where(index)}empty image array of shape {a.shape}")
    a8 = np.ascontiguousarray(_to_uint8(a, index))
    mode = "L" if a8.ndim == 2 else ("RGB" if a8.shape[-1] == 3 else "RGBA")
    return _pil_to_rgb(Image.fromarray(a8, mode), index)


def _open_to_rgb(path: str | os.PathLike, index: int | None):
    from PIL import Image, ImageOps, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        note = " (process_images reads local files only; it never downloads)" if "://" in str(path) else ""
        raise FileNotFoundError(f"{_where(index)}no image file at {str(path)!r}{note}")
    try:
        with Image.open(p) as im:
            # Upright as the camera meant it, like transformers' own load_image; the copy it
            # returns holds the pixels after the file is closed.
            im = ImageOps.exif_transpose(im)
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{_where(index)}{str(path)!r} is not an image file PIL can read ({exc})") from exc
    return _pil_to_rgb(im, index)


def to_rgb(image, index: int | None = None):
    """Any image a user holds → an 8-bit RGB PIL image.

    Accepts a PIL image in any mode (alpha and palette transparency composited on
    ``ALPHA_BACKGROUND``; 16-bit greyscale scaled to 8 bits; ``F`` on PIL's 0..255 scale), a numpy
    array (H, W) or (H, W, C) with C in 1, 3, 4 of dtype uint8, uint16, bool or float in [0, 1],
    or a path to an image file. Anything else raises ``TypeError``/``ValueError`` (or
    ``FileNotFoundError``) naming the offending type, shape, dtype or path, prefixed by
    ``image {index}:`` when ``index`` is given.
    """
    from PIL import Image

    if isinstance(image, Image.Image):
        if image.width < 1 or image.height < 1:
            raise ValueError(f"{_where(index)}empty {image.width}x{image.height} image")
        return _pil_to_rgb(image, index)
    if isinstance(image, np.ndarray):
        return _array_to_rgb(image, index)
    if isinstance(image, (str, os.PathLike)):
        return _open_to_rgb(image, index)
    tensor = isinstance(image, torch.Tensor)
    hint = " (a torch tensor? pass tensor.permute(1, 2, 0).numpy() for a (C, H, W) one)" if tensor else ""
    raise TypeError(
        f"{_where(index)}expected a PIL image, a numpy array (H, W[, C]) or a file path, "
        f"got {type(image).__name__}{hint}"
    )


# --------------------------------------------------------------------------------------------
# The processor
# --------------------------------------------------------------------------------------------


def _known_processor(source):
    """The processor ``source`` names or carries, or None when it carries none (see processor_for)."""
    from transformers import Lfm2VlImageProcessor

    if isinstance(source, (str, Preset)):
        return make_processor(source)
    if isinstance(source, Lfm2VlImageProcessor):
        return source
    if isinstance(getattr(source, "image_processor", None), Lfm2VlImageProcessor):
        return source.image_processor  # a full Lfm2VlProcessor (tokenizer + image processor)
    proc = getattr(source, "lab_processor", None)  # set by load_model
    if proc is not None:
        return proc
    preset = getattr(source, "lab_preset", None)  # set by build_model (and load_model on a match)
    return make_processor(preset) if preset is not None else None


def processor_for(model_or_preset):
    """The ``Lfm2VlImageProcessor`` for a preset name, a :class:`Preset`, a model from
    ``build_model`` or ``load_model``, or an (image) processor itself.

    A loaded model carries its folder's processor (``model.lab_processor``); a built one its
    preset. Raises ``ValueError`` when the model carries neither.
    """
    proc = _known_processor(model_or_preset)
    if proc is None:
        raise ValueError(
            f"no image processor is known for this {type(model_or_preset).__name__}: pass a preset name "
            f"({', '.join(available_presets())}), a model from build_model, a model from load_model whose folder "
            "holds preprocessor_config.json (or matches a preset), or set model.lab_processor to an "
            "Lfm2VlImageProcessor"
        )
    return proc


def image_limits(model_or_preset) -> ImageLimits:
    """The :class:`ImageLimits` of a preset, a model or a processor, read from the processor itself
    (so a loaded checkpoint's own settings count). A model that carries no processor gets the
    defaults of transformers' ``Lfm2VlImageProcessor``."""
    from transformers import Lfm2VlImageProcessor

    proc = _known_processor(model_or_preset)
    return ImageLimits.of(proc if proc is not None else Lfm2VlImageProcessor())


def process_images(images, model_or_preset, return_row_col_info: bool = False, device=None) -> dict:
    """Run the real processor on images → dict of tensors.

    ``images``: one image or a list; each anything :func:`to_rgb` accepts (PIL in any mode, numpy
    arrays, file paths). ``model_or_preset``: anything :func:`processor_for` accepts.

    ``device`` (default: the CPU, as transformers does): where the processor resizes, normalises and
    patchifies. transformers' torchvision processor (5.17 to 5.20) moves each uint8 image there
    first, so ``device="cuda"`` returns ``pixel_values`` and ``pixel_attention_mask`` on the GPU;
    ``spatial_shapes`` stays on the CPU, where the encoder reads it without a sync. The GPU resizes
    with its own kernels, so its pixel values may differ slightly from the CPU's
    (:func:`lfm2vl_lab.measure.image_path.compare_processors` measures by how much).

    Returns ``pixel_values`` (items, max_num_patches, 3·p·p), ``pixel_attention_mask`` (items,
    max_num_patches) and ``spatial_shapes`` (items, 2) in patches; one image may become several
    items (tiles + thumbnail).
    """
    if not isinstance(images, (list, tuple)):
        images = [images]
    if len(images) == 0:
        raise ValueError("process_images got an empty list of images")
    # Writable (H, W, 3) uint8 copies (torch warns on read-only arrays), with the layout stated:
    # left to guess, transformers warns "The channel dimension is ambiguous" for an image with a
    # side of 1 or 3 px and then reads it channels-first.
    arrays = [np.array(to_rgb(im, i)) for i, im in enumerate(images)]
    proc = processor_for(model_or_preset)
    kw = {"device": device} if device is not None else {}
    out = proc(images=arrays, return_tensors="pt", input_data_format="channels_last",
               return_row_col_info=return_row_col_info, **kw)
    return dict(out)


def item_image(inputs: dict, i: int, model_or_preset="tiny") -> np.ndarray:
    """Item ``i`` of the processor's output turned back into an (H, W, 3) image in [0, 1]
    (un-patchify the real rows, undo the normalisation) — to look at what the encoder sees."""
    proc = processor_for(model_or_preset)
    ps = proc.encoder_patch_size
    h, w = (int(v) for v in inputs["spatial_shapes"][i].tolist())
    rows = inputs["pixel_values"][i, : h * w].float()
    img = rows.reshape(h, w, ps, ps, 3).permute(0, 2, 1, 3, 4).reshape(h * ps, w * ps, 3)
    mean, std = torch.tensor(proc.image_mean), torch.tensor(proc.image_std)
    return (img * std + mean).clamp(0, 1).numpy()
