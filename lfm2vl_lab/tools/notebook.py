"""What every notebook shares: its first cell's setup, and reading recorded results.

The first cell of each notebook is::

    %matplotlib inline
    import torch
    import lfm2vl_lab as lab
    from lfm2vl_lab.tools.notebook import setup

    DEVICE, PRESET, DTYPE = setup()

and cells that show recorded GPU numbers start with :func:`load_recorded`, which prints where the
numbers come from (or that they are not recorded yet) before any of them is shown.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

from .results import RESULTS_ROOT, gpu_slug, newest, recorded_label
from .workloads import default_device, device_defaults

RECORDED_GPU = "nvidia-h200"  # the GPU whose recorded results the notebooks read: data/results/nvidia-h200/


def setup(device=None) -> tuple[str, str, torch.dtype]:
    """Start a notebook: hub access off, then the device and the kit's model choice for it.

    ``HF_HUB_OFFLINE=1`` is set unless the environment says otherwise (presets build random-weight
    models, so nothing is ever downloaded); it has to happen before transformers is first imported,
    which ``import lfm2vl_lab`` does not do. ``device`` defaults to CUDA when available, else the CPU;
    the preset and dtype come from :func:`lfm2vl_lab.tools.workloads.device_defaults`. Prints the
    line every notebook's output starts with and returns ``(device, preset, dtype)``.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "huggingface_hub" in sys.modules and os.environ["HF_HUB_OFFLINE"] == "1":
        from huggingface_hub import constants

        if not constants.HF_HUB_OFFLINE:
            warnings.warn("setup(): huggingface_hub was imported before HF_HUB_OFFLINE was set, so hub access "
                          "stays on in this kernel; call setup() first", stacklevel=2)
    device = str(device if device is not None else default_device())
    preset, dtype = device_defaults(device)
    print(f"DEVICE={device}  PRESET={preset}  DTYPE={dtype}  torch {torch.__version__}")
    return device, preset, dtype


def load_recorded(name: str, how: str | None = None, gpu: str = RECORDED_GPU, root=RESULTS_ROOT,
                  **provenance) -> dict | None:
    """The newest recorded ``<name>-*.json`` of ``gpu`` whose provenance has the given values (see
    :func:`lfm2vl_lab.tools.results.newest`), announced: prints its :func:`recorded_label`, or, when
    there is none, that the cells reading it skip (``how``: the command that records one).
    Returns the result, or None."""
    res = newest(f"{name}-*.json", gpu, root, **provenance)
    if res is not None:
        print(recorded_label(res))
        return res
    writer = f" ({how} writes one)" if how else ""
    print(f"Not recorded yet: no {name}-*.json in data/results/{gpu_slug(gpu)}/{writer}; the cells that read it skip.")
    return None
