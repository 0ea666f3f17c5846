"""``python -m lfm2vl_lab record``: the reference run, every file the course reads, in one go.

Each :class:`Step` is one of the kit's own commands (``bench``, ``check``, ``ttft``, …) and plays one
*role* in the reference set. Each step runs in a fresh process under its own time limit (so a hang or
a crashed CUDA context costs one step, not the run), and after each the manifest
``<out>/<gpu>/reference.json`` is rewritten (:mod:`lfm2vl_lab.report.reference`): a run cut short
keeps what it finished. Each step's output goes to ``<out>/<gpu>/logs/<role>.log``.

On one GPU the steps run one after another, in :data:`STEPS` order; on several, one per GPU at once
(:mod:`.schedule`): a worker thread per GPU takes the next step, longest first, and runs it with only
its GPU visible and on its own share of the cores (``LFM2VL_RECORD_GPUS`` runs fewer at once). Their
entries name the GPU (``gpu``) and how many ran at once (``gpus``); every entry names its call
(``call``: when it started), so the report counts a call on several GPUs by its span.

A step is forked from a forkserver that imported torch, transformers and the kit's commands once for
the call (:mod:`.launch`): torch's imports are paid once a call, not once a step, and each step is still
a process of its own with its own CUDA context. ``LFM2VL_RECORD_LAUNCH=exec`` starts each step with
``python -m`` instead; each manifest entry says how its step was launched (``launch``).

Each entry of the manifest says how many seconds its step took. Where a machine is lent for less
time than the whole run takes, the run is resumable: ``--deadline`` leaves the steps that no longer fit for
the next call, and a call records only the roles that this tree has not recorded yet (under ``--out``
or in the repo's ``data/results/<gpu>/``). ``--part`` (``encoder``: the encoder's benchmarks, checks
and probes; ``engine``: the text model's peers and time to first token) picks steps by kind.

Each role names its code (:mod:`.role_code`): its manifest entry holds the code hash of the whole
tree that recorded it, and the files its numbers depend on with their blob ids (``measures``,
``role_hash``). So a set may hold roles of several code versions, and ``--changed`` re-records only
the roles whose own files changed since: a change to ``check`` re-runs ``check``, a change to the
encoder's core every role that runs it, a change to comments or docstrings none
(:func:`.role_code.same_code`). A role recorded by another command (its arguments changed in
:data:`STEPS`) is recorded again too. Each entry also names its call's host speed (``host``:
:func:`host_speed`). ``--take DIR`` brings a device call's ``--out`` into the repo
and moves the files the new manifest no longer names into ``archive/``, gzipped.

A step *beside* the set (``vllm``: vLLM itself, which the kit's code only drives) is recorded only
when its part is named (``--part vllm``). A *resumable* step (``vllm`` again: about five minutes a
preset) can take more than one call: it gets ``--deadline`` and, once it has left a partial file
recorded by the same files of its role, ``--resume`` with it (a change elsewhere in the tree leaves it
resumable, and its entry keeps each call's whole-tree code hash); its file joins the set when it says
``"complete": true``, and until then the manifest lists it under ``partial``.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .launch import Launcher
from .manifest import FORMAT, base_manifest, file_step, partial_file, utc_now, why_text
from .results import REPO_ROOT, RESULTS_ROOT, code_hash, gpu_slug
from .role_code import changed_files, command_modules
from .schedule import asked_roles, record_gpus, run_steps


@dataclass(frozen=True)
class Step:
    """One command of the reference run: ``python -m lfm2vl_lab <argv> --out <root>`` writes one
    ``<name>-<date>.json``, which plays ``role``."""

    role: str
    part: str
    name: str
    argv: tuple[str, ...]
    limit_s: int
    beside: bool = False  # recorded only when its part is named
    resumable: bool = False  # may take several calls: gets --deadline, and --resume with its partial file
    measures: tuple[str, ...] = ()  # the modules its command runs (default: role_code.COMMAND_MODULES)

    @property
    def command(self) -> str:
        return "python -m lfm2vl_lab " + " ".join(self.argv)

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules whose closure this step's numbers depend on (:mod:`.role_code`)."""
        return self.measures or command_modules(self.argv[0])


PRESETS = ("lfm2-vl-450m", "lfm2-vl-1.6b")
PR_PRESET = "lfm2-vl-3b"  # the model vLLM PR #44930 was benchmarked on
# Every mode on every workload, profiled: the benchmark of each preset.
_BENCH = ("--mode", "hf-eager,lab-eager,lab-graph,compile", "--workload", "1x512,1x256,1..16x512,tiled,stream",
          "--stream-n", "24", "--repeats", "30", "--profile", "--no-progress", "--figure", "none")
