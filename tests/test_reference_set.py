"""The committed reference set (data/results/nvidia-h200/reference.json): one complete run on the H200,
each role's file of the code version its entry names (the set's, or for a role recorded beside the
set, vLLM's, its own), nothing else beside it, and every such code version recoverable from git."""

import json
import subprocess
from datetime import datetime

import pytest

from lfm2vl_lab.measure.record import FORMAT, STEPS, stale
from lfm2vl_lab.measure.results import REPO_ROOT
from lfm2vl_lab.report import reference

MAN = reference.load_manifest()
FOLDER = reference.manifest_path().parent


STEP = {s.role: s for s in STEPS}


def test_the_reference_set_holds_every_role_and_each_file_is_of_its_code_version():
    """Every role the course reads is recorded, except that a resumable step beside the set (vLLM's,
    which takes more than one call) may still be partial: then the manifest says so, the set is not
    ``complete``, and the file itself says it is not."""
    assert MAN is not None, f"no {reference.manifest_path()}: `python -m lfm2vl_lab record` on the H200"
    assert not MAN["failed"], MAN.get("failed")
    partial = MAN.get("partial", {})
    assert sorted([*MAN["files"], *partial]) == sorted(STEP)
    assert all(STEP[role].beside and STEP[role].resumable for role in partial), sorted(partial)
    assert MAN["complete"] == (not partial)
    start, end = (datetime.fromisoformat(MAN[k]) for k in ("started", "finished"))
    for role, entry in [*MAN["files"].items(), *partial.items()]:
        res = json.loads((FOLDER / entry["file"]).read_text())
        prov = res["provenance"]
        if role in partial:
            assert res["complete"] is False, role
        # each entry names the code that recorded it (a set recorded before entries did: the set's,
        # except for a role beside it, which always named its own); a file that took several calls was
        # written by its first, and its entry names each call's code (``calls_code_hash``)
        first = entry.get("calls_code_hash", [entry.get("code_hash", MAN["code_hash"])])[0]
        assert prov["code_hash"] == first, role
        assert prov["gpu"] == reference.REFERENCE_GPU, role
        assert start <= datetime.fromisoformat(prov["date"]) <= end, role
        assert entry["rc"] == 0 and entry["file"].startswith(role + "-"), role


def test_only_the_reference_set_sits_beside_its_manifest():
    """Earlier runs live in archive/, so no reader can pick one up by its name or date."""
    top = {p.name for p in FOLDER.glob("*.json")} - {reference.MANIFEST}
    assert top == {e["file"] for part in ("files", "partial") for e in MAN.get(part, {}).values()}


def _git(*args):
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)


@pytest.mark.skipif(_git("rev-parse").returncode != 0, reason="needs the git checkout")
def test_the_code_of_the_reference_run_is_recoverable():
    """Every code version the set names (the set's, each file's, each call of a resumed role) is the
    tree of a commit: a reader can check out the code that recorded any number. Most are the tree of a
    commit that wrote the manifest; a role recorded before a change elsewhere (a table, a figure, which
    leaves it current) names the tree of an earlier commit, found among those that changed the code."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the commit that added the reference set may be outside it")
    manifest = str(reference.manifest_path().relative_to(REPO_ROOT))
    commits = _git("log", "--format=%H", "--", manifest).stdout.split()
    assert commits, "reference.json is not committed"
    entries = [*MAN["files"].values(), *MAN.get("partial", {}).values()]
    versions = {MAN["code_hash"]} | {json.loads((FOLDER / e["file"]).read_text())["provenance"]["code_hash"]
                                     for e in entries}
    versions |= {h for e in entries for h in [e.get("code_hash"), *e.get("calls_code_hash", [])] if h}
    trees = set()
    for commit in [*commits, *_git("log", "--format=%H", "--", "lfm2vl_lab", "data/presets").stdout.split()]:
        trees.add(reference.code_hash_at(commit))
        if versions <= trees:
            break
    assert versions <= trees, f"no commit's tree holds the code of {sorted(versions - trees)}"


def test_each_role_describes_the_code_of_this_tree():
    """The set describes the code beside it: every role's own files (``measures``) are as they were
    when it was recorded. A change to them makes the role stale until `record --changed` on the H200
    records it again (docs/gpu.md); a change elsewhere (a table, a figure) leaves it current."""
    if MAN.get("format", 1) < FORMAT:
        pytest.skip("the set was recorded before each role named its own code: the next `record` or "
                    "`record --changed` on the H200 writes it")
    behind = {s.role: stale(MAN, s, True, MAN["code_hash"]) for s in STEPS if s.role in MAN["files"]}
    behind = {role: files for role, files in behind.items() if files}
    assert not behind, ("roles recorded by other code than this tree's (`python -m lfm2vl_lab record --changed "
                        f"--dry-run` lists them): {behind}")
