"""The reference set: one recorded GPU run that every figure, table and notebook number reads.
``data/results/<gpu>/reference.json`` (the manifest) names each role's file and the ``code_hash`` of
the code that made it, which any commit's tree hashes the same way (:func:`code_hash_at`). Files of
earlier runs stay in ``archive/``; only :func:`load_archived` reads them, for a notebook that says so."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

from ..measure.results import REPO_ROOT, RESULTS_ROOT, gpu_slug, hash_code_entries, is_code_path

REFERENCE_GPU = "NVIDIA H200"
MANIFEST = "reference.json"


class ReferenceError(LookupError):
    """The reference set is missing, or lacks the role asked for (the message says how to record it)."""


def manifest_path(gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> Path:
    """Where the manifest of ``gpu``'s reference set lives: ``<root>/<gpu-slug>/reference.json``."""
    return Path(root) / gpu_slug(gpu) / MANIFEST


def load_manifest(gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> dict | None:
    """The manifest of ``gpu``'s reference set, or None where there is none."""
    path = manifest_path(gpu, root)
    return json.loads(path.read_text()) if path.is_file() else None


def role_code_hash(man: dict, role: str) -> str | None:
    """The code hash that recorded ``role``'s file: its entry's own (a role beside the set), else the set's."""
    entry = man.get("files", {}).get(role) or man.get("partial", {}).get(role) or {}
    return entry.get("code_hash", man.get("code_hash"))


def _read(path: Path, **marks) -> dict:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()  # archive/: gzipped
    return {**json.loads(raw), "_path": str(path), **marks}


def load(role: str, gpu: str = REFERENCE_GPU, root=RESULTS_ROOT, required: bool = True,
         partial: bool = False) -> dict | None:
    """``role``'s result file in ``gpu``'s reference set, with ``_path``, ``_role`` and ``_code_hash``;
    a missing role raises :class:`ReferenceError` naming those there are (``required=False``: None).
    ``partial``: a resumable role's partial file where it is not recorded whole, marked ``_partial``."""
    man = load_manifest(gpu, root) or {}
    entry, marks = man.get("files", {}).get(role), {}
    if entry is None and partial and role in man.get("partial", {}):
        entry, marks = man["partial"][role], {"_partial": True}
    if entry is None:
        if not required:
            return None
        there = ", ".join(man["files"]) if man else "none: no " + str(manifest_path(gpu, root))
        raise ReferenceError(f"the reference set of {gpu} has no {role!r} (roles recorded: {there}); "
                             "`python -m lfm2vl_lab record` on that GPU records it")
    return _read(manifest_path(gpu, root).parent / entry["file"], _role=role, _code_hash=role_code_hash(man, role),
                 **marks)


def load_archived(name: str, gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> dict:
    """An earlier run's file from ``<root>/<gpu-slug>/archive/`` by its file name (``take`` keeps it there
    gzipped, ``<name>.gz``), for a notebook that shows an earlier version beside today's (it must say so)."""
    folder = Path(root) / gpu_slug(gpu) / "archive"
    path = next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)
    if path is None:
        raise ReferenceError(f"no archived result {name} in {folder}")
    return _read(path)


def code_hash_at(commit: str, repo: Path = REPO_ROOT) -> str:
    """The code hash (:func:`~lfm2vl_lab.measure.results.code_hash`) of ``commit``'s tree, from git's objects."""
    out = subprocess.run(["git", "ls-tree", "-r", commit, "--", "lfm2vl_lab", "data/presets"], cwd=repo,
                         capture_output=True, text=True, check=True).stdout
    entries = [(path, meta.split()[2]) for meta, path in (line.split("\t", 1) for line in out.splitlines())
               if meta.split()[1] == "blob" and is_code_path(path)]
    return hash_code_entries(entries)
