"""measure/record and report/reference: the reference run's machinery on the CPU (tiny steps), and the
code hash that names the code a run came from, recomputed from git's objects."""

import gzip
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from script_loader import load_script

from lfm2vl_lab.measure import launch, schedule
from lfm2vl_lab.measure import record as rec
from lfm2vl_lab.measure.results import REPO_ROOT, blob_sha1, code_hash, hash_code_entries
from lfm2vl_lab.measure.role_code import role_code
from lfm2vl_lab.measure.values import UsageError
from lfm2vl_lab.report import reference

TINY = ("bench", "--preset", "tiny", "--mode", "lab-eager", "--workload", "1x256", "--repeats", "1", "--warmup", "0",
        "--device", "cpu", "--no-progress", "--figure", "none")
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def quick_host_probe(request, monkeypatch):
    """The host probe (a process importing torch, seconds) where a test is not about it: a fixed
    answer, so that the record tests time the record and not the probe."""
    if "host" not in request.node.name:
        monkeypatch.setattr(rec, "host_speed", lambda python: {"python_ms": 1.0, "device": "cpu"})


@pytest.fixture(params=["fork", "exec"])
def launch_mode(request, monkeypatch):
    """A test that takes it runs twice: its steps forked from the forkserver, and each exec'd."""
    monkeypatch.setenv(launch.LAUNCH_ENV, request.param)
    return request.param


def _stand_in(tmp_path, monkeypatch) -> str:
    """A python (``run_record``'s) whose commands are the stand-ins of tests/record_steps.py, taken by
    the forkserver with its preload too: a step takes milliseconds, not the seconds torch takes to import.
    The first test runs the real bench through record; the tests of what record keeps use these."""
    monkeypatch.setattr(launch, "PRELOAD", ("record_steps",))
    _importable(monkeypatch, TESTS)
    return _interpreter(tmp_path / "stand-in-python")


def _interpreter(path: Path) -> str:
    """Write a stand-in python at ``path`` and return its path: ``-m lfm2vl_lab …`` runs the command line
    with tests/record_steps.py's stand-ins in it (imported there, never in this process, whose commands
    stay the real ones); anything else (how the forkserver and multiprocessing's resource tracker
    start) is handed to this interpreter."""
    path.write_text(f"""#!{sys.executable}
import os, runpy, sys
os.environ["STAND_IN_PYTHON"] = sys.argv[0]  # the forkserver's children inherit it: which python started it
if sys.argv[1:3] == ["-m", "lfm2vl_lab"]:
    sys.path[:0] = [os.getcwd(), {str(TESTS.parent)!r}, {str(TESTS)!r}]  # -m puts the working folder first
    import record_steps
    sys.argv[1:3] = []
    runpy.run_module("lfm2vl_lab", run_name="__main__", alter_sys=True)
else:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
""")
    path.chmod(0o755)
    return str(path)


def _importable(monkeypatch, folder) -> None:
    """Let the forkserver import from ``folder``: it starts with the path a fresh python has (the
    working folder, PYTHONPATH), not this process's sys.path."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.fixture
def stand_in(tmp_path, monkeypatch, launch_mode):
    """:func:`_stand_in`, under each launch."""
    return _stand_in(tmp_path, monkeypatch)


def _steps(bad: bool):
    return (rec.Step("t-one", "encoder", "t-one", (*TINY, "--name", "t-one"), 120),
            rec.Step("t-two", "engine", "t-two", (*TINY, "--name", "t-two") if not bad else
                     ("bench", "--preset", "no-such-preset", "--name", "t-two"), 120))


def test_record_keeps_a_manifest_resumes_and_sets_failures_aside(tmp_path, monkeypatch, launch_mode):
    said = []
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=_steps(bad=True), say=said.append, repo_root=tmp_path / "r")
    folder = tmp_path / "cpu"
    assert json.loads((folder / "reference.json").read_text()) == man
    assert list(man["files"]) == ["t-one"] and man["files"]["t-one"]["rc"] == 0
    assert (folder / man["files"]["t-one"]["file"]).is_file()
    assert man["failed"]["t-two"]["rc"] == 2 and not man["complete"]
    assert man["code_hash"] == code_hash()
    assert "still to record: t-two" in said[-1]
    log = (folder / "logs" / "t-two.log").read_text()
    assert "no-such-preset" in log  # the step's own one-line error
    assert all(re.match(r"\[ *\d+\.\d s\] ", line) for line in log.splitlines())  # each line with its second
    assert man["files"]["t-one"]["launch"] == man["failed"]["t-two"]["launch"] == \
        {"fork": "forkserver", "exec": "exec"}[launch_mode]
    # the next call records only what is missing, into the same manifest (the stand-in bench: the real
    # one's file is t-one's, and a t-one run again would show as a second t-one file)
    man2 = rec.run_record(out=tmp_path, gpu="cpu", steps=_steps(bad=False), say=said.append, repo_root=tmp_path / "r",
                          python=_stand_in(tmp_path, monkeypatch))
    assert man2["complete"] and man2["failed"] == {} and man2["started"] == man["started"]
    assert man2["files"]["t-one"] == man["files"]["t-one"]  # not run again
    assert len(list(folder.glob("t-one-*.json"))) == 1 and len(list(folder.glob("t-two-*.json"))) == 1
    assert reference.load("t-two", gpu="cpu", root=tmp_path)["_role"] == "t-two"
    loaded = reference.load("t-one", gpu="cpu", root=tmp_path)  # what the real bench wrote, through record
    assert loaded["_role"] == "t-one" and loaded["provenance"]["code_hash"] == man2["code_hash"]


def test_record_leaves_steps_that_do_not_fit_the_deadline(tmp_path):
    said = []
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=_steps(bad=False), say=said.append, repo_root=tmp_path,
                         deadline_s=60)  # each step's limit is 120 s: none may start
    assert man["files"] == {} and not man["complete"]
    assert sum("left for the next call" in s for s in said) == 2


def test_a_role_of_other_code_is_recorded_again_and_the_others_keep_their_code(tmp_path, stand_in):
    """A set may hold roles of several code versions: a call records the roles this tree has not, and
    each entry it writes names this tree's code and the files the role measures."""
    folder = tmp_path / "cpu"
    folder.mkdir()
    (folder / "reference.json").write_text(json.dumps({"gpu": "cpu", "code_hash": "sha256:old", "files": {
        "t-one": {"file": "gone.json"}, "t-two": {"file": "kept.json"}}}))
    man = rec.run_record(parts=("encoder",), out=tmp_path, gpu="cpu", steps=_steps(bad=False), say=lambda s: None,
                         repo_root=tmp_path, python=stand_in)
    one = man["files"]["t-one"]
    assert man["code_hash"] == code_hash() and man["format"] == rec.FORMAT and one["file"] != "gone.json"
    assert one["code_hash"] == code_hash() and one["role_hash"] == role_code(("lfm2vl_lab.measure.bench",))["role_hash"]
    assert "lfm2vl_lab/measure/bench.py" in one["measures"]
    assert man["files"]["t-two"] == {"file": "kept.json", "code_hash": "sha256:old"}  # not chosen: kept, as it was


