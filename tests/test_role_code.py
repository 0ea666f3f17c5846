"""measure/role_code: which files each role of the reference set measures, so that `record --changed`
re-records exactly the roles a change can move."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from script_loader import load_script

from lfm2vl_lab.measure import role_code as rc
from lfm2vl_lab.measure.record import STEPS

REPORT_LAYER = ("lfm2vl_lab/report/", "lfm2vl_lab/measure/record.py")


@pytest.mark.parametrize("step", STEPS, ids=[s.role for s in STEPS])
def test_every_role_names_its_files_and_none_of_the_report_layer(step):
    files = rc.measured_files(step.modules)
    assert set(rc.ALWAYS) <= set(files)
    assert {rc.module_path(m) for m in step.modules} <= set(files)
    assert any(f.startswith("data/presets/") for f in files)
    # drawing a table or a figure moves no number: a change there must leave every role current
    assert not [f for f in files if f.startswith(REPORT_LAYER)], step.role


def test_a_package_init_is_hashed_but_what_it_re_exports_is_not_followed():
    attention = rc.measured_files(rc.command_modules("attention"))
    assert "lfm2vl_lab/__init__.py" in attention and "lfm2vl_lab/core/__init__.py" in attention
    assert not [f for f in attention if f.startswith("lfm2vl_lab/serving/")]  # the package re-exports it
    assert "lfm2vl_lab/serving/engine.py" in rc.measured_files(rc.command_modules("ttft"))
    assert "lfm2vl_lab/measure/check.py" not in rc.measured_files(rc.command_modules("bench"))


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_closure_follows_relative_and_function_level_imports(tmp_path):
    root = _tree(tmp_path, {
        "lfm2vl_lab/__init__.py": "from .core import b\n", "lfm2vl_lab/__main__.py": "",
        "lfm2vl_lab/cli/__init__.py": "", "lfm2vl_lab/measure/__init__.py": "",
        "lfm2vl_lab/cli/cli.py": "from ..report import report\n", "lfm2vl_lab/report/__init__.py": "",
        "lfm2vl_lab/report/report.py": "", "lfm2vl_lab/measure/m.py": "from ..core.a import f\n",
        "lfm2vl_lab/core/__init__.py": "", "lfm2vl_lab/core/a.py": "def f():\n    from . import c\n",
        "lfm2vl_lab/core/b.py": "", "lfm2vl_lab/core/c.py": "import lfm2vl_lab.core.d as d\n",
        "lfm2vl_lab/core/d.py": "import torch\n", "data/presets/p.json": "{}"})
    files = rc.measured_files(("lfm2vl_lab.measure.m",), root)
    assert files == sorted([*rc.ALWAYS, "lfm2vl_lab/measure/m.py", "lfm2vl_lab/core/__init__.py",
                            "lfm2vl_lab/core/a.py", "lfm2vl_lab/core/c.py", "lfm2vl_lab/core/d.py",
                            "data/presets/p.json"])  # not b (re-exported), not report (the dispatcher's)
    entry = rc.role_code(("lfm2vl_lab.measure.m",), root)
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == []
    (root / "lfm2vl_lab/core/d.py").write_text("import torch  # edited\n")
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == ["lfm2vl_lab/core/d.py"]
    (root / "lfm2vl_lab/core/b.py").write_text("x = 1\n")  # not measured: moves nothing more
    (root / "lfm2vl_lab/core/c.py").write_text("import lfm2vl_lab.core.d as d\nfrom . import e\n")
    _tree(root, {"lfm2vl_lab/core/e.py": ""})
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == [
        "lfm2vl_lab/core/c.py", "lfm2vl_lab/core/d.py", "lfm2vl_lab/core/e.py"]
    assert rc.changed_files({"file": "x.json"}, ("lfm2vl_lab.measure.m",), root) is None  # names no code


def test_a_role_measures_the_cpp_its_modules_build():
    """core/ptrcheck.cpp is compiled and run by core/ptrcheck.py, which no import names: every role
    whose closure holds ptrcheck.py measures it too, and each C++ source of the package is named."""
    cpp = {p.relative_to(rc.REPO_ROOT).as_posix() for p in (rc.REPO_ROOT / rc.PACKAGE).rglob("*.cpp")}
    assert cpp == {src for srcs in rc.BUILT_SOURCES.values() for src in srcs} and cpp
    assert all((rc.REPO_ROOT / f).is_file() for f in rc.BUILT_SOURCES)
    for step in STEPS:
        files = rc.measured_files(step.modules)
        assert ("lfm2vl_lab/core/ptrcheck.cpp" in files) == ("lfm2vl_lab/core/ptrcheck.py" in files), step.role
    assert "lfm2vl_lab/core/ptrcheck.cpp" in rc.measured_files(rc.command_modules("bench"))


def test_a_change_to_a_built_cpp_makes_its_role_stale(tmp_path):
    root = _tree(tmp_path, {
        **{f: "" for f in rc.ALWAYS}, "lfm2vl_lab/core/__init__.py": "",
        "lfm2vl_lab/measure/m.py": "from ..core import guard\n", "lfm2vl_lab/measure/n.py": "",
        "lfm2vl_lab/core/guard.py": "from .ptrcheck import make_check\n", "lfm2vl_lab/core/ptrcheck.py": "",
        "lfm2vl_lab/core/ptrcheck.cpp": "int x;\n", "data/presets/p.json": "{}"})
    assert "lfm2vl_lab/core/ptrcheck.cpp" in rc.measured_files(("lfm2vl_lab.measure.m",), root)
    assert "lfm2vl_lab/core/ptrcheck.cpp" not in rc.measured_files(("lfm2vl_lab.measure.n",), root)
    entry, other = rc.role_code(("lfm2vl_lab.measure.m",), root), rc.role_code(("lfm2vl_lab.measure.n",), root)
    (root / "lfm2vl_lab/core/ptrcheck.cpp").write_text("int y;\n")
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == ["lfm2vl_lab/core/ptrcheck.cpp"]
    assert rc.role_code(("lfm2vl_lab.measure.m",), root)["role_hash"] != entry["role_hash"]
    assert rc.changed_files(other, ("lfm2vl_lab.measure.n",), root) == []  # a role that does not build it


def test_an_unknown_command_names_the_table_to_extend():
    with pytest.raises(KeyError, match="no modules are named for the command 'nope'.*COMMAND_MODULES"):
        rc.command_modules("nope")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


MODULE = '''"""A module."""

def f(x):
    """Twice x (measured: 49 graphs)."""
    # why: doubling
    return 2 * x
'''


def _recorded_role(tmp_path: Path) -> tuple[Path, dict]:
    """A tree whose role runs ``measure/m.py``, committed in git, and the entry a record of it keeps."""
    root = _tree(tmp_path / "repo", {**{f: "" for f in rc.ALWAYS}, "lfm2vl_lab/measure/m.py": MODULE,
                                     "data/presets/p.json": "{}"})
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "recorded")
    return root, rc.role_code(("lfm2vl_lab.measure.m",), root)


def test_comments_and_docstrings_alone_leave_a_role_current(tmp_path):
    root, entry = _recorded_role(tmp_path)
    m = root / "lfm2vl_lab/measure/m.py"
    m.write_text('"""A module, its history moved to the result files."""\n\n\ndef f(x):\n    return 2 * x  # why\n')
    assert rc.role_code(("lfm2vl_lab.measure.m",), root)["role_hash"] != entry["role_hash"]  # the bytes moved
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == []
    m.write_text(MODULE.replace("2 * x", "3 * x"))  # the code moved
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == ["lfm2vl_lab/measure/m.py"]
    m.write_text(MODULE.replace('    """Twice x (measured: 49 graphs)."""\n', '    doc = "Twice x"\n'))
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == ["lfm2vl_lab/measure/m.py"]


def test_a_tree_without_history_reads_the_recorded_versions_from_the_carried_blobs(tmp_path):
    root, entry = _recorded_role(tmp_path)
    (root / "lfm2vl_lab/measure/m.py").write_text(MODULE.replace("    # why: doubling\n", ""))
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "comment gone")
    copy = tmp_path / "device"  # what a device call gets: the working tree, no .git
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git"))
    # unable to read what was recorded, it counts the file as changed rather than guess
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), copy) == ["lfm2vl_lab/measure/m.py"]
    for tree in (root, copy):
        manifest = tree / "data/results/gpu/reference.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text(json.dumps({"files": {"r": entry}, "partial": {}}))
    carry = load_script("carry_blobs.py")
    assert carry.main(["--root", str(copy), "--check"]) == 1  # what the device call checks before it records
    assert carry.main(["--root", str(root)]) == 0
    assert sorted(p.name for p in (root / rc.BLOBS).iterdir()) == [entry["measures"]["lfm2vl_lab/measure/m.py"]]
    shutil.copytree(root / rc.BLOBS, copy / rc.BLOBS)
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), copy) == []
    assert carry.main(["--root", str(copy), "--check"]) == 0
    (copy / rc.BLOBS / entry["measures"]["lfm2vl_lab/measure/m.py"]).write_text("not the blob")
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), copy) == ["lfm2vl_lab/measure/m.py"]


# The dispatchers hold every command's options: each role compares only what its own command reaches.
CLI, OPTIONS = "lfm2vl_lab/cli/cli.py", "lfm2vl_lab/cli/cli_options.py"
ROLE_COMMANDS = sorted({rc.entry_command({"command": s.command}) for s in STEPS})


def _part(path: str, text: str, command: str) -> str:
    return rc.command_part(text.encode(), path, command)


def test_each_command_s_options_are_its_own_add_args():
    """command_part finds a command's options in cli_options.py by the name add_<command>_args."""
    from lfm2vl_lab.cli.cli import SUBCOMMANDS

    assert set(ROLE_COMMANDS) <= set(SUBCOMMANDS)
    for command, (add_args, _run) in SUBCOMMANDS.items():
        assert add_args.__name__ == rc.DISPATCHERS[OPTIONS](command)[0], command
        assert add_args.__module__ == "lfm2vl_lab.cli.cli_options", command


