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


def test_the_reference_set_is_complete_and_each_file_is_of_its_code_version():
    assert MAN is not None, f"no {reference.manifest_path()}: `python -m lfm2vl_lab record` on the H200"
    assert MAN["complete"] and not MAN["failed"], MAN.get("failed")
    # every role the course reads (in the order the calls recorded them: a step left for a later call
    # of a resumed run comes last)
    assert sorted(MAN["files"]) == sorted(s.role for s in STEPS)
    start, end = (datetime.fromisoformat(MAN[k]) for k in ("started", "finished"))
    for role, entry in MAN["files"].items():
        res = json.loads((FOLDER / entry["file"]).read_text())
        prov = res["provenance"]
        assert prov["code_hash"] == entry.get("code_hash", MAN["code_hash"]), role
        # only a step beside the set may carry code of its own
        assert "code_hash" not in entry or next(s for s in STEPS if s.role == role).beside, role
        assert prov["gpu"] == reference.REFERENCE_GPU, role
        assert start <= datetime.fromisoformat(prov["date"]) <= end, role
        assert entry["rc"] == 0 and entry["file"].startswith(role + "-"), role


def test_only_the_reference_set_sits_beside_its_manifest():
    """Earlier runs live in archive/, so no reader can pick one up by its name or date."""
    top = {p.name for p in FOLDER.glob("*.json")} - {reference.MANIFEST}
    assert top == set(reference.files())


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
    versions = {MAN["code_hash"]} | {e["code_hash"] for e in MAN["files"].values() if "code_hash" in e}
    trees = set()
    for commit in commits:
        trees.add(reference.code_hash_at(commit))
        if versions <= trees:
            break
    assert versions <= trees, f"no commit that wrote {manifest} holds the code of {sorted(versions - trees)}"