def test_changed_records_only_the_roles_whose_own_files_changed(tmp_path, stand_in):
    steps = _steps(bad=False)
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=steps, say=lambda s: None, repo_root=tmp_path,
                         python=stand_in)
    path = tmp_path / "cpu" / "reference.json"
    # as if the manifest had been written by other code, whose bench.py differed and whose other files did not
    man["code_hash"] = "sha256:other"
    for entry in man["files"].values():
        entry["code_hash"] = "sha256:other"
    man["files"]["t-two"]["measures"]["lfm2vl_lab/measure/bench.py"] = "0" * 40
    man["files"]["t-two"]["role_hash"] = "sha256:other-files"
    path.write_text(json.dumps(man))
    assert rec.stale(man, steps[0], True, code_hash()) is None
    assert rec.stale(man, steps[1], True, code_hash()) == ["lfm2vl_lab/measure/bench.py"]
    assert rec.stale(man, steps[0], False, code_hash()) == ["code other"]  # a full record runs both
    said = []
    new = rec.run_record(out=tmp_path, gpu="cpu", steps=steps, say=said.append, repo_root=tmp_path, changed=True,
                         python=stand_in)
    assert new["files"]["t-one"] == man["files"]["t-one"]  # its files are as they were: kept
    assert new["files"]["t-two"]["code_hash"] == code_hash() != man["files"]["t-two"]["code_hash"]
    assert any("t-two" in s and "why: lfm2vl_lab/measure/bench.py" in s for s in said)
    assert not any("t-one:" in s for s in said)


def test_take_brings_a_call_in_and_archives_what_its_manifest_no_longer_names(tmp_path):
    src, dst = tmp_path / "out" / "cpu", tmp_path / "repo" / "cpu"
    (src / "logs").mkdir(parents=True)
    dst.mkdir(parents=True)
    (src / "a-2.json").write_text("{}")
    (src / "logs" / "a.log").write_text("log")
    (src / "reference.json").write_text(json.dumps({"gpu": "cpu", "code_hash": "x", "files": {
        "a": {"file": "a-2.json"}, "b": {"file": "b-1.json"}}}))
    (dst / "a-1.json").write_text('{"run": 1}')  # the file a-2 replaces
    (dst / "b-1.json").write_text("{}")  # kept: the new manifest still names it
    done = rec.take(tmp_path / "out", tmp_path / "repo", say=lambda s: None)
    assert sorted(p.name for p in dst.glob("*.json")) == ["a-2.json", "b-1.json", "reference.json"]
    assert (dst / "logs" / "a.log").read_text() == "log" and not (dst / "archive" / "a-1.json").exists()
    assert "archived cpu/a-1.json" in done and "gzipped cpu/archive/a-1.json.gz" in done
    # kept gzipped, the same bytes inside, and read back by name as the notebooks do
    assert gzip.decompress((dst / "archive" / "a-1.json.gz").read_bytes()) == b'{"run": 1}'
    assert reference.load_archived("a-1.json", gpu="cpu", root=tmp_path / "repo")["run"] == 1


def test_record_cli_says_what_it_needs():
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "record", "--dry-run"], capture_output=True,
                          text=True, cwd=REPO_ROOT)
    assert proc.returncode == 0
    roles = [line.split()[1] for line in proc.stdout.splitlines()]
    assert roles == [s.role for s in rec.STEPS if not s.beside]  # a step beside the set only when named
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "record", "--part", "vllm", "--dry-run"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert [line.split()[1] for line in proc.stdout.splitlines()] == ["vllm"]
    assert len(set(s.name for s in rec.STEPS)) == len(rec.STEPS)  # every step writes a name of its own
    if not __import__("torch").cuda.is_available():
        proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "record"], capture_output=True, text=True,
                              cwd=REPO_ROOT)
        assert proc.returncode == 2 and "record needs a CUDA GPU" in proc.stderr.splitlines()[-1]


