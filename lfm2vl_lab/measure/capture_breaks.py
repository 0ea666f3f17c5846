"""What breaks a CUDA-graph capture: tried on a GPU, and the host reads among it found on any machine.

A capture records work and runs none of it (notebook 02, section 2). :func:`capture_outcome` tries a
body with the kit's recipe and reports the first error; :func:`capture_errors` tries the constructs
of notebook 02's table (:func:`host_read_cases`). Both need CUDA.

A step that needs a tensor's *value* on the host (``.item()``, ``.tolist()``, ``int(t)``, a boolean
mask, ``nonzero``) has nothing to read during a capture. A tensor on the ``meta`` device has a shape
and no value at all, so the same steps fail there too, on a CPU as on a GPU: :func:`meta_outcome`
runs a body on meta tensors (:func:`to_meta`) and reports the first error and the line that raised
it. That check finds host reads only. A copy from pageable host memory, which capture also refuses,
reads no value, so the meta device lets it through: a body that runs on meta may still fail to
capture, but one that fails on meta cannot be captured.
"""

from __future__ import annotations

import copy
import dataclasses
import traceback
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from ..core.capture import capture_graph, recover_from_failed_capture
from .table import short_error

EMPTY_GRAPH = "The CUDA Graph is empty"  # torch's warning when a capture ends with nothing recorded
META = "meta"


def first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``: how results and notebooks show an error."""
    return f"{type(exc).__name__}: {short_error(exc)}"


def host_read_cases(device) -> dict[str, Callable[[], object]]:
    """The constructs of notebook 02's "What breaks capture" on a 4-element tensor on ``device``:
    two host reads, a copy from pageable host memory to ``device``, and the same arithmetic with no
    host read (the control)."""
    v = torch.randn(4, device=device)
    return {".item()": lambda: (v * 2).sum().item(), ".tolist()": lambda: (v * 2).tolist(),
            "pageable CPU->GPU copy": lambda: v + torch.ones(4).to(device), "v * 2 (no host read)": lambda: v * 2}


def capture_outcome(fn: Callable[[], object]) -> dict:
    """Capture ``fn`` with the kit's recipe (:func:`~lfm2vl_lab.core.capture.capture_graph`):
    ``{"captured": True}``, or ``False`` and the first error (a failed capture's ``capture_end``
    may raise a second one; its ``__context__`` is the cause), after which
    :func:`~lfm2vl_lab.core.capture.recover_from_failed_capture` puts torch's stream and RNG back.
    ``empty_graph``: the capture ended with nothing recorded, because ``fn`` failed before its first
    kernel (torch warns "The CUDA Graph is empty" then; the warning is caught here and said so)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            capture_graph(fn, warmup=1)
            outcome = {"captured": True, "error": None}
        except Exception as exc:  # whatever capture raises is the answer
            cause = exc.__context__ if exc.__context__ is not None else exc
            recover_from_failed_capture()
            torch.cuda.synchronize()
            outcome = {"captured": False, "error": first_line(cause)}
    empty = [w for w in seen if str(w.message).startswith(EMPTY_GRAPH)]
    for w in seen:
        if w not in empty:  # anything else is not ours to hide
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return outcome | {"empty_graph": bool(empty)}


def capture_errors(device="cuda") -> dict:
    """The constructs of :func:`host_read_cases`, each tried with :func:`capture_outcome`."""
    return {name: capture_outcome(fn) for name, fn in host_read_cases(device).items()}


def to_meta(obj):
    """A copy of ``obj`` on the meta device: a tensor, a module (deep-copied first, so ``obj`` stays
    where it is), a dict or list of them, or a dataclass such as a ``PackedBatch`` (its tensor fields
    moved, its Python fields such as ``max_seqlen`` kept). Anything else is returned as it is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(META)
    if isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj).to(META)
    if isinstance(obj, Mapping):  # a dict, or the processor's BatchFeature
        return {k: to_meta(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_meta(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_meta(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if isinstance(getattr(obj, f.name), torch.Tensor)})
    return obj


def _raised_at(exc: BaseException) -> str | None:
    """``"file.py:123: source line"`` of the innermost frame outside torch that led to ``exc``."""
    torch_dir = str(Path(torch.__file__).parent)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)]
    if not frames:
        return None
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno}: {(f.line or '').strip()}"


def meta_outcome(fn: Callable[[], object]) -> dict:
    """Run ``fn`` (which should use meta tensors: :func:`to_meta`) under ``torch.no_grad``:
    ``{"ran": True}``, or ``False``, the first error and ``at``, the line outside torch that raised it."""
    try:
        with torch.no_grad():
            fn()
    except Exception as exc:  # whatever the meta device refuses is the answer
        return {"ran": False, "error": first_line(exc), "at": _raised_at(exc)}
    return {"ran": True, "error": None, "at": None}


def meta_errors() -> dict:
    """The constructs of :func:`host_read_cases`, each run on meta tensors with :func:`meta_outcome`."""
    return {name: meta_outcome(fn) for name, fn in host_read_cases(META).items()}
