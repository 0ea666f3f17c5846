"""Recorded results: provenance, and where result JSON lives (``data/results/<gpu-slug>/``).

Every GPU figure in the repo comes from a file written here by a real run: the file carries the
GPU name, library versions, preset, dtype, date, the exact command, the git commit (where the machine
had one) and ``code_hash``, a content hash of the code that any commit of the repo can be checked
against (:mod:`lfm2vl_lab.report.reference`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

# No torch at import: the command line's --help reads RESULTS_ROOT (provenance and the JSON writer import it).

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_ROOT = REPO_ROOT / "data" / "results"
FIGURES_ROOT = RESULTS_ROOT.parent / "figures"  # where `python -m lfm2vl_lab report` writes the PNGs
# What makes the numbers: the package's Python files, the C++ sources it builds (core/ptrcheck.cpp, the
# weight stamp's check on every call) and the model presets. Their content hash is the code version a
# result names (git's own commit id is no help on a machine that got a copy of the tree).
CODE_PATHS = (("lfm2vl_lab", ".py"), ("lfm2vl_lab", ".cpp"), ("data/presets", ".json"))


def gpu_slug(name: str) -> str:
    """``"NVIDIA H200"`` → ``"nvidia-h200"``; ``"cpu"`` → ``"cpu"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown"