def test_record_role_names_the_roles_it_runs_and_refuses_an_unknown_one():
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "record", "--role", "engine", "--role", "ttft",
                           "--dry-run"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == 0
    assert [line.split()[1:4] for line in proc.stdout.splitlines()] == [["ttft", "500", "s"], ["engine", "160", "s"]]
    assert all("runs: asked for" in line for line in proc.stdout.splitlines())  # current or not
    proc = subprocess.run([sys.executable, "-m", "lfm2vl_lab", "record", "--role", "nope", "--dry-run"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith("python -m lfm2vl_lab record: error: "
                                                                            "unknown role nope; the roles are check, ")


def test_the_launch_probe_alternates_the_launches_and_compares_their_spread(tmp_path, monkeypatch):
    """scripts/launch_probe.py: a step's command run forked, then exec'd, each into a folder of its own;
    then each run's spread across rounds and the rows whose medians differ most between the launches."""
    probe = load_script("launch_probe.py")
    out = tmp_path / "out"
    for folder in ("1-forkserver", "2-exec"):  # the stand-in bench writes into <out>/cpu/, as record leaves it
        (out / folder / "cpu").mkdir(parents=True)
    runs = probe.run_all([*TINY, "--name", "p"], 2, out, 60, _stand_in(tmp_path, monkeypatch), say=lambda s: None)
    assert [(r["launch"], r["rc"]) for r in runs] == [("forkserver", 0), ("exec", 0)]
    for run, scale in zip(runs, (1.0, 2.0)):  # each run's file, given samples: the second run twice as slow
        (result,) = (out / run["folder"]).glob("cpu/p-*.json")
        result.write_text(json.dumps({"rows": [{"preset": "x", "image": "1x512", "requests": 1, "mode": "m",
                                                "ttft_samples_ms": [v * scale for v in (10, 10, 20, 20)]}]}))
    lines = probe.summarize(out, "ttft_samples_ms")
    assert lines[0].startswith("run 1 (forkserver): ") and lines[0].endswith("1 of 1 rows over 2%, worst 33.3%")
    assert lines[1].startswith("run 2 (exec): ") and "host python loop 1.0 ms" in lines[1]
    assert lines[-1] == "  x 1x512 1 m: 15.00 vs 30.00 (-50.0%)"
    assert lines[2] == "forked above exec in 0 of 1 rows; the launches' medians differ by 50.0%"
    meta = json.loads((out / "runs.json").read_text())  # a run the call's limit stopped: listed, its rows so far
    meta["runs"][1].update(rc=None, seconds=None)
    (out / "runs.json").write_text(json.dumps(meta))
    lines = probe.summarize(out, "ttft_samples_ms", per_row=True)
    assert lines[1].startswith("run 2 (exec): stopped before its end (its rows so far), ")
    assert lines[-2:] == ["  row | 1 forkserver | 2 exec", "  x 1x512 1 m | 15.00 | 30.00"]
    ttft = next(s for s in rec.STEPS if s.role == "ttft").argv
    assert probe.with_presets(list(ttft), ["lfm2-vl-450m"]) == [
        "ttft", "--preset", "lfm2-vl-450m", *[a for a in ttft[1:] if a not in ("--preset", "lfm2-vl-450m",
                                                                                  "lfm2-vl-1.6b")]]
    with pytest.raises(SystemExit, match="2"):  # a role whose rows keep no samples: nothing to compare
        probe.main(["--role", "check", "--summarize", str(out)])
    script = (REPO_ROOT / "scripts" / "h200_run.sh").read_text()  # the device call that runs it
    assert "launch)" in script and "python3 scripts/launch_probe.py --role" in script


def test_code_hash_equals_gits_own_for_a_commit(tmp_path):
    """The hash a run stores is the one git's objects give for the commit of that code."""
    (tmp_path / "lfm2vl_lab" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "presets").mkdir(parents=True)
    (tmp_path / "lfm2vl_lab" / "a.py").write_text("x = 1\n")
    (tmp_path / "lfm2vl_lab" / "sub" / "b.py").write_bytes(b"y = 2\n")
    (tmp_path / "lfm2vl_lab" / "sub" / "c.cpp").write_text("int z;\n")  # a C++ source the package builds
    (tmp_path / "lfm2vl_lab" / "notes.txt").write_text("not code\n")
    (tmp_path / "data" / "presets" / "p.json").write_text("{}\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    first = code_hash(tmp_path)
    assert first == reference.code_hash_at("HEAD", tmp_path)
    assert blob_sha1(b"x = 1\n") == subprocess.run([*git, "hash-object", "lfm2vl_lab/a.py"], capture_output=True,
                                                   text=True).stdout.strip()
    (tmp_path / "lfm2vl_lab" / "a.py").write_text("x = 3\n")  # a change of code changes the hash
    assert code_hash(tmp_path) != first
    (tmp_path / "lfm2vl_lab" / "a.py").write_text("x = 1\n")
    (tmp_path / "lfm2vl_lab" / "sub" / "c.cpp").write_text("int w;\n")  # so does a change to the C++ it builds
    assert code_hash(tmp_path) != first
    (tmp_path / "lfm2vl_lab" / "sub" / "c.cpp").write_text("int z;\n")
    (tmp_path / "lfm2vl_lab" / "notes.txt").write_text("edited\n")  # what is not code does not
    assert code_hash(tmp_path) == first
    assert hash_code_entries([("b", "2"), ("a", "1")]) == hash_code_entries([("a", "1"), ("b", "2")])


def test_reference_load_names_what_is_missing(tmp_path):
    with pytest.raises(reference.ReferenceError, match="no 'bench-450m'.*record"):
        reference.load("bench-450m", root=tmp_path)
    assert reference.load("bench-450m", root=tmp_path, required=False) is None


def test_a_step_beside_the_set_joins_a_set_of_other_code(tmp_path, stand_in):
    """vLLM's role is recorded apart, when its part is named, by code that may differ from the rest of
    the set's: it joins the set there, whose other roles keep the code that recorded them."""
    folder = tmp_path / "cpu"
    folder.mkdir()
    old = {"gpu": "cpu", "code_hash": "sha256:old", "started": "2026-01-01T00:00:00+00:00", "files": {
        "t-one": {"file": "t-one-1.json"}}}
    (folder / "reference.json").write_text(json.dumps(old))
    beside = rec.Step("t-b", "b", "t-b", (*TINY, "--name", "t-b"), 120, beside=True)
    man = rec.run_record(parts=("b",), out=tmp_path, gpu="cpu", steps=(*_steps(bad=False)[:1], beside),
                         say=lambda s: None, repo_root=tmp_path, python=stand_in)
    assert man["files"]["t-one"] == {**old["files"]["t-one"], "code_hash": "sha256:old"}
    assert man["files"]["t-b"]["code_hash"] == code_hash() and man["complete"]
    assert man["started"] == old["started"]
    # a step of the set, run by this code, replaces only its own role
    man = rec.run_record(parts=("encoder",), out=tmp_path, gpu="cpu", steps=(*_steps(bad=False)[:1], beside),
                         say=lambda s: None, repo_root=tmp_path, python=stand_in)
    assert man["files"]["t-one"]["code_hash"] == code_hash() and "t-b" in man["files"]


def test_a_resumable_step_is_partial_until_its_file_is_complete(tmp_path, stand_in):
    """A step that takes two calls: the first leaves a partial file (listed as such, not as failed),
    the second resumes that file and records it."""
    slow = rec.Step("slow", "b", "slow", ("slow",), 600, beside=True, resumable=True,
                    measures=("lfm2vl_lab.measure.bench",))
    said = []
    kw = dict(parts=("b",), out=tmp_path, gpu="cpu", steps=(slow,), say=said.append, repo_root=tmp_path / "r",
              python=stand_in, deadline_s=300)
    man = rec.run_record(**kw)
    assert man["partial"]["slow"]["file"] == "slow-20260101-000000.json" and not man["failed"]
    assert man["partial"]["slow"]["code_hash"] == code_hash()  # beside the set: it names its own code
    # a reader that takes a partial file finds it, marked; one that does not, does not
    assert reference.load("slow", gpu="cpu", root=tmp_path, partial=True)["_partial"]
    assert reference.load("slow", gpu="cpu", root=tmp_path, required=False) is None
    assert "slow" not in man["files"] and "partial, the next call resumes it" in said[-2]
    man = rec.run_record(**kw)
    assert man["files"]["slow"]["file"] == "slow-20260101-000000.json" and "partial" not in man
    assert json.loads((tmp_path / "cpu" / "slow-20260101-000000.json").read_text())["parts"] == 2
    assert any("resuming slow-20260101-000000.json" in s for s in said)
    # the role cost both calls: each call's seconds kept, their sum in `seconds`
    entry = man["files"]["slow"]
    assert len(entry["calls"]) == 2 and all(c > 0 for c in entry["calls"])
    assert entry["seconds"] == round(sum(entry["calls"]), 1) > max(entry["calls"])


def test_a_resumable_role_run_again_holds_its_partial_file_not_the_earlier_complete_one(tmp_path, stand_in):
    """A role recorded again (its code changed) that takes two calls: after the first, the set lists the
    new partial file and no longer the earlier complete one (``take`` archives it), so it is never
    listed twice nor read as current; the second call completes it."""
    man_path, kw, said = _partial_run(tmp_path, stand_in)
    first = rec.run_record(**kw)["files"]["slow"]["file"]
    (tmp_path / "cpu" / first).rename(tmp_path / "cpu" / "slow-20250101-000000.json")  # an earlier run's file
    man = json.loads(man_path.read_text())
    man["files"]["slow"]["file"] = "slow-20250101-000000.json"
    man_path.write_text(json.dumps(man))
    man = rec.run_record(**kw, again=True)
    assert "slow" not in man["files"] and man["partial"]["slow"]["file"] == first and not man["complete"]
    assert any("slow-20250101-000000.json (an earlier run of slow) leaves the set" in s for s in said)
    repo = tmp_path / "repo"  # the repo's set, which held the earlier complete file
    (repo / "cpu").mkdir(parents=True)
    earlier = "slow-20250101-000000.json"
    (repo / "cpu" / earlier).write_bytes((tmp_path / "cpu" / earlier).read_bytes())
    rec.take(tmp_path, repo, say=lambda s: None)
    assert (repo / "cpu" / "archive" / "slow-20250101-000000.json.gz").is_file()
    assert not (repo / "cpu" / "slow-20250101-000000.json").exists()
    man = rec.run_record(**kw)
    assert man["files"]["slow"]["file"] == first and "partial" not in man


def _partial_run(tmp_path, python):
    """A resumable step's first call, which leaves its partial file; the manifest's path, the keywords
    of the call and what it said."""
    slow = rec.Step("slow", "b", "slow", ("slow",), 600, beside=True, resumable=True,
                    measures=("lfm2vl_lab.measure.bench",))
    said = []
    kw = dict(parts=("b",), out=tmp_path, gpu="cpu", steps=(slow,), say=said.append, repo_root=tmp_path / "r",
              python=python, deadline_s=300)
    rec.run_record(**kw)
    return tmp_path / "cpu" / "reference.json", kw, said


def _edit_partial(path, **changes):
    man = json.loads(path.read_text())
    entry = man["partial"]["slow"]
    for key, value in changes.items():
        if key == "measures":
            entry["measures"] = {**entry["measures"], **value}
        else:
            entry[key] = value
    path.write_text(json.dumps(man))


def test_a_partial_file_of_other_code_is_not_resumed(tmp_path, stand_in):
    """A file names one version of the code that makes its numbers: a partial file left while one of its
    role's files differed is started afresh, not continued by this code (its sections would be credited
    to code that did not make them)."""
    path, kw, said = _partial_run(tmp_path, stand_in)
    _edit_partial(path, code_hash="sha256:other", role_hash="sha256:other",
                  measures={"lfm2vl_lab/measure/bench.py": "0" * 40})
    man = rec.run_record(**kw)
    assert any("its role's files changed since (lfm2vl_lab/measure/bench.py): starting afresh" in s for s in said), said
    assert not any("resuming" in s for s in said)
    assert json.loads((tmp_path / "cpu" / "slow-20260101-000000.json").read_text())["parts"] == 1
    assert man["partial"]["slow"]["code_hash"] == code_hash()
    assert "calls" not in man["partial"]["slow"], "a fresh start does not count the other code's call"


def test_a_partial_file_from_a_tree_that_differs_elsewhere_is_resumed(tmp_path, stand_in):
    """A change outside the role's files (a table, a figure, another command) moves the whole tree's
    code hash but not what makes the role's numbers: its partial file goes on, and the entry keeps each
    call's whole-tree code hash beside its seconds."""
    path, kw, said = _partial_run(tmp_path, stand_in)
    _edit_partial(path, code_hash="sha256:other")
    man = rec.run_record(**kw)
    assert any("resuming slow-20260101-000000.json" in s for s in said), said
    assert json.loads((tmp_path / "cpu" / "slow-20260101-000000.json").read_text())["parts"] == 2
    entry = man["files"]["slow"]
    assert entry["calls_code_hash"] == ["sha256:other", code_hash()] and entry["code_hash"] == code_hash()
    assert len(entry["calls"]) == 2


def test_a_partial_entry_that_names_no_files_resumes_only_under_the_same_code(tmp_path, stand_in):
    """An entry from before roles named their files has only the whole tree's code hash to go by."""
    path, kw, said = _partial_run(tmp_path, stand_in)
    man = json.loads(path.read_text())
    for key in ("measures", "role_hash"):
        man["partial"]["slow"].pop(key)
    man["partial"]["slow"]["code_hash"] = "sha256:other"
    path.write_text(json.dumps(man))
    rec.run_record(**kw)
    assert any("recorded by other code (sha256:other): starting afresh" in s for s in said), said
    assert json.loads((tmp_path / "cpu" / "slow-20260101-000000.json").read_text())["parts"] == 1


def test_record_ends_by_redrawing_what_is_derived_from_the_set(tmp_path, monkeypatch, stand_in):
    """A call that records a role into the repo's results folder ends with the report step: the figures
    (into the figures folder beside it) and the docs' tables, from that set. A call that changes
    nothing in a set still incomplete redraws nothing, and neither does one that writes elsewhere."""
    from lfm2vl_lab.cli import cli_record, cli_report
    from lfm2vl_lab.report import report

    drawn, tabled = [], []
    monkeypatch.setattr(report, "report", lambda root, out, verbose=True: drawn.append((str(root), str(out))) or [])
    monkeypatch.setattr(cli_report, "run_tables", lambda args: tabled.append(args.root) or 0)
    kit = ("lfm2vl_lab.measure.bench",)  # fake commands: the code they stand for
    steps = (rec.Step("fast", "encoder", "fast", ("fast",), 60, measures=kit),
             rec.Step("long", "encoder", "long", ("long",), 900, measures=kit))
    repo = tmp_path / "data" / "results"
    said = []
    kw = dict(gpu="cpu", steps=steps, say=said.append, python=stand_in, deadline_s=300,  # "long" never fits
              derive=cli_record.derive_set)  # what the command passes
    man = rec.run_record(out=repo, repo_root=repo, **kw)
    assert list(man["files"]) == ["fast"] and not man["complete"]
    assert drawn == [(str(repo), str(tmp_path / "data" / "figures"))] and tabled == [str(repo)]
    assert f"figures: 0 drawn from the set into {tmp_path / 'data' / 'figures'}" in said
    rec.run_record(out=repo, repo_root=repo, **kw)  # nothing new, still incomplete
    man = rec.run_record(out=tmp_path / "device", repo_root=repo, again=True, **kw)  # recorded, not into the repo
    assert man["files"]["fast"]["rc"] == 0 and (tmp_path / "device" / "cpu" / "fast-20260101-000000.json").is_file()
    assert len(drawn) == 1 and len(tabled) == 1
    # once complete, every call leaves the figures and tables drawn from the set
    man = rec.run_record(out=repo, repo_root=repo, **dict(kw, deadline_s=None))
    assert man["complete"] and drawn[1:] == [(str(repo), str(tmp_path / "data" / "figures"))] and len(tabled) == 2


def test_each_entry_a_call_records_names_that_calls_host(tmp_path, stand_in, monkeypatch):
    """Machines lent under one name differ in host speed (measure/host): every entry keeps the probe
    of the call that recorded it, taken once before its first step; a call that records nothing
    probes nothing."""
    probes = []
    speed = {"python_ms": 50.0, "torch_op_us": 1.5, "cuda_launch_us": 4.2, "device": "cpu"}
    monkeypatch.setattr(rec, "host_speed", lambda python: probes.append(python) or dict(speed))
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=_steps(bad=False), say=lambda s: None, repo_root=tmp_path,
                         python=stand_in)
    assert probes == [stand_in]
    assert [e["host"] for e in man["files"].values()] == [speed, speed]
    rec.run_record(out=tmp_path, gpu="cpu", steps=_steps(bad=False), say=lambda s: None, repo_root=tmp_path,
                   python=stand_in)
    assert probes == [stand_in]  # all recorded already: no step, no probe


def test_the_host_probe_runs_in_a_process_of_its_own_and_a_broken_one_stops_nothing(tmp_path):
    found = rec.host_speed(sys.executable)
    assert found["python_ms"] > 0 and found["torch_op_us"] > 0 and found["device"] == "cpu", found
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert rec.host_speed(str(broken))["error"].startswith("IndexError"), rec.host_speed(str(broken))


def test_a_role_recorded_by_another_command_is_stale_whatever_its_code(tmp_path, stand_in):
    """A step's arguments (repeats, workloads, presets) make its numbers as much as its code does: a
    change to them in STEPS records the role again, in a full and in a partial re-record."""
    steps = _steps(bad=False)
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=steps, say=lambda s: None, repo_root=tmp_path,
                         python=stand_in)
    fewer = rec.Step("t-one", "encoder", "t-one", (*TINY[:-4], "--repeats", "2", *TINY[-4:], "--name", "t-one"), 120)
    assert fewer.command != steps[0].command
    for changed in (False, True):
        assert rec.stale(man, steps[0], changed, man["code_hash"]) is None
        assert rec.stale(man, fewer, changed, man["code_hash"]) == ["its command changed"]


# How a step is launched (measure/launch.py): both ways run it as `python -m lfm2vl_lab` would, its output
# at fd level into its log, a crash, an exception or a kill recorded as such; the forkserver's steps
# are each a process of its own, which a timeout kills with what it started.
KIT = ("lfm2vl_lab.measure.bench",)  # the stand-in commands' code, for their manifest entries
PREFIX = r"\[ *\d+\.\d s\] "


def _record(tmp_path, python, *argv: str, limit: int = 60) -> tuple[dict, dict, list[str]]:
    """One stand-in step, recorded: its manifest entry, its file (if it wrote one) and its log's lines."""
    step = rec.Step(argv[0], "encoder", argv[0], argv, limit, measures=KIT)
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=(step,), say=lambda s: None, repo_root=tmp_path / "r",
                         python=python)
    entry = man["files"].get(step.role) or man["failed"][step.role]
    ran = json.loads((tmp_path / "cpu" / entry["file"]).read_text()) if entry["file"] else {}
    return entry, ran, (tmp_path / "cpu" / "logs" / f"{step.role}.log").read_text().splitlines()