_SWEEP = ("--mode", "lab-graph", "--repeats", "30", "--no-progress", "--figure", "none")


def _bench(role: str, *argv: str, limit_s: int, part: str = "encoder") -> Step:
    return Step(role, part, role, ("bench", *argv, "--name", role), limit_s)


STEPS: tuple[Step, ...] = (
    Step("check", "encoder", "check", ("check",), 300),
    _bench("bench-450m", "--preset", "lfm2-vl-450m", *_BENCH, limit_s=200),
    _bench("bench-1.6b", "--preset", "lfm2-vl-1.6b", *_BENCH, limit_s=260),
    # the kernel options one by one, profiled (the kernel classes of one call)
    _bench("kernels", "--preset", "lfm2-vl-450m", "--mode", "lab-graph", "--workload", "1x512,4x512,16x512,tiled",
           "--fuse-qkv", "off,on", "--fuse-elementwise", "off,on", "--dense-graphs", "off,on", "--repeats", "30",
           "--profile", "--no-progress", "--figure", "none", limit_s=150),
    _bench("sweep-rules", "--preset", "lfm2-vl-450m", "--workload", "1x512,4x512,tiled", "--cu-rule",
           "safe,repeat_last", "--max-seqlen-mode", "tight,loose", *_SWEEP, limit_s=80),
    _bench("sweep-budgets", "--preset", "lfm2-vl-450m", "--workload", "1x512,4x512,stream", "--stream-n", "40",
           "--budgets", "auto", "--budgets", "256,1024", "--budgets", "64,128,256,512,1024,2048,4096", *_SWEEP,
           limit_s=100),
    _bench("sweep-attention", "--preset", "lfm2-vl-450m", "--workload", "1x512,tiled", "--attention",
           "varlen,sdpa_blockmask", "--fuse-qkv", "off,on", *_SWEEP, limit_s=80),
    Step("attention", "encoder", "attention", ("attention",), 80),
    Step("graph-apis", "encoder", "graph-apis", ("graph-apis",), 150),
    # the graph config vLLM PR #44930 was measured with beside the kit's, on its model: capture time,
    # graph memory, padding waste on the stream, latency
    _bench("pr-config", "--preset", PR_PRESET, "--mode", "lab-graph", "--workload", "1x512,4x512,16x512,tiled,stream",
           "--stream-n", "40", "--graph-config", "kit,pr", "--repeats", "30", "--profile", "--no-progress",
           "--figure", "none", limit_s=150),
    # the strongest off-the-shelf peer, torch.compile(mode="max-autotune") of transformers' image path,
    # beside reduce-overhead: most of the limit is max-autotune's first compile (about 100 s)
    _bench("autotune", "--preset", PRESETS[0], "--mode", "compile,compile-max,lab-graph", "--workload", "1x512",
           "--repeats", "30", "--profile", "--no-progress", "--figure", "none", limit_s=220),
    # the TTFT grid with the fused engine: most of what it adds to the unfused grid is the fused
    # engine's first compile, per preset (its seconds are in the file's setup); with decode graphs per
    # cache span its first try ran past 400 s (probes/2026-12-04/ttft-20261204-043024-incomplete.log:
    # 1.6B's tiled x4 and x8 left at 409 s), so one call of its own
    Step("ttft", "engine", "ttft", ("ttft", *(a for p in PRESETS for a in ("--preset", p)), "--image", "1x512,tiled",
                                    "--requests", "1,2,4,8", "--repeats", "7", "--decode-tokens", "16", "--profile",
                                    "--image-path", "--fuse", "on", "--no-progress"), 500),
    Step("e2e", "engine", "e2e", ("e2e", *(a for p in PRESETS for a in ("--preset", p)), "--image", "1x512,tiled",
                                  "--requests", "1,4", "--repeats", "3", "--profile", "--no-progress"), 160),
    # the text model's peers on one prompt (generate, transformers' static compile, torch.compile, the
    # engine unfused and fused): most of the limit is compile, the fused engine's and both peers'
    Step("engine", "engine", "engine", ("engine", "--preset", PRESETS[0], "--profile", "--no-progress"), 160),
    # the PR's own benchmark, like for like: its model and graph config, whole requests of 128 output
    # tokens at 1, 2 and 4 requests, and an offline-throughput run (the kit's pipeline stands in for vLLM)
    Step("request-3b", "engine", "request-3b", ("ttft", "--preset", PR_PRESET, "--image", "1x512,tiled", "--requests",
                                                "1,2,4", "--repeats", "5", "--decode-tokens", "16", "--request-tokens",
                                                "128", "--throughput", "32", "--graph-config", "pr", "--fuse", "on",
                                                "--no-progress", "--name", "request-3b"), 330),
    # the kit's pipeline on vLLM's A/B (the same cases, arms, weights and judge), apart from vLLM's own
    # run so that a change to the kit's serving code re-runs no vLLM engine
    Step("pipeline", "engine", "pipeline", ("pipeline", "--no-progress"), 330),
    # after the graphs: the GPU's roofs, a kernel boundary's cost inside a graph, and a decode step's
    # kernel classes at the 450M's shapes against them (notebook 08); seconds, most of them startup
    Step("roofline", "engine", "roofline", ("roofline", "--no-progress"), 120),
    # vLLM itself (the release scripts/vllm_bundle.py carries): three engines per preset, encoder graphs
    # off, the PR's config and the kit's; four to six minutes a preset, so it takes two or three calls
    # (resumable)
    Step("vllm", "vllm", "vllm", ("vllm",), 1300, beside=True, resumable=True),
)
PARTS = tuple(dict.fromkeys(s.part for s in STEPS))
# what a plain `record` runs: every part but those beside the set
DEFAULT_PARTS = tuple(dict.fromkeys(s.part for s in STEPS if not s.beside))