def _host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blob_sha1(data: bytes) -> str:
    """git's object id of a file with these bytes (``git hash-object``), computed without git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hash_code_entries(entries) -> str:
    """The code hash of ``(path, blob id)`` pairs: sha256 over the sorted ``"<blob id> <path>"`` lines.
    Built on blob ids so that ``git ls-tree`` of any commit gives the same value (see
    :func:`lfm2vl_lab.report.reference.code_hash_at`)."""
    lines = "".join(f"{sha} {path}\n" for path, sha in sorted(entries))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def is_code_path(path: str) -> bool:
    """Whether a repo-relative posix path is part of the hashed code (:data:`CODE_PATHS`)."""
    return any(path.startswith(folder + "/") and path.endswith(ext) for folder, ext in CODE_PATHS)


def code_hash(root: Path = REPO_ROOT) -> str:
    """The content hash of the code under ``root`` that makes the numbers (:data:`CODE_PATHS`):
    every ``*.py`` and ``*.cpp`` of ``lfm2vl_lab/`` and ``*.json`` of ``data/presets/``, caches left out."""
    entries = []
    for folder, ext in CODE_PATHS:
        for f in (Path(root) / folder).rglob(f"*{ext}"):
            rel = f.relative_to(root).as_posix()
            if "__pycache__" not in rel and is_code_path(rel):
                entries.append((rel, blob_sha1(f.read_bytes())))
    return hash_code_entries(entries)


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        # a tree that differs from its HEAD is not that commit (on the device the copied tree's .git
        # is stale): code_hash alone names its code then
        return None if dirty.stdout.strip() else head.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(command: str | None = None, device=None, **extra) -> dict:
    """Where and how numbers were made: GPU, library versions, date, command, host CPU, git commit.

    ``extra`` (dtype, preset, …) is merged in. ``gpu`` is the CUDA device name, or ``"cpu"`` when
    ``device`` (default: CUDA if available) is not a CUDA device.
    """
    import torch
    import transformers

    from .workloads import default_device

    dev = torch.device(device) if device is not None else default_device()
    on_cuda = dev.type == "cuda" and torch.cuda.is_available()
    prov = {
        "gpu": torch.cuda.get_device_name(dev) if on_cuda else "cpu",
        "device": dev.type,
        "gpu_count": torch.cuda.device_count() if on_cuda else 0,
        "cuda": torch.version.cuda if on_cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host_cpu": _host_cpu(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "git_commit": _git_commit(),
        "code_hash": code_hash(),
    }
    prov.update(extra)
    return prov


def save_result(result: dict, root=RESULTS_ROOT, name: str | None = None, path: Path | None = None) -> Path:
    """Write ``result`` to ``<root>/<gpu-slug>/<name>-<timestamp>.json`` (never overwrites another
    run's file). ``path``: rewrite this run's own file instead (checkpoints of a long run, so a run
    cut short still leaves what it measured)."""
    if path is not None:
        path.write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
        return path
    prov = result.get("provenance", {})
    name = name or result.get("name") or "bench"
    try:
        stamp = datetime.fromisoformat(prov["date"]).strftime("%Y%m%d-%H%M%S")
    except (KeyError, ValueError):
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = Path(root) / gpu_slug(str(prov.get("gpu", "unknown")))
    folder.mkdir(parents=True, exist_ok=True)
    path, k = folder / f"{name}-{stamp}.json", 1
    while path.exists():
        path, k = folder / f"{name}-{stamp}-{k}.json", k + 1
    path.write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    return path



class ResultFile:
    """One run's result file, written again after every row or section (:func:`save_result` with its
    own ``path`` after the first write), so a run cut short by a time limit still leaves what it
    measured. ``save(result)`` returns the path; ``path`` is None until the first save."""

    def __init__(self, root=RESULTS_ROOT, name: str | None = None, path: Path | None = None):
        self.root, self.name, self.path = root, name, path

    def save(self, result: dict) -> Path:
        self.path = save_result(result, self.root, self.name, self.path)
        return self.path


def _json_default(obj):
    if isinstance(obj, Path):
        return str(obj)
    import torch  # a value JSON cannot write is a torch one here

    if isinstance(obj, torch.dtype):
        return str(obj).replace("torch.", "")
    if isinstance(obj, torch.device):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class UnreadableResultWarning(UserWarning):
    """A file under a results folder that could not be read as JSON (and so was left out)."""


def load_results(root=RESULTS_ROOT, pattern: str = "*.json", rows_only: bool = False) -> list[dict]:
    """Every result JSON under ``root`` (recursively) matching ``pattern``, oldest first; each
    gets ``"_path"``. ``rows_only`` keeps benchmark-shaped files (``provenance`` and ``rows``).

    A file that cannot be read or parsed is left out with an :class:`UnreadableResultWarning`
    naming it and the reason, so one broken file neither hides the others nor goes unnoticed.
    JSON that is not a result (no ``provenance``, e.g. a profiler trace) is skipped silently.
    """
    out = []
    for path in sorted(Path(root).rglob(pattern)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            warnings.warn(f"left out {path}: not readable as JSON ({type(exc).__name__}: {exc})",
                          UnreadableResultWarning, stacklevel=2)
            continue
        if isinstance(data, dict) and "provenance" in data and (not rows_only or isinstance(data.get("rows"), list)):
            data["_path"] = str(path)
            out.append(data)
    return sorted(out, key=lambda r: str(r["provenance"].get("date", "")))


def newest(pattern: str, gpu: str = "nvidia-h200", root=RESULTS_ROOT, **provenance) -> dict | None:
    """The newest recorded file matching ``pattern`` (by provenance date) whose provenance has the
    given values, or None. ``newest("bench-*.json", preset="lfm2-vl-450m", profile=True)``"""
    folder = Path(root) / gpu_slug(gpu)
    found = load_results(folder, pattern=pattern) if folder.is_dir() else []
    found = [r for r in found if all(r["provenance"].get(k) == v for k, v in provenance.items())]
    return found[-1] if found else None


def latest(name: str = "check", gpu: str = "nvidia-h200", root=RESULTS_ROOT) -> dict | None:
    """The newest recorded ``<name>-*.json`` for a GPU, or None."""
    return newest(f"{name}-*.json", gpu, root)


def shown_command(command: str | None) -> str | None:
    """A recorded command as a reader should see it: without ``--out DIR``, which names a folder
    of the machine it ran on (where the file was written, not how the numbers were made)."""
    return None if command is None else re.sub(r"\s--out(?:\s+|=)\S+", "", command)


def recorded_label(res: dict) -> str:
    """Where a recorded number comes from: its role in the reference set (if any), GPU, date, command,
    versions, file. Fields the file does not have (a run of several presets has no one preset) are
    left out, never printed as None."""
    p = res["provenance"]
    role = f"reference set, {res['_role']}: " if res.get("_role") else ""
    what = ", ".join(str(v) for v in (f"torch {p.get('torch')}", f"transformers {p.get('transformers')}",
                                      p.get("preset"), p.get("dtype")) if v is not None)
    by = f" by `{shown_command(p['command'])}`" if p.get("command") else ""
    return (f"{role}recorded on {p.get('gpu')} on {p.get('date')}{by}\n"
            f"  ({what}; file {Path(res['_path']).name})"
            + (f"\n  partial run: it was stopped before every {'preset' if 'presets' in res else 'mode'} finished"
               if res.get("complete") is False else ""))


def recorded_tag(res: dict) -> str:
    """The short form of :func:`recorded_label`, for figure titles."""
    p = res["provenance"]
    return f"recorded on {p.get('gpu')} on {p.get('date', '')[:10]} ({Path(res['_path']).name})"


def target_row(target: str, value, limit, ok: bool, detail: str = "") -> dict:
    """One judged target, as every judge of the kit (encoder, TTFT, text engine) writes it."""
    return {"target": target, "value": value, "limit": limit, "ok": bool(ok), "detail": detail}


def target_line(t: dict, cuda: bool, missing: str = "no such row in this run") -> str:
    """One judged target as the terminal shows it. A timing target judged without CUDA graphs (no
    CUDA) or without its rows reads "not measured here" (``missing``, or the target's own detail,
    says why), never a miss; the result file keeps the values as judged."""
    timed = not isinstance(t["limit"], bool)
    if t["value"] is None or (timed and not cuda):
        why = "no CUDA GPU: no graphs ran" if not cuda else (t.get("detail") or missing)
        return f"target {t['target']} (limit {t['limit']}): not measured here ({why})"
    value = f"{t['value']:.3g}" if isinstance(t["value"], float) else t["value"]
    detail = f": {t['detail'][:100]}" if t.get("detail") and not t["ok"] else ""
    return f"target {t['target']}: {value} (limit {t['limit']}) {'ok' if t['ok'] else 'MISSED'}{detail}"