def test_a_step_runs_as_python_m_would_and_its_log_holds_its_fd_level_output(tmp_path, stand_in, launch_mode,
                                                                             monkeypatch):
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # the launch makes a step's output unbuffered itself
    entry, ran, log = _record(tmp_path, stand_in, "say")
    assert entry["rc"] == 0 and entry["launch"] == {"fork": "forkserver", "exec": "exec"}[launch_mode]
    assert ran["argv"][0].endswith(os.path.join("lfm2vl_lab", "__main__.py"))  # what cli.py's from_main reads
    assert ran["argv"][1:] == ["say", "--out", str(tmp_path)] and ran["main"] == "lfm2vl_lab.__main__"
    assert ran["unbuffered"] == "1" and ran["cwd"] == os.getcwd()
    assert ran["python"] == stand_in  # run_record's python: each step's, or the forkserver's
    # every line with its second, the one written to fd 2 below Python too, in the order they were written
    assert all(re.match(PREFIX, line) for line in log), log
    assert [re.sub(PREFIX, "", line) for line in log] == ["a line from print", "a line written to fd 2"]
    if launch_mode == "fork":
        assert ran["pgid"] == ran["pid"]  # a process group of its own: what a timeout kills
        assert entry["forkserver_s"] > 0  # the call's first step: its seconds hold the forkserver's imports
    # torch.compile's and Triton's caches: a folder of the step's own, empty when it starts, gone after it
    caches = [Path(ran["caches"][k]) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")]
    assert caches[0].parent == caches[1].parent and caches[0] != caches[1] and ran["caches_hold"] == []
    assert not caches[0].parent.exists() and entry["compile_cache"] == "empty"
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(caches[0])  # the record process's own untouched
    from lfm2vl_lab.cli import cli

    assert "say" not in cli.SUBCOMMANDS  # the stand-ins stay in the steps: this process's commands are real


@pytest.mark.parametrize("command, rc, said", [("segv", -11, "about to crash"), ("boom", 1, "RuntimeError: boom"),
                                               ("exit3", 3, None)])
def test_a_step_that_crashes_is_recorded_failed_with_its_exit_status(tmp_path, stand_in, launch_mode, command, rc,
                                                                       said):
    """A signal is an exit status below zero (never 0); an exception prints its traceback and exits 1."""
    entry, _, log = _record(tmp_path, stand_in, command)
    assert entry["rc"] == rc and entry["file"] is None, entry
    if said:
        assert re.sub(PREFIX, "", log[-1]) == said, log
    if command == "boom":
        assert any(line.endswith("Traceback (most recent call last):") for line in log), log


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process ``pid`` ended (a zombie has), waiting up to ``wait_s``."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < wait_s:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_forked_step_past_its_limit_is_killed_with_what_it_started(tmp_path, monkeypatch):
    monkeypatch.setenv(launch.LAUNCH_ENV, "fork")
    entry, _, log = _record(tmp_path, _stand_in(tmp_path, monkeypatch), "sleep", limit=1)
    assert entry["rc"] == "timeout" and entry["launch"] == "forkserver"
    assert 1.0 <= entry["seconds"] < 3.0, entry  # killed at its limit, not when its sleep ends
    assert re.sub(PREFIX, "", log[-1]) == "sleeping", log
    assert _gone(int((tmp_path / "cpu" / "sleeper.pid").read_text()))  # its process group went with it


def test_the_forkserver_imports_the_preload_and_no_step_gets_cuda_from_it(tmp_path, monkeypatch):
    """Each step finds the preload imported (none of it failed, which the forkserver would not say) and
    CUDA untouched (on a CPU that is all there is to see: the next test breaks it on purpose)."""
    monkeypatch.setenv(launch.LAUNCH_ENV, "fork")
    preload = launch.PRELOAD
    monkeypatch.setattr(launch, "PRELOAD", (*preload, "record_steps"))
    _importable(monkeypatch, TESTS)
    entry, ran, _ = _record(tmp_path, _interpreter(tmp_path / "python"), "say")
    assert entry["rc"] == 0 and ran["torch_imported"] and not ran["cuda_initialized"]
    assert ran["preloaded"] == sorted(preload)


# What a preload that touched CUDA leaves in the forkserver, as torch shows it to a child forked from it
TOUCHED = {"initialised": "torch.cuda._initialized = True  # torch's lazy init, where is_initialized() shows it",
           "bad fork": "torch.cuda._is_in_bad_fork = lambda: True  # how torch marks a child of a CUDA process",
           # the driver initialised (cuInit): a child finds no device though the record process has one
           "driver": "torch.cuda.is_available = lambda: False"}


@pytest.mark.parametrize("how", TOUCHED)
def test_a_step_forked_from_a_forkserver_that_touched_cuda_fails_at_once_and_says_why(tmp_path, monkeypatch, how):
    monkeypatch.setenv(launch.LAUNCH_ENV, "fork")
    (tmp_path / "touch_cuda.py").write_text(f"import torch\n{TOUCHED[how]}\n")
    _importable(monkeypatch, tmp_path)
    _importable(monkeypatch, TESTS)
    monkeypatch.setattr(launch, "PRELOAD", ("record_steps", "touch_cuda"))
    if how == "driver":
        monkeypatch.setattr(launch, "_has_cuda", lambda: True)  # as a record on a GPU machine
    entry, _, log = _record(tmp_path, _interpreter(tmp_path / "python"), "say")
    assert entry["rc"] == 1 and entry["file"] is None, entry
    assert len(log) == 1 and "forkserver's preload (lfm2vl_lab.measure.launch.PRELOAD)" in log[0], log
    assert ("the CUDA driver" in log[0]) == (how == "driver") and f"{launch.LAUNCH_ENV}=exec" in log[0]


def test_the_launch_is_chosen_by_its_environment_variable(monkeypatch):
    for asked, mode in (("fork", "forkserver"), ("exec", "exec"), ("", "forkserver")):
        monkeypatch.setenv(launch.LAUNCH_ENV, asked)
        assert launch.launch_mode() == mode
    monkeypatch.setenv(launch.LAUNCH_ENV, "spawn")
    with pytest.raises(ValueError, match=f"{launch.LAUNCH_ENV}=spawn: fork or exec"):
        launch.launch_mode()


# Steps on several GPUs at once (measure/schedule.py): a worker thread per GPU takes the next step,
# longest first, and runs it with its own CUDA_VISIBLE_DEVICES and its own share of the cores.

def _where(role: str, limit: int, sleep: float = 3.0) -> rec.Step:
    """A stand-in step that sleeps, then writes where it ran (tests/record_steps.py's ``where``)."""
    return rec.Step(role, "encoder", role, ("where", "--name", role, "--sleep", str(sleep)), limit, measures=KIT)


def _started(said: list[str]) -> dict[int, str]:
    """``{k: role}`` of the call's "== [k/n] role: …" lines, whatever GPU label they carry."""
    found = (re.match(r"== (?:\[gpu \d+\] )?\[(\d+)/\d+\] ([\w-]+): ", s) for s in said)
    return {int(m[1]): m[2] for m in found if m}


def test_steps_run_at_once_each_on_its_own_gpu_and_cores_and_a_failure_stops_no_other(tmp_path, stand_in,
                                                                                       launch_mode, monkeypatch):
    monkeypatch.setenv(schedule.GPUS_ENV, "2")  # as on a machine of two GPUs
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # longest first: "w-long" by its limit, "boom" (fails at once) by the seconds the set recorded of it,
    # "w-short" last; so one worker runs "w-long" while the other runs "boom", then "w-short"
    steps = (_where("w-short", 50), rec.Step("boom", "encoder", "boom", ("boom",), 40, measures=KIT),
             _where("w-long", 90))
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "reference.json").write_text(json.dumps({"gpu": "cpu", "code_hash": "sha256:old", "files": {
        "boom": {"file": "boom-old.json", "seconds": 70.0}}}))
    said = []
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=steps, say=said.append, repo_root=tmp_path / "r",
                         python=stand_in)
    assert _started(said) == {1: "w-long", 2: "boom", 3: "w-short"}
    assert sorted(man["files"]) == ["w-long", "w-short"] and man["failed"]["boom"]["rc"] == 1
    assert any(re.match(r"== \[gpu [01]\] \[2/3\] boom: ", s) for s in said), said
    assert any(re.match(r" {3}\[gpu [01]\] FAILED \(exit 1", s) for s in said), said
    entries = {**man["files"], "boom": man["failed"]["boom"]}
    assert {e["gpu"] for e in entries.values()} == {0, 1} and {e["gpus"] for e in entries.values()} == {2}
    assert len({e["call"] for e in entries.values()}) == 1 and entries["boom"]["gpu"] == entries["w-short"]["gpu"]
    assert sum("forkserver_s" in e for e in entries.values()) == (launch_mode == "fork")  # the one that started it
    ran = {r: json.loads((tmp_path / "cpu" / man["files"][r]["file"]).read_text()) for r in ("w-long", "w-short")}
    for role, r in ran.items():
        assert r["cuda"] == str(man["files"][role]["gpu"])  # only its own GPU visible
    assert ran["w-long"]["start"] < ran["w-short"]["end"] and ran["w-short"]["start"] < ran["w-long"]["end"], said
    assert json.loads((tmp_path / "cpu" / "reference.json").read_text()) == man
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: no shares to tell apart")
    shares = [r["cpus"] for r in ran.values()]
    assert shares == [launch.parse_cpu_list(r["cpus_env"]) for r in ran.values()]  # kept to what it was given
    assert len(shares[0]) == len(shares[1]) == len(cores) // 2 and not set(shares[0]) & set(shares[1])