def stale(man: dict, step: Step, changed: bool, hash_: str, root: Path = REPO_ROOT) -> list[str] | None:
    """Why ``step``'s role must be recorded (again) by this tree; None: it need not be. A missing role
    must be, and so must one recorded by another command (:data:`STEPS` changed its arguments).
    Otherwise, ``changed``: when the files it measures differ from those that recorded it (the files,
    or every file where its entry names none); else when any code differs (a full record: every role of
    exactly this tree, which also resumes a full record cut short)."""
    entry = man["files"].get(step.role)
    if entry is None:
        return ["not recorded"]
    if entry.get("command", step.command) != step.command:  # other arguments: other numbers, whatever the code
        return ["its command changed"]
    if not changed:
        return None if entry.get("code_hash") == hash_ else [f"code {str(entry.get('code_hash'))[7:19]}"]
    files = changed_files(entry, step.modules, root)
    return ["recorded before roles named their code"] if files is None else files or None


def _run_step(step: Step, folder: Path, out, launch: Launcher, left: float | None = None,
              resume: Path | None = None, env: dict[str, str] | None = None) -> tuple[dict, list[Path]]:
    """Run one step in a process of its own (:mod:`.launch`), ``env`` added to its environment, its
    output into ``logs/<role>.log``; returns the manifest entry and the result files it wrote. A
    resumable step gets ``--deadline`` (the time left, less a margin) and ``--resume`` with its partial
    file; it then rewrites that file's name."""
    argv, limit = list(step.argv), step.limit_s
    if step.resumable:
        limit = int(min(limit, left)) if left is not None else limit
        argv += ["--deadline", str(max(limit - 20, 1))] + (["--resume", str(resume)] if resume else [])
    before = {p: p.stat().st_mtime for p in folder.glob(f"{step.name}-*.json")}
    # The first step of a call pays the forkserver's imports: a step's seconds are what the call spent
    # on it, so the steps of a record sum to its cost. Each step compiles into caches of its own, empty
    # (:func:`cold_compile_caches`): a first compile is a cold one, whatever ran before it on the machine.
    t0 = time.perf_counter()
    started = launch.start()
    imports = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix=f"lfm2vl-{step.role}-") as caches, \
            (folder / "logs" / f"{step.role}.log").open("a" if resume else "w") as fh:
        rc = launch.run([*argv, "--out", str(out)], fh, limit, {**cold_compile_caches(caches), **(env or {})})
    new = sorted(p for p in folder.glob(f"{step.name}-*.json") if before.get(p) != p.stat().st_mtime)
    entry = {"file": new[-1].name if new else None, "command": step.command, "part": step.part, "rc": rc,
             "seconds": round(time.perf_counter() - t0, 1), "date": utc_now(), "launch": launch.mode,
             "compile_cache": "empty"}
    if started:  # this step started the forkserver: its seconds hold the imports, said here
        entry["forkserver_s"] = round(imports, 1)
    return entry, new


