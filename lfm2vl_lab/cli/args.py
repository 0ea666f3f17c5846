"""Command-line values: argparse types that check every value while parsing, through the parsers
of :mod:`.values`.

A bad value is argparse's one-line ``error: argument --x: <message>`` and exit status 2, before
anything is built. A problem found only after parsing (a GPU-only command on a machine without
CUDA) is a :class:`~.values.UsageError`, which ``python -m lfm2vl_lab`` reports the same way.

Importing this module imports no torch (``--help`` must not wait for it): the parsers that need it
import it when they run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..measure.values import DTYPES, ON_OFF, check_choice, parse_budgets, parse_device


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
    from ..measure.workloads import expand_workloads  # imports torch: only once a value is parsed

    return expand_workloads(text)


on_off_list = list_arg(lambda t: ON_OFF[choice_arg("value", tuple(ON_OFF), lower=True)(t)])
device_arg = arg_type(parse_device, "device")
budgets_arg = arg_type(parse_budgets, "budget set")
workloads_arg = arg_type(_workloads, "workloads")
dtype_arg = choice_arg("dtype", tuple(DTYPES), lower=True)
positive_int = int_arg(1)