def test_one_launcher_serves_several_threads_and_each_step_keeps_its_exit_status(tmp_path, monkeypatch):
    """multiprocessing's Process.start polls every live child of the process: without the Launcher's
    lock, a thread starting a step could read the exit status of another thread's step as it ended, and
    that step would read 255 (a few in a few hundred steps on two cores, as tried here without it)."""
    monkeypatch.setenv(launch.LAUNCH_ENV, "fork")
    python, rcs = _stand_in(tmp_path, monkeypatch), []
    with launch.Launcher(python, say=lambda s: None) as launcher:
        def work() -> None:
            rcs.extend(launcher.run(["exit3"], io.StringIO(), 30) for _ in range(50))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert rcs == [3] * 200


def test_one_gpu_runs_the_steps_in_turn_in_their_order(tmp_path, stand_in):
    steps = (_where("w-short", 50, sleep=0), _where("w-long", 90, sleep=0))
    said = []
    man = rec.run_record(out=tmp_path, gpu="cpu", steps=steps, say=said.append, repo_root=tmp_path, python=stand_in,
                         gpus=1)
    assert _started(said) == {1: "w-short", 2: "w-long"} and not any("[gpu" in s for s in said)
    for e in man["files"].values():
        assert "gpu" not in e and "gpus" not in e and e["call"] == man["files"]["w-short"]["call"]