def test_a_new_option_of_one_command_moves_no_other_command_s_part():
    options = (rc.REPO_ROOT / OPTIONS).read_text()
    record_opt = options.replace('    p.add_argument("--dry-run", action="store_true",',
                                 '    p.add_argument("--role", action="append", default=None)\n'
                                 '    p.add_argument("--dry-run", action="store_true",')
    bench_default = options.replace('add("--repeats", type=positive_int, default=None',
                                    'add("--repeats", type=positive_int, default=3')
    assert record_opt != options and bench_default != options
    for command in ROLE_COMMANDS:
        assert _part(OPTIONS, record_opt, command) == _part(OPTIONS, options, command), command
        assert (_part(OPTIONS, bench_default, command) != _part(OPTIONS, options, command)) == (command == "bench")
    assert _part(OPTIONS, record_opt, "record") != _part(OPTIONS, options, "record")
    # a docstring or a comment moves nothing, as for any other module
    documented = options.replace('"""Options of', '"""All options of')
    assert documented != options and _part(OPTIONS, documented, "bench") == _part(OPTIONS, options, "bench")


def test_a_new_command_in_the_dispatcher_moves_no_recorded_command_but_its_shared_path_moves_all():
    cli = (rc.REPO_ROOT / CLI).read_text()
    added = cli.replace("SUBCOMMANDS: dict[str, tuple[Callable, Callable]] = {\n",
                        "def run_new_cli(args) -> int:\n    return 0\n\n\n"
                        "SUBCOMMANDS: dict[str, tuple[Callable, Callable]] = {\n"
                        '    "new": (add_new_args, run_new_cli),\n')
    added = added.replace("    add_bench_args,\n", "    add_bench_args,\n    add_new_args,\n")
    bench_run = cli.replace("def run_bench_cli(args) -> int:\n",
                            "def run_bench_cli(args) -> int:\n    args.repeats += 1\n")
    shared = cli.replace("    args = build_parser().parse_args(argv)\n",
                         "    args = build_parser().parse_args(argv)\n    args.seed = 1\n")
    assert len({cli, added, bench_run, shared}) == 4
    for command in ROLE_COMMANDS:
        assert _part(CLI, added, command) == _part(CLI, cli, command), command
        assert (_part(CLI, bench_run, command) != _part(CLI, cli, command)) == (command == "bench"), command
        assert _part(CLI, shared, command) != _part(CLI, cli, command), command
    assert _part(CLI, "def (", "bench") is None  # a file that does not parse has no part: it counts as changed


