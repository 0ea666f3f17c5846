"""Command-line values: argparse types that check every value while parsing, and the parsers
behind them (usable from Python too).

A bad value is argparse's one-line ``error: argument --x: <message>`` and exit status 2, before
anything is built. A problem found only after parsing (a GPU-only command on a machine without
CUDA) is a :class:`UsageError`, which ``python -m lfm2vl_lab`` reports the same way.

Importing this module imports no torch (``--help`` must not wait for it): the parsers that need it
import it when they run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


def arg_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse ``type=`` from ``parse(text)``: its ``ValueError`` becomes argparse's one-line
    ``error: argument --x: <message>`` and exit status 2 (argparse would swallow the message)."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def choice_arg(kind: str, allowed, lower: bool = False):
    """argparse type: one of ``allowed`` (``lower``: case-insensitive, returned lower-cased)."""
    def parse(text: str) -> str:
        value = text.strip().lower() if lower else text.strip()
        check_choice(kind, value, allowed)
        return value

    return arg_type(parse, kind)


def int_arg(minimum: int):
    """argparse type: an int ``>= minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise ValueError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return arg_type(parse, f"int >= {minimum}")


def list_arg(item_type: Callable[[str], Any]):
    """argparse type: a comma list, each part through ``item_type`` (an argparse type); a list."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise ValueError(f"expected a comma list, got {text!r}")
        return [item_type(p) for p in parts]

    return arg_type(parse, f"list of {getattr(item_type, '__name__', 'values')}")


def preset_arg(text: str) -> str:
    """argparse type: a preset name (``presets.available_presets()``)."""
    from ..model.presets import available_presets

    return choice_arg("preset", available_presets())(text)


def flatten(lists) -> list:
    """Repeated list options (``action="append"`` of comma lists) → one list, order kept."""
    return [v for values in lists or [] for v in values]


def _workloads(text: str) -> list[str]:
    from .workloads import expand_workloads  # imports torch: only once a value is parsed

    return expand_workloads(text)


on_off_list = list_arg(lambda t: ON_OFF[choice_arg("value", tuple(ON_OFF), lower=True)(t)])
device_arg = arg_type(parse_device, "device")
budgets_arg = arg_type(parse_budgets, "budget set")
workloads_arg = arg_type(_workloads, "workloads")
dtype_arg = choice_arg("dtype", tuple(DTYPES), lower=True)
positive_int = int_arg(1)