def test_the_workers_take_the_longest_expected_step_first():
    steps = [_where("a", 50), _where("b", 90), _where("c", 60), _where("d", 60)]
    man = {"files": {"a": {"seconds": 120.0}, "b": {"seconds": None}}}  # a as recorded; b, c, d by their limits
    assert [s.role for s in schedule.longest_first(steps, man)] == ["a", "b", "c", "d"]


def test_roles_runs_exactly_the_roles_asked_for_and_an_unknown_one_is_one_line(tmp_path, monkeypatch):
    python = _stand_in(tmp_path, monkeypatch)
    steps, said = _steps(bad=False), []
    kw = dict(out=tmp_path, gpu="cpu", steps=steps, repo_root=tmp_path, python=python)
    first = rec.run_record(say=lambda s: None, **kw)
    man = rec.run_record(parts=("encoder",), roles=("t-two",), say=said.append, **kw)  # recorded, of another part
    assert man["files"]["t-one"] == first["files"]["t-one"] and man["files"]["t-two"] != first["files"]["t-two"]
    assert _started(said) == {1: "t-two"} and any("why: asked for" in s for s in said)
    with pytest.raises(UsageError) as e:
        rec.run_record(roles=("t-two", "t-three"), say=said.append, **kw)
    assert str(e.value) == "unknown role t-three; the roles are t-one, t-two"


