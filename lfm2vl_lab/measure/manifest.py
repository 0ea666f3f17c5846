"""The manifest a ``record`` call keeps, ``<out>/<gpu>/reference.json`` (:mod:`.record`): the set the
call adds to, each step's outcome filed in it (recorded, partial or failed), and the partial file a
resumable step goes on from. :mod:`lfm2vl_lab.report.reference` reads it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from .role_code import changed_files, role_code

# Each function's ``step`` is a :class:`.record.Step` (its role, command, modules, whether it resumes),
# named only here: record imports this module, and an import back would close a circle.

# Manifest format 2: every entry names the code that recorded it (``code_hash``, the whole tree) and
# the files its numbers depend on (``measures``, ``role_hash``), so roles of several code versions can
# share one set, each checked against the tree on its own.
FORMAT = 2


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_manifest(folder: Path, repo_folder: Path, gpu: str, hash_: str) -> dict:
    """The manifest this call adds to: the one under ``folder``, else the repo's, else a new one. A
    manifest from before each role named its own code gets its set's code in each entry."""
    for where in (folder, repo_folder):
        path = where / "reference.json"
        if path.is_file():
            man = json.loads(path.read_text())
            if man.get("gpu") == gpu:
                for entry in [*man.get("files", {}).values(), *man.get("partial", {}).values()]:
                    entry.setdefault("code_hash", man["code_hash"])
                return man
    return {"format": FORMAT, "gpu": gpu, "code_hash": hash_, "command": "python -m lfm2vl_lab record",
            "started": utc_now(), "finished": None, "complete": False, "files": {}}


def partial_file(step, man: dict, folders, hash_: str, say) -> Path | None:
    """The partial file a resumable step left in an earlier call (under ``--out`` or in the repo), if
    the same code recorded it: the same files of its role (``measures``), so that every section of the
    file comes from one version of the code that makes its numbers. A change elsewhere (a table, a
    figure, another command) leaves it resumable; a change to one of its files, or an entry that names
    no files and other whole code, starts the step afresh."""
    entry = man.get("partial", {}).get(step.role)
    if not step.resumable or entry is None:
        return None
    if entry.get("command", step.command) != step.command:
        say(f"   {entry['file']} is partial but was recorded by another command ({entry['command']}): starting afresh")
        return None
    files = changed_files(entry, step.modules)
    if files is None and entry.get("code_hash", man.get("code_hash")) != hash_:
        say(f"   {entry['file']} is partial but recorded by other code ({entry.get('code_hash')}): starting afresh")
        return None
    if files:
        say(f"   {entry['file']} is partial but its role's files changed since ({why_text(files)}): starting afresh")
        return None
    return next((f / entry["file"] for f in folders if (f / entry["file"]).is_file()), None)


def file_step(man: dict, step, entry: dict, new: list[Path], folder: Path, hash_: str, say,
               resumed: bool = False, host: dict | None = None) -> None:
    """Put one step's outcome into the manifest: recorded, partial (a resumable step's file that is
    not complete yet: left for the next call) or failed (its file set aside in ``incomplete/``). A
    partial or failed step's role leaves ``files``: the set never holds a complete file of an earlier
    run beside its successor, and is not ``complete`` until the role is.

    A step that ``resumed`` its partial file keeps the seconds of every call it took (``calls``) and
    sums them in ``seconds``: a role that took three calls cost the three, not the last one. Each call's
    whole-tree code hash is kept beside them (``calls_code_hash``): the calls may have run in trees that
    differ outside the role's files (:func:`partial_file`), and ``code_hash`` names the last. So is each
    call's ``host`` (:func:`.record.host_speed`, ``calls_host``): a call may have had another machine."""
    prior = man.setdefault("partial", {}).pop(step.role, None)
    if resumed and prior is not None and prior.get("seconds") is not None:
        calls = [*prior.get("calls", [prior["seconds"]]), entry["seconds"]]
        codes = [*prior.get("calls_code_hash", [prior.get("code_hash")] * (len(calls) - 1)), hash_]
        hosts = [*prior.get("calls_host", [prior.get("host")] * (len(calls) - 1)), host]
        entry = {**entry, "calls": calls, "seconds": round(sum(calls), 1), "calls_code_hash": codes,
                 "calls_host": hosts}
    entry = {**entry, "code_hash": hash_, **role_code(step.modules), **({"host": host} if host else {})}
    if entry["rc"] == 0 and len(new) == 1 and not (step.resumable and not _complete(new[0])):
        man["files"][step.role] = entry
        man["failed"].pop(step.role, None)
        say(f"   {entry['file']} in {entry['seconds']} s")
    elif entry["rc"] == 0 and len(new) == 1:
        man["partial"][step.role] = entry
        say(f"   {entry['file']} in {entry['seconds']} s: partial, the next call resumes it")
        # the role's newest run is the one the set holds, as a failed step's is: a complete file of an
        # earlier run leaves the set (``take`` archives it) rather than stand beside its successor
        if (done := man["files"].pop(step.role, None)) is not None:
            say(f"   {done['file']} (an earlier run of {step.role}) leaves the set for it")
    else:
        (folder / "incomplete").mkdir(exist_ok=True)
        for f in new:  # what a failed step left is kept, but out of the set
            f.rename(folder / "incomplete" / f.name)
        man["files"].pop(step.role, None)
        man["failed"][step.role] = {**entry, "files": [f.name for f in new]}
        log = folder / "logs" / f"{step.role}.log"
        say(f"   FAILED (exit {entry['rc']}, {len(new)} file(s)) after {entry['seconds']} s; the end of {log}:")
        say("   " + "\n   ".join(log.read_text().splitlines()[-8:]))
    if not man["partial"]:
        man.pop("partial")


def _complete(path: Path) -> bool:
    """Whether a resumable step's file says it holds all it was asked for."""
    return bool(json.loads(path.read_text()).get("complete"))


def why_text(files: list[str]) -> str:
    """A role's reasons to run, shortened for one line."""
    return ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
