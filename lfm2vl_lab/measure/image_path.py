"""The image path before the encoder: the processor on the CPU or the GPU, and what feeding
``encode()`` from the host costs against input already on the device.

Why measure it: transformers' processor runs on the CPU, per image, and ``GraphedEncoder.encode`` fed
its padded float32 output was slower than from device-resident input, by more than the graphs left
to gain. :mod:`lfm2vl_lab.core.staging` now uploads only the real rows, in the model's dtype, from
pinned memory; :func:`time_encode_sources` checks what is left of that gap (target: within 1.05x; the
image-path rows of the reference set's ``ttft`` file hold what it measured).
The processor itself can run on the GPU (``process_images(..., device="cuda")``):
:func:`compare_processors` says whether its output is the same, :func:`time_processors` whether it
pays. Each function returns a plain dict, ready to be saved as one JSON result row.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..model.inputs import process_images, processor_for
from .timing import percentile, time_paired
from .workloads import to_device


def _count(images) -> int:
    return len(images) if isinstance(images, (list, tuple)) else 1


def _real_rows_diff(cpu_pv: torch.Tensor, dev_pv: torch.Tensor, shapes: list) -> torch.Tensor:
    """|cpu - device| over every item's real rows only (the padding rows are never read)."""
    dev_pv = dev_pv.detach().to("cpu", torch.float32)
    return torch.cat([(cpu_pv[i, : h * w].float() - dev_pv[i, : h * w]).abs() for i, (h, w) in enumerate(shapes)])