def cold_compile_caches(folder) -> dict[str, str]:
    """The environment that points torch.compile's caches (inductor's FX graphs, AOTAutograd's and
    autotuning results, under ``TORCHINDUCTOR_CACHE_DIR``) and Triton's compiled kernels
    (``TRITON_CACHE_DIR``) into ``folder``, empty. Left at their defaults, both persist on the machine
    between processes, so a step's "first compile" would be a cache hit wherever an earlier step (or an
    earlier call on a warm machine) compiled the same graph, and its seconds would depend on the order
    the steps ran in."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(Path(folder) / "inductor"), "TRITON_CACHE_DIR": str(Path(folder) / "triton")}


def host_speed(python: str = sys.executable) -> dict:
    """This call's host speed (:mod:`.host`), probed in a process of its own so that no CUDA context of
    the recording process outlives it; ``{"error": ...}`` where the probe fails (the record goes on)."""
    try:
        out = subprocess.run([python, "-m", "lfm2vl_lab.measure.host", "--json"], capture_output=True, text=True,
                             timeout=180, cwd=REPO_ROOT)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}


@dataclass
class _Call:
    """What the steps of one record call share; its workers read and write ``man`` under ``lock``."""

    man: dict
    folder: Path
    repo_folder: Path
    out: Path
    hash_: str
    steps: tuple[Step, ...]
    why: dict[str, list[str]]
    ends: float | None  # the deadline, on time.perf_counter's clock
    host: dict | None
    started: str  # when the call started: each entry's ``call``
    lock: threading.Lock = field(default_factory=threading.Lock)


def _record_step(call: _Call, step: Step, k: int, n: int, launch: Launcher, say, where: dict | None = None) -> None:
    """The ``k``-th of the call's ``n`` steps: left for the next call where its limit no longer fits,
    else run (``where``: its worker's GPU and cores, :func:`.schedule.places`) and filed in the manifest."""
    left = None if call.ends is None else call.ends - time.perf_counter()
    if left is not None and (step.limit_s > left and not (step.resumable and left >= 60)):
        say(f"== [{k}/{n}] {step.role}: left for the next call (limit {step.limit_s} s, {left:.0f} s left)")
        return
    with call.lock:
        resume = partial_file(step, call.man, (call.folder, call.repo_folder), call.hash_, say)
    say(f"== [{k}/{n}] {step.role}: {step.command} (limit {step.limit_s} s; why: "
        f"{why_text(call.why[step.role])})" + (f", resuming {resume.name}" if resume else ""))
    entry, new = _run_step(step, call.folder, call.out, launch, left, resume, where and where["env"])
    entry = {**entry, "call": call.started, **(where["entry"] if where else {})}
    with call.lock:
        man = call.man
        file_step(man, step, entry, new, call.folder, call.hash_, say, resumed=resume is not None, host=call.host)
        man.update(format=FORMAT, code_hash=call.hash_, finished=utc_now())
        man["complete"] = all(s.role in man["files"] for s in call.steps) and not man["failed"]
        (call.folder / "reference.json").write_text(json.dumps(man, indent=1) + "\n")


def run_record(parts=DEFAULT_PARTS, out=RESULTS_ROOT, gpu: str | None = None, steps=STEPS, python: str = sys.executable,
               say=print, repo_root=RESULTS_ROOT, deadline_s: float | None = None, again: bool = False,
               changed: bool = False, derive=None, gpus: int | None = None,
               roles: tuple[str, ...] | None = None) -> dict:
    """Run the steps of ``parts``, each as ``python -m lfm2vl_lab … --out <out>``, and keep the
    manifest ``<out>/<gpu>/reference.json`` up to date after each. Returns the manifest.

    * ``gpu``: the device name the files are filed under (default: CUDA device 0's); ``python``: the
      interpreter that runs the steps (:mod:`.launch`: the forkserver's, or each step's).
    * Which roles run (:func:`stale`): those missing, and those recorded by other code than this
      tree's (``changed``: only those whose own files changed); ``again``: every role of ``parts``;
      ``roles``: exactly those, whatever their part and however recorded. A role recorded by this code
      is not run again, so calling ``record`` again finishes a run cut short. A role that runs replaces
      its entry alone.
    * ``gpus``: how many steps run at once, one GPU each (:func:`.schedule.record_gpus`: by default the
      machine's GPUs or ``LFM2VL_RECORD_GPUS``, one where ``gpu`` is given); one runs them in turn.
    * ``deadline_s``: seconds for the whole call; a step whose limit no longer fits is left for the
      next call (never started, so never cut off; a resumable one stops at it: see the module).
    * A step that fails or overruns its limit is listed under ``failed`` with its exit status, the
      file it left moves to ``<out>/<gpu>/incomplete/``, and the run goes on with the next step. The
      manifest is ``complete`` once every role of ``steps`` is recorded and none failed.
    * ``derive(man, before, out, repo_root, say)``, if given, runs at the end: the command passes
      :func:`lfm2vl_lab.cli.cli_record.derive_set`, which redraws the figures and the docs' generated tables.
    """
    machine = None
    if gpu is None:
        import torch

        gpu, machine = torch.cuda.get_device_name(0), torch.cuda.device_count()
    workers, asked = record_gpus(gpus, machine), asked_roles(roles, steps)  # refused before any work
    ends, started = None if deadline_s is None else time.perf_counter() + deadline_s, utc_now()
    folder, repo_folder = Path(out) / gpu_slug(gpu), Path(repo_root) / gpu_slug(gpu)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    hash_ = code_hash()
    man = base_manifest(folder, repo_folder, gpu, hash_)
    man.setdefault("failed", {})
    before = json.dumps([man["files"], man.get("partial")])  # what derived files were drawn from
    why = ({s.role: ["asked for"] for s in steps if s.role in asked} if roles is not None else
           {s.role: ["--again"] if again else stale(man, s, changed, hash_) for s in steps if s.part in parts})
    todo = [s for s in steps if why.get(s.role)]
    host = host_speed(python) if todo else None  # once a call: the roles it records share one machine
    if host:
        say(f"== host: {json.dumps(host)}")
    call = _Call(man, folder, repo_folder, out, hash_, steps, why, ends, host, started)
    run_steps(todo, workers, man, python, partial(_record_step, call), say)
    if derive is not None:
        derive(man, before, out, repo_root, say)
    missing = [s.role for s in steps if s.role not in man["files"]]
    behind = [s.role for s in steps if s.role not in missing and stale(man, s, True, hash_)]
    say(f"reference set: {folder / 'reference.json'}: {len(man['files'])} of {len(steps)} roles"
        + (f", still to record: {', '.join(missing)}" if missing else ", complete")
        + (f"; of other code than this tree's: {', '.join(behind)}" if behind else "") + f" (code {hash_})")
    return man


def archive_dir(folder: Path) -> Path:
    """``folder``'s ``archive/``, made where missing."""
    (folder / "archive").mkdir(exist_ok=True)
    return folder / "archive"


def pack_archive(folder: Path) -> list[Path]:
    """Gzip each result file in ``folder/archive/`` (``<name>.json`` -> ``<name>.json.gz``, the same bytes
    inside; :func:`~lfm2vl_lab.report.reference.load_archived` reads either). Earlier runs are read
    rarely, and every device call carries the tree: uncompressed they were most of its 64 MiB, and left
    too little room for vLLM's bundle in one call. Returns the files it wrote."""
    out = []
    for path in sorted((folder / "archive").glob("*.json")):
        gz = path.with_name(path.name + ".gz")
        gz.write_bytes(gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))  # mtime 0: the same bytes each time
        path.unlink()
        out.append(gz)
    return out