@pytest.mark.parametrize("value", ["0", "abc", "-1", "1.5"])
def test_a_bad_gpu_count_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch, value):
    monkeypatch.setenv(schedule.GPUS_ENV, value)
    with pytest.raises(UsageError) as e:
        rec.run_record(out=tmp_path, gpu="cpu", steps=_steps(bad=False), say=lambda s: None, repo_root=tmp_path)
    assert str(e.value).startswith(f"{schedule.GPUS_ENV}={value}: ") and "\n" not in str(e.value)
    assert not (tmp_path / "cpu").exists()


def test_how_many_steps_run_at_once(monkeypatch):
    monkeypatch.delenv(schedule.GPUS_ENV, raising=False)
    assert schedule.record_gpus(None, 4) == 4 and schedule.record_gpus(None, None) == 1  # every GPU; a named one: 1
    assert schedule.record_gpus(3, None) == 3
    monkeypatch.setenv(schedule.GPUS_ENV, "2")
    assert schedule.record_gpus(None, 4) == 2 and schedule.record_gpus(None, None) == 2
    monkeypatch.setenv(schedule.GPUS_ENV, "8")
    with pytest.raises(UsageError, match=f"^{schedule.GPUS_ENV}=8: this machine has 4 GPU"):
        schedule.record_gpus(None, 4)