def compare_processors(images, model_or_preset, device) -> dict:
    """The processor's output on ``device`` against its output on the CPU, the reference (what
    transformers and the model's own preprocessing do by default).

    Why: the GPU resizes with other kernels than the CPU (torchvision's CUDA antialias path against
    its CPU uint8 one), so its pixel values may differ; the encoder must see the same patch grids and
    masks, and pixel values within a stated tolerance. ``max_diff_levels`` states the largest
    difference in uint8 levels of the source image (the normalised value times 255·std of its
    channel), the unit a resize kernel's rounding shows up in.
    """
    cpu = process_images(images, model_or_preset)
    dev = process_images(images, model_or_preset, device=device)
    shapes = [(int(h), int(w)) for h, w in cpu["spatial_shapes"].tolist()]
    same_shapes = all(k in dev and tuple(dev[k].shape) == tuple(cpu[k].shape) for k in cpu)
    row = {"kind": "processor_parity", "device": str(device), "images": _count(images),
           "items": len(shapes), "keys_equal": sorted(cpu) == sorted(dev), "shapes_equal": same_shapes,
           "pixel_values_device": str(dev["pixel_values"].device),
           "spatial_shapes_equal": torch.equal(cpu["spatial_shapes"], dev["spatial_shapes"].cpu()),
           "masks_equal": torch.equal(cpu["pixel_attention_mask"], dev["pixel_attention_mask"].cpu())}
    if not (same_shapes and row["spatial_shapes_equal"]):
        return {**row, "max_abs_diff": None, "mean_abs_diff": None, "max_diff_levels": None}
    diff = _real_rows_diff(cpu["pixel_values"], dev["pixel_values"], shapes)
    std = torch.tensor(processor_for(model_or_preset).image_std, dtype=torch.float32)
    levels = diff.view(-1, std.numel()) * std * 255  # rows are patches of (p, p, channels), channel last
    return {**row, "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "max_diff_levels": float(levels.max())}


def _medians(samples: dict[str, list[float]]) -> dict:
    return {f"{k}_ms_median": percentile(v, 50) for k, v in samples.items()}


def time_processors(images, model_or_preset, device, repeats: int = 20, warmup: int = 3) -> dict:
    """The processor on the CPU against the processor on ``device``, in alternating turns, ms per
    call from the images to the output dict (median and samples).

    Why alternating: the two share the host (the GPU processor still converts each image and
    launches its kernels from it), so a drift of the machine lands on both alike. The device
    timing ends when the device's output is ready: :func:`~.timing.time_call` synchronises on an
    event recorded after the call (on the CPU it reads the clock), so queued kernels are counted.
    ``speedup`` = CPU ms / device ms (above 1: the device processor pays).
    """
    device = torch.device(device)
    samples = time_paired({"cpu": lambda: process_images(images, model_or_preset),
                           "device": lambda: process_images(images, model_or_preset, device=device)},
                          repeats, warmup, device)
    med = _medians(samples)
    return {"kind": "processor_time", "device": str(device), "images": _count(images),
            "repeats": repeats, **med, "cpu_ms": samples["cpu"], "device_ms": samples["device"],
            "speedup": med["cpu_ms_median"] / med["device_ms_median"] if med["device_ms_median"] else None}


def on_device(inputs: dict, device) -> dict:
    """The processor's output with its tensors on ``device``, except ``spatial_shapes``, which the
    encoder reads on the host (on the device, reading it would cost a sync)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) and k != "spatial_shapes" else v
            for k, v in inputs.items()}


@contextmanager
def _unstaged(genc):
    """Within the block, ``genc`` uploads host input padded and in float32, as before staging."""
    adapter = genc.adapter
    before, adapter.stage_rows = adapter.stage_rows, False
    try:
        yield
    finally:
        adapter.stage_rows = before


@contextmanager
def _chunked(genc, chunk_rows: int):
    """Within the block, ``genc``'s stager gathers and uploads in chunks of ``chunk_rows`` rows."""
    stager = genc.adapter._stager()
    before, stager.chunk_rows = stager.chunk_rows, chunk_rows
    try:
        yield
    finally:
        stager.chunk_rows = before


def time_encode_sources(genc, inputs: dict, repeats: int = 20, warmup: int = 3, padded: bool = True,
                        chunk_rows: int | None = None) -> dict:
    """``genc.encode`` fed the CPU processor's output against the same inputs already on the GPU,
    in alternating turns (:func:`~.timing.time_paired`): medians, samples and ``ratio`` = host-fed
    ms / device-fed ms (the goal: at most 1.05 at 1x512 and 4x512, docs/goals.md). ``padded``: a third
    alternative, ``cpu_padded``, feeds the host input the way it went before staging (the whole
    padded float32 tensor, ``stage_rows=False``), so one row holds the before and the after.

    Why: an engine receives the processor's output on the host, so the upload is part of the
    encoder's cost; the device-fed time is the floor. The device-fed input is the benchmark's
    (:func:`~.workloads.to_device`: pixel values already in the model's dtype), so the floor is
    the one the recorded encoder timings were taken from. ``chunk_rows`` adds ``cpu_chunked``: the
    stager pipelines its gather and upload in chunks of that many rows (``RowStager``).
    ``outputs_equal`` checks that both sources
    give bit-identical embeddings (staging casts to the model's dtype, which the encoder does
    first anyway), and ``staging`` shows the stager's counters (host waits on a pinned buffer,
    growths): a host-fed call must not wait for the device.
    """
    dev_inputs = to_device(inputs, genc.device, genc.encoder.dtype)
    with torch.no_grad():
        a, b = genc.encode(inputs), genc.encode(dev_inputs)
    equal = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    calls = {"cpu": lambda: genc.encode(inputs), "gpu": lambda: genc.encode(dev_inputs)}
    if padded:
        calls["cpu_padded"] = (lambda: genc.encode(inputs), lambda: _unstaged(genc))
    if chunk_rows:
        calls["cpu_chunked"] = (lambda: genc.encode(inputs), lambda: _chunked(genc, chunk_rows))
    samples = time_paired(calls, repeats, warmup, genc.device)
    med = _medians(samples)
    ratio = {k: med[f"{k}_ms_median"] / med["gpu_ms_median"] if med["gpu_ms_median"] else None
             for k in calls if k != "gpu"}
    stager = genc.adapter.stager
    return {"kind": "encode_sources", "device": str(genc.device), "items": len(a), "captured": genc.captured,
            "tokens": sum(int(t.shape[0]) for t in a), "repeats": repeats, "outputs_equal": equal,
            **med, **{f"{k}_ms": v for k, v in samples.items()}, "ratio": ratio["cpu"],
            **({"ratio_padded": ratio["cpu_padded"]} if padded else {}),
            **({"ratio_chunked": ratio["cpu_chunked"], "chunk_rows": chunk_rows} if chunk_rows else {}),
            "staging": stager.info() if stager is not None else None}


def staging_split(genc, inputs: dict, repeats: int = 30) -> dict:
    """Where a host-fed call's extra time goes: the host gather (the real rows cast into pinned
    memory, ``perf_counter``) and the upload alone (CUDA events, from an idle device), medians over
    ``repeats``; ``threads`` is torch's intra-op thread count, which the gather's ``copy_`` uses."""
    import time

    from ..core.staging import gather_rows
    from .timing import time_call

    pv = inputs["pixel_values"]
    shapes = [tuple(int(v) for v in s) for s in inputs["spatial_shapes"].tolist()]
    total, dt = sum(h * w for h, w in shapes), genc.encoder.dtype
    host = torch.empty(total, pv.shape[2], dtype=dt, pin_memory=True)
    dev = torch.empty(total, pv.shape[2], dtype=dt, device=genc.device)
    gather, upload = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gather_rows(pv, shapes, host)
        gather.append((time.perf_counter() - t0) * 1e3)
        upload.append(time_call(lambda: dev.copy_(host, non_blocking=True), genc.device)[0])
    nbytes = host.numel() * host.element_size()
    up = percentile(upload, 50)
    return {"kind": "staging_split", "rows": total, "bytes": nbytes, "threads": torch.get_num_threads(),
            "gather_ms_median": percentile(gather, 50), "upload_ms_median": up,
            "upload_gb_s": nbytes / up / 1e6 if up else None, "gather_ms": gather, "upload_ms": upload}


IMAGE_PATH_WORKLOADS = ("1x512", "4x512", "tiled")  # the target's two workloads, and a tiled image
CHUNK_ROWS = 512  # the pipelined staging variant timed beside the default (one gather, one upload)


def image_path_rows(model, genc, workloads=IMAGE_PATH_WORKLOADS, repeats: int = 30) -> list[dict]:
    """What ``python -m lfm2vl_lab ttft --image-path`` records per workload: ``encode()`` from the
    CPU processor's output against GPU-resident input (:func:`time_encode_sources`; its ``ratio`` is
    the target), and the processor on the model's device against the CPU one, compared
    (:func:`compare_processors`) and timed (:func:`time_processors`), and on CUDA the host-fed
    call's extra cost split into gather and upload (:func:`staging_split`). Sample lists are kept."""
    from ..model.inputs import process_images
    from .workloads import workload_images

    rows = []
    for w in workloads:
        images = workload_images(w)
        inputs = process_images(images, model)
        cuda = model.device.type == "cuda"
        rows.append({"workload": w, **time_encode_sources(genc, inputs, repeats=repeats,
                                                          chunk_rows=CHUNK_ROWS if cuda else None)})
        if cuda:
            rows.append({"workload": w, **staging_split(genc, inputs, repeats=repeats)})
            rows.append({"workload": w, "kind": "processor_compare", **compare_processors(images, model, model.device)})
            rows.append({"workload": w, **time_processors(images, model, model.device, repeats=repeats)})
    return rows
