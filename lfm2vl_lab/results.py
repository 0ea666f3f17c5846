"""Recorded results: provenance and where result JSON lives (``data/results/<gpu-slug>/``)."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import sys
from pathlib import Path

import torch

RESULTS_ROOT = Path(__file__).resolve().parent.parent / "data" / "results"


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def device_slug(name: str | None = None) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (name or device_name()).lower()).strip("-")


def provenance(command: str, **extra) -> dict:
    """Who measured what, where and when: attached to every result file."""
    import transformers

    return {
        "gpu": device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host_cpu": platform.processor() or platform.machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv),
        **extra,
    }


def save_result(result: dict, name: str, root=None) -> Path:
    """Write ``<root>/<gpu-slug>/<name>-<UTC timestamp>.json`` and return the path."""
    root = Path(root) if root is not None else RESULTS_ROOT
    folder = root / device_slug(result.get("provenance", {}).get("gpu"))
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = folder / f"{name}-{stamp}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    return path


def load_results(root=None, pattern: str = "*.json") -> list[dict]:
    """Every result file under ``root`` (each dict gains ``_path``), oldest first."""
    root = Path(root) if root is not None else RESULTS_ROOT
    out = []
    for p in sorted(root.glob(f"**/{pattern}")):
        d = json.loads(p.read_text())
        d["_path"] = str(p)
        out.append(d)
    return out
