"""What every notebook shares: its first cell's :func:`setup` (``shows`` lists what the notebook shows
live and what from recorded results), and :func:`load_recorded`, which reads one role of the
reference set and says where its numbers come from before any is shown."""

from __future__ import annotations

import os
import platform
import sys
import warnings
from pathlib import Path

import torch

from ..kernels.attention import cuda_capability, resolve_attention, sm
from ..measure.results import RESULTS_ROOT, gpu_slug, recorded_label
from ..measure.workloads import default_device, device_defaults
from ..model.presets import CHECKPOINT_ENV, checkpoint_from_env
from . import reference

RECORDED_GPU = gpu_slug(reference.REFERENCE_GPU)  # whose recorded results the notebooks read: data/results/nvidia-h200/
# GraphedEncoder's one warning without CUDA (core/graphed_encoder.py), and what a notebook's first cell says instead
CPU_FALLBACK_WARNING = "GraphedEncoder: no CUDA device"
CPU_FALLBACK_NOTE = ("note: no CUDA device, so GraphedEncoder.encode() runs the packed eager encoder here (no graphs); "
                     "its stats count those calls as eager_calls")
SHOW_KINDS = ("any", "gpu", "recorded")  # live everywhere; live on a CUDA device, else recorded; always recorded


def environment_lines(device, shows: dict[str, str]) -> list[str]:
    """The environment check as printed lines: the device (a GPU: its name, capability and free memory),
    library versions, the model and the attention ``"auto"`` picks there, then what the notebook shows
    live here and what from recorded results (``shows`` maps a part to one of :data:`SHOW_KINDS`)."""
    import transformers

    if bad := {part: kind for part, kind in shows.items() if kind not in SHOW_KINDS}:
        raise ValueError(f"setup(shows=...): kinds must be one of {SHOW_KINDS}; got {bad}")
    preset, dtype = device_defaults(device)
    try:
        folder, problem = checkpoint_from_env(), None
    except ValueError as exc:  # a value that names no folder: said in the check, not raised from the first cell
        folder, problem = None, str(exc)
    where = "no CUDA GPU: " + ("the checkpoint runs on the CPU (slowly)" if folder else
                               "the tiny preset runs on the CPU")
    if (cap := cuda_capability(device)) is not None:
        free, total = (b / 2**30 for b in torch.cuda.mem_get_info(torch.device(device)))
        where = f"{torch.cuda.get_device_name(torch.device(device))} (sm{sm(cap)}), {free:.1f} of {total:.1f} GiB free"
    model = f"the checkpoint {folder.name} (from {CHECKPOINT_ENV})" if folder else preset
    live = [p for p, k in shows.items() if k == "any" or (k == "gpu" and cap is not None)]
    recorded = [p + (" (needs a GPU)" if k == "gpu" else "") for p, k in shows.items() if p not in live]
    lines = [f"environment: {where}; torch {torch.__version__}, transformers {transformers.__version__}, "
             f"Python {platform.python_version()}",
             f"  model: {model} in {str(dtype).removeprefix('torch.')}; encoder attention (auto): "
             f"{resolve_attention('auto', device, dtype)[0]}",
             problem and f"  checkpoint: none: {problem}", live and "  live here: " + "; ".join(live),
             recorded and f"  from recorded {RECORDED_GPU} results: " + "; ".join(recorded)]
    return [line for line in lines if line]


def setup(device=None, shows: dict[str, str] | None = None) -> tuple[str, str, torch.dtype]:
    """Start a notebook: ``HF_HUB_OFFLINE=1`` unless set (it must precede transformers' import), then
    print the device and the kit's preset and dtype for it, the environment check (``shows``), and,
    without CUDA, once, that ``GraphedEncoder`` runs eagerly there. Returns ``(device, preset, dtype)``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hub = sys.modules.get("huggingface_hub.constants")  # imported before this call: hub access is settled
    if hub is not None and os.environ["HF_HUB_OFFLINE"] == "1" and not hub.HF_HUB_OFFLINE:
        warnings.warn("setup(): huggingface_hub was imported before HF_HUB_OFFLINE was set, so hub access "
                      "stays on in this kernel; call setup() first", stacklevel=2)
    device = str(device if device is not None else default_device())
    preset, dtype = device_defaults(device)
    print(f"DEVICE={device}  PRESET={preset}  DTYPE={dtype}  torch {torch.__version__}")
    if shows is not None:
        print("\n".join(environment_lines(device, shows)))
    if torch.device(device).type != "cuda":
        # said once here instead of as a warning box in whichever cell first encodes
        warnings.filterwarnings("ignore", message=CPU_FALLBACK_WARNING)
        print(CPU_FALLBACK_NOTE)
    return device, preset, dtype


def load_recorded(role: str, gpu: str = RECORDED_GPU, root=RESULTS_ROOT, partial: bool = False) -> dict | None:
    """``role``'s file of the reference set (``partial``: or its partial file), its source printed; or
    None, printing that the cells reading it skip and what records it."""
    res = reference.load(role, gpu, root, required=False, partial=partial)
    print(recorded_label(res) if res is not None else  # a partial file says so itself (``complete`` false)
          f"Not in the reference set: no {role!r} in data/results/{gpu_slug(gpu)}/{reference.MANIFEST} "
          "(`python -m lfm2vl_lab record` on the H200 records it); the cells that read it skip.")
    return res


def show(table) -> None:
    """A table helper's answer in a notebook: a DataFrame displayed, a "not recorded" line printed."""
    from IPython.display import display

    (print if isinstance(table, str) else display)(table)


def load_first_version(name: str, gpu: str = RECORDED_GPU, root=RESULTS_ROOT) -> dict:
    """An earlier run's file from the archive, announced as the first version beside today's reference set;
    its ``_path`` names the file as recorded (``name``), not the gzipped copy the archive keeps."""
    res = reference.load_archived(name, gpu, root)
    res["_path"] = str(Path(res["_path"]).with_name(name))
    print("the first version (archived, not the reference set): " + recorded_label(res))
    return res


def live_or_recorded(part: str, device, root=RESULTS_ROOT) -> dict | None:
    """A graph-API demo ``part`` run live on a CUDA ``device`` (said to be this machine's run), elsewhere
    the reference set's recorded ``part`` (None where not recorded)."""
    from ..measure.graph_apis import NAME, RECORDERS

    if torch.device(device).type == "cuda":
        print(f"measured now on {device}: this machine's live run, not the reference set's `{NAME}` file", flush=True)
        return RECORDERS[part](device)
    rec = load_recorded(NAME, root=root)
    return None if rec is None else rec.get(part)
