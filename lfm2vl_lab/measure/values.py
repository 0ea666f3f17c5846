"""Values a user gives the kit, checked: a dtype, a device, a budget set, a choice from a list; and
:class:`UsageError`, bad input found after parsing. The measurements call these parsers directly, and
the command line's argparse types (:mod:`.args`) wrap them, so each value is checked in one place
and a bad one is one line naming it.

Importing this module imports no torch (``--help`` must not wait for it): the parsers that need it
import it when they run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# a dtype's names on the command line -> its name in torch
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}
ON_OFF = {"on": True, "off": False}


class UsageError(ValueError):
    """Bad command-line input found after parsing (e.g. a GPU-only command on a machine without
    CUDA). ``python -m lfm2vl_lab`` prints it as one ``error:`` line and exits with status 2."""


def check_choice(kind: str, value, allowed) -> None:
    """Raise ``ValueError("unknown <kind> <value>; choose from ...")`` unless ``value`` is allowed."""
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}; choose from {', '.join(map(str, allowed))}")


def parse_dtype(dtype) -> torch.dtype:
    """``"bf16"``, ``"float32"``, … (case-insensitive) or a ``torch.dtype`` → the ``torch.dtype``."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    check_choice("dtype", str(dtype).lower(), DTYPES)
    return getattr(torch, DTYPES[str(dtype).lower()])


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``: how result files name a dtype."""
    return str(dtype).replace("torch.", "")


def parse_device(spec) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` (or a ``torch.device``) → ``torch.device``. A CUDA device
    on a machine without CUDA, or an index past the last GPU, is a ``ValueError`` naming it."""
    import torch

    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {str(spec)!r}; choose from cpu, cuda, cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(spec)!r} requested but CUDA is not available on this machine; use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(spec)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def parse_budgets(spec) -> list[int] | None:
    """``"auto"``/None → None (automatic budgets); ``"64,256,1024"`` or a list → sorted positive ints."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return None
    parts = [s for s in spec.replace(" ", "").split(",") if s] if isinstance(spec, str) else list(spec)
    try:
        budgets = sorted(int(b) for b in parts)
    except (TypeError, ValueError):
        budgets = []
    if not budgets or budgets[0] < 1:
        raise ValueError(f"budget set {spec!r}: use 'auto' or a comma list of positive token counts")
    return budgets