def test_each_worker_gets_an_equal_disjoint_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    shares = schedule.cpu_shares(4)
    assert [launch.cpu_list_text(c) for c in shares] == ["0-15", "16-31", "32-47", "48-63"]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 9, 10})
    assert schedule.cpu_shares(3) == [[0, 1], [2, 3], [8, 9]]  # what is left over runs no step
    assert schedule.cpu_shares(2) == [[0, 1, 2], [3, 8, 9]] and launch.cpu_list_text([3, 8, 9]) == "3,8-9"
    assert launch.parse_cpu_list("3,8-9") == [3, 8, 9] and launch.parse_cpu_list("0-15") == list(range(16))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert schedule.cpu_shares(2) == [[5], [5]]  # fewer cores than workers: shared


def test_a_forked_step_sizes_torch_and_inductor_to_its_cores():
    """The forkserver imported torch and inductor's config with every core; a step kept to fewer cores
    has the threads a process started on them would have."""
    code = ("import os, torch, torch._inductor.config as c; from lfm2vl_lab.measure.launch import keep_to_cpus; "
            "keep_to_cpus([min(os.sched_getaffinity(0))]); print(torch.get_num_threads(), c.compile_threads, "
            "len(os.sched_getaffinity(0)))")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    assert out.stdout.split() == ["1", "1", "1"], out.stderr


def test_steps_that_run_at_once_tell_their_files_apart_by_name():
    """A step's files are those named ``<name>-*.json`` that changed while it ran: no name may be another's
    with a dash after it, or a step running beside it would take its files."""
    names = [s.name for s in rec.STEPS]
    assert not [(a, b) for a in names for b in names if b.startswith(a + "-")]