def test_a_role_is_stale_only_where_its_own_command_s_options_changed(tmp_path):
    root = _tree(tmp_path / "repo", {
        **{f: "" for f in rc.ALWAYS}, "lfm2vl_lab/measure/m.py": MODULE, "data/presets/p.json": "{}",
        OPTIONS: 'def add_bench_args(p):\n    p.add_argument("--repeats", default=30)\n\n\n'
                 'def add_record_args(p):\n    p.add_argument("--part")\n',
        CLI: 'from .cli_options import add_bench_args, add_record_args\n\n'
             'SUBCOMMANDS = {"bench": (add_bench_args, None), "record": (add_record_args, None)}\n\n\n'
             'def main():\n    return SUBCOMMANDS\n'})
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "recorded")
    entry = {"command": "python -m lfm2vl_lab bench --repeats 30", **rc.role_code(("lfm2vl_lab.measure.m",), root)}
    opts = root / OPTIONS
    opts.write_text(opts.read_text() + '    p.add_argument("--role")\n')  # record's own option
    assert rc.role_code(("lfm2vl_lab.measure.m",), root)["role_hash"] != entry["role_hash"]
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == []
    no_command = {k: v for k, v in entry.items() if k != "command"}  # whole files, as before roles had commands
    assert rc.changed_files(no_command, ("lfm2vl_lab.measure.m",), root) == [OPTIONS]
    opts.write_text(opts.read_text().replace("default=30", "default=3"))
    assert rc.changed_files(entry, ("lfm2vl_lab.measure.m",), root) == [OPTIONS]
