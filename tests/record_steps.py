"""Stand-ins for the kit's commands, for tests/test_record.py: importing this module adds them to the
command line (``lfm2vl_lab.cli.cli.SUBCOMMANDS``; ``bench`` takes the tests' options but only writes its file),
so that a record step ``python -m lfm2vl_lab <command> …`` takes milliseconds instead of the seconds a
real one takes to import torch. A step gets them either way it is launched: the forkserver imports this
module with its preload (the tests name it in ``launch.PRELOAD``), and the tests' stand-in python
imports it before it runs ``-m lfm2vl_lab``. Only those import it: the tests' own process keeps the
real commands."""

from __future__ import annotations

import datetime
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from lfm2vl_lab.cli import cli


def _options(p) -> None:
    for option in ("--out", "--name", "--deadline", "--resume"):
        p.add_argument(option)


def _bench_options(p) -> None:
    """The options of the tests' bench steps, as plain strings: bench's own would import the presets
    (and torch) to check --preset."""
    for option in ("--out", "--name", "--preset", "--mode", "--workload", "--repeats", "--warmup", "--device",
                   "--figure"):
        p.add_argument(option)
    p.add_argument("--no-progress", action="store_true")


def command(name: str, add_args=_options):
    def register(run):
        cli.SUBCOMMANDS[name] = (add_args, run)
        return run

    return register


def _folder(args) -> Path:
    return Path(args.out) / "cpu"


@command("bench", _bench_options)
def bench(args) -> int:
    """Writes ``<out>/cpu/<name>-<ns>.json`` as bench would."""
    (_folder(args) / f"{args.name}-{time.time_ns()}.json").write_text(json.dumps({"provenance": {"gpu": "cpu"}}))
    return 0


@command("slow")
def slow(args) -> int:
    """A resumable step that takes two calls: the first leaves a partial file, the second completes it."""
    time.sleep(0.2)  # a call that takes time, so that the manifest has seconds to sum
    assert args.deadline is not None
    name = Path(args.resume).name if args.resume else "slow-20260101-000000.json"
    parts = json.loads(Path(args.resume).read_text())["parts"] + 1 if args.resume else 1
    (_folder(args) / name).write_text(json.dumps({"parts": parts, "complete": parts == 2, "provenance": {
        "date": datetime.datetime.now().isoformat()}}))
    return 0


def _named(args) -> int:
    """Writes ``<out>/cpu/<command>-20260101-000000.json``."""
    (_folder(args) / f"{args.command}-20260101-000000.json").write_text(json.dumps({"provenance": {"gpu": "cpu"}}))
    return 0


for _name in ("fast", "long"):
    command(_name)(_named)


@command("say")
def say(args) -> int:
    """Prints a line, writes one to fd 2 below Python (as C++ would), and writes its file: how it was run."""
    print("a line from print")
    os.write(2, b"a line written to fd 2\n")
    torch = sys.modules.get("torch")
    (_folder(args) / "say-20260101-000000.json").write_text(json.dumps({
        "argv": sys.argv, "main": sys.modules["__main__"].__spec__.name, "pid": os.getpid(), "pgid": os.getpgid(0),
        "unbuffered": os.environ.get("PYTHONUNBUFFERED"), "cwd": os.getcwd(),
        "python": os.environ.get("STAND_IN_PYTHON"),
        "caches": {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")},
        "caches_hold": [str(f) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
                        for f in Path(os.environ.get(k) or "/nonexistent").parent.rglob("*")],
        "torch_imported": torch is not None,  # before this command: the forkserver's preload
        "cuda_initialized": torch is not None and torch.cuda.is_initialized(),
        "preloaded": sorted(m for m in sys.modules if m in _preload())}))
    return 0


def _preload() -> tuple[str, ...]:
    from lfm2vl_lab.measure.launch import PRELOAD

    return PRELOAD


@command("segv")
def segv(args) -> int:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
    print("about to crash", flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0


@command("boom")
def boom(args) -> int:
    raise RuntimeError("boom")


@command("exit3")
def exit3(args) -> int:
    return 3


@command("sleep")
def sleep(args) -> int:
    """Sleeps far past any test's limit, beside a process of its own that sleeps too (as inductor's
    compile workers would), whose pid it writes to ``<out>/cpu/sleeper.pid``."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (_folder(args) / "sleeper.pid").write_text(str(sleeper.pid))
    print("sleeping", flush=True)
    time.sleep(60)
    return 0



def _where_options(p) -> None:
    for option in ("--out", "--name", "--sleep"):
        p.add_argument(option)


@command("where", _where_options)
def where(args) -> int:
    """Sleeps ``--sleep`` seconds (so that steps run at once overlap), then writes
    ``<out>/cpu/<name>-<ns>.json``: the GPU and the cores it was given and had, and when it ran."""
    start = time.time()
    time.sleep(float(args.sleep or 0))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} cpus={cpus}")
    (_folder(args) / f"{args.name}-{time.time_ns()}.json").write_text(json.dumps({
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "cpus": cpus, "cpus_env": os.environ.get("LFM2VL_RECORD_CPUS"),
        "start": start, "end": time.time()}))
    return 0
