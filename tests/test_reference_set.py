"""The committed reference set (data/results/nvidia-h200/reference.json): one complete run on the H200,
each role's file of the code version its entry names (the set's, or for a role recorded beside the
set, vLLM's, its own), nothing else beside it, and every such code version recoverable from git."""

import json
import subprocess
from datetime import datetime

import pytest

from lfm2vl_lab.tools import reference
from lfm2vl_lab.tools.record import STEPS
from lfm2vl_lab.tools.results import REPO_ROOT

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
        # a role beside the set names the code that recorded it (a partial entry of an earlier record
        # named none: its file's own provenance does, and the test below recovers that code)
        assert prov["code_hash"] == entry.get("code_hash", prov["code_hash"] if STEP[role].beside
                                              else MAN["code_hash"]), role
        # only a step beside the set may carry code of its own
        assert "code_hash" not in entry or STEP[role].beside, role
        assert prov["gpu"] == reference.REFERENCE_GPU, role
        assert start <= datetime.fromisoformat(prov["date"]) <= end, role
        assert entry["rc"] == 0 and entry["file"].startswith(role + "-"), role


def test_only_the_reference_set_sits_beside_its_manifest():
    """Earlier runs live in archive/, so no reader can pick one up by its name or date."""
    top = {p.name for p in FOLDER.glob("*.json")} - {reference.MANIFEST}
    assert top == set(reference.files()) | {e["file"] for e in MAN.get("partial", {}).values()}


def _git(*args):
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)


@pytest.mark.skipif(_git("rev-parse").returncode != 0, reason="needs the git checkout")
def test_the_code_of_the_reference_run_is_recoverable():
    """Every code version the set names (the set's, and a role's own beside it) is the tree of a
    commit that wrote the manifest: the commit that recorded those files."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the commit that added the reference set may be outside it")
    manifest = str(reference.manifest_path().relative_to(REPO_ROOT))
    commits = _git("log", "--format=%H", "--", manifest).stdout.split()
    assert commits, "reference.json is not committed"
    entries = [*MAN["files"].values(), *MAN.get("partial", {}).values()]
    versions = {MAN["code_hash"]} | {json.loads((FOLDER / e["file"]).read_text())["provenance"]["code_hash"]
                                     for e in entries}
    trees = set()
    for commit in commits:
        trees.add(reference.code_hash_at(commit))
        if versions <= trees:
            break
    assert versions <= trees, f"no commit that wrote {manifest} holds the code of {sorted(versions - trees)}"
