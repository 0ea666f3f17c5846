"""The committed reference set (data/results/nvidia-h200/reference.json): one complete run of one
code version on the H200, nothing else beside it, and its code recoverable from git."""

import json
import subprocess
from datetime import datetime

import pytest

from lfm2vl_lab.tools import reference
from lfm2vl_lab.tools.record import STEPS
from lfm2vl_lab.tools.results import REPO_ROOT

MAN = reference.load_manifest()
FOLDER = reference.manifest_path().parent


def test_the_reference_set_is_one_complete_run_of_one_code_version():
    assert MAN is not None, f"no {reference.manifest_path()}: `python -m lfm2vl_lab record` on the H200"
    assert MAN["complete"] and not MAN["failed"], MAN.get("failed")
    # every role the course reads (in the order the calls recorded them: a step left for a later call
    # of a resumed run comes last)
    assert sorted(MAN["files"]) == sorted(s.role for s in STEPS)
    start, end = (datetime.fromisoformat(MAN[k]) for k in ("started", "finished"))
    for role, entry in MAN["files"].items():
        res = json.loads((FOLDER / entry["file"]).read_text())
        prov = res["provenance"]
        assert prov["code_hash"] == MAN["code_hash"], role
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
    """The commit that last wrote the manifest holds the code the run came from: its tree hashes to
    the manifest's code_hash."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the commit that added the reference set may be outside it")
    manifest = str(reference.manifest_path().relative_to(REPO_ROOT))
    commit = _git("log", "-1", "--format=%H", "--", manifest).stdout.strip()
    assert commit, "reference.json is not committed"
    assert reference.code_hash_at(commit) == MAN["code_hash"], \
        f"commit {commit[:10]} added the reference set, but its lfm2vl_lab/ and data/presets/ are not the recorded code"