def take(src, dst=RESULTS_ROOT, say=print) -> list[str]:
    """Bring a device call's results (``src/<gpu>/``, the ``--out`` of its ``record``) into the repo's
    ``dst/<gpu>/``: the manifest, every file it names, and the logs; then move each result file the
    new manifest no longer names into ``archive/``, where earlier runs live, gzipped (:func:`pack_archive`;
    nothing stale stays beside the set, where a reader could take it by its name). Returns what it did, a
    line each."""
    import shutil

    done = []
    for man_path in sorted(Path(src).glob("*/reference.json")):
        man, there = json.loads(man_path.read_text()), Path(dst) / man_path.parent.name
        named = {e["file"] for e in [*man["files"].values(), *man.get("partial", {}).values()]}
        (there / "logs").mkdir(parents=True, exist_ok=True)
        for f in sorted(named) + ["reference.json"]:
            if (man_path.parent / f).is_file():
                shutil.copy2(man_path.parent / f, there / f)
                done.append(f"took {there.name}/{f}")
        for log in sorted((man_path.parent / "logs").glob("*")):
            shutil.copy2(log, there / "logs" / log.name)
            done.append(f"took {there.name}/logs/{log.name}")
        for old in sorted(p for p in there.glob("*.json") if p.name not in named | {"reference.json"}):
            old.rename(archive_dir(there) / old.name)
            done.append(f"archived {there.name}/{old.name}")
        done += [f"gzipped {there.name}/archive/{p.name}" for p in pack_archive(there)]
    for line in done:
        say(line)
    return done
