"""How ``record`` starts a step, ``python -m lfm2vl_lab <argv>``: in a fresh process, one of two ways.

* ``forkserver`` (the default where :mod:`multiprocessing` offers it): once per record call a forkserver,
  started by ``record``'s interpreter, imports :data:`PRELOAD` (torch, transformers, the kit's
  commands), and each step is a child forked from it. The child is a fresh process with its own CUDA
  context and fresh global torch state, as under ``exec``, but it does not import torch and the kit
  again. The forkserver is a new process, so the record process's own CUDA context (it names the GPU)
  never reaches it; nothing in the preload may initialise CUDA either, which each child checks before
  it runs its command.
* ``exec``: ``python -m lfm2vl_lab <argv>`` in a subprocess, imports and all.

``LFM2VL_RECORD_LAUNCH=fork|exec`` picks one. Either way the step's fd 1 and 2 (C++ output too) go to
its log, each line after the seconds since the step started; a step that overruns its limit is killed
(``"timeout"``); its exit status is recorded as Python gives it, a signal's as minus its number.

Where steps run side by side (:mod:`.schedule`), each is given its share of the cores
(:data:`CPUS_ENV`) and keeps to it either way: a step's launch overhead is what the kit measures, so
steps must not take each other's cores. One :class:`Launcher` serves every worker thread.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import connection, forkserver, reduction, spawn

from .role_code import COMMAND_MODULES
from .values import UsageError

LAUNCH_ENV = "LFM2VL_RECORD_LAUNCH"
# The cores a step keeps to ("0-15", "0-3,8-11"), where steps run side by side: unset, it has the machine's.
CPUS_ENV = "LFM2VL_RECORD_CPUS"
# What every step imports before it measures: the forkserver imports these once per record call. None
# of them may touch CUDA at import (a forked child cannot use its parent's CUDA context, nor the
# driver once the parent called cuInit, as torch.cuda.is_available() does): _cuda_problem checks.
PRELOAD: tuple[str, ...] = ("torch", "transformers", "lfm2vl_lab.cli.cli",
                            *dict.fromkeys(m for mods in COMMAND_MODULES.values() for m in mods))


def launch_mode() -> str:
    """``"forkserver"`` or ``"exec"``, as :data:`LAUNCH_ENV` asks (default: the forkserver where there is one)."""
    asked = os.environ.get(LAUNCH_ENV, "")
    forkable = "forkserver" in multiprocessing.get_all_start_methods()
    if asked == "exec" or (asked == "" and not forkable):
        return "exec"
    if asked in ("", "fork") and forkable:
        return "forkserver"
    raise UsageError(f"{LAUNCH_ENV}={asked}: fork or exec" if asked not in ("", "fork")
                     else f"{LAUNCH_ENV}=fork: this Python has no forkserver; use exec")


class Launcher:
    """Starts the steps of one record call, each with :meth:`run`; a context manager that stops the
    forkserver (started at the first step) when the call ends, so that a later call imports the code
    the tree holds then."""

    def __init__(self, python: str = sys.executable, say=print, mode: str | None = None):
        self.python, self.say, self.mode = python, say, mode or launch_mode()
        self._ctx = self._exe = None
        # Held to start the forkserver (once, whichever worker asks first) and wherever multiprocessing
        # reads a child's exit status: Process.start polls every other live child of this process
        # (process._cleanup), and two threads reading one child's status pipe at once would leave one of
        # them an EOF, which popen_forkserver records as exit status 255.
        self._lock = threading.Lock()

    def run(self, argv: list[str], fh, limit: float, env: dict[str, str] | None = None) -> int | str:
        """Run ``python -m lfm2vl_lab <argv>`` with ``env`` added to its environment, its output into
        ``fh``; its exit status, or "timeout"."""
        if self.mode == "exec":
            return _logged([self.python, "-m", "lfm2vl_lab", *argv], fh, limit, env or {})
        self.start()
        return _forked(self._ctx, argv, fh, limit, self._cuda, env or {}, self._lock)

    def start(self) -> bool:
        """Start the forkserver and wait for its imports, unless it runs (or steps are exec'd): called
        before the step's command starts, so that its log's seconds count from the command (the record
        counts the imports in the step's seconds all the same: they are what the call spent on it).
        True where this call started it: of steps that start at once, one pays the imports, the others
        wait for them."""
        if self.mode == "exec":
            return False
        with self._lock:
            if self._ctx is not None:
                return False
            self._start()
            return True

    def _start(self) -> None:
        _stop_forkserver()  # one started earlier in this process has another preload, or older code
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        self._exe = spawn.get_executable()
        ctx.set_executable(self.python)
        self._cuda = _has_cuda()
        t0 = time.perf_counter()
        ready = ctx.Process(target=_ready, args=(PRELOAD,), name="record-forkserver-ready")
        try:  # the imports, once for the call
            ready.start()
            ready.join()
            missing = ready.exitcode
            ready.close()
        except (OSError, EOFError) as e:
            missing = e
        if not isinstance(missing, int) or missing < 0:
            self.close()
            raise RuntimeError(f"the forkserver ({self.python}) did not start: {missing!r}; {LAUNCH_ENV}=exec "
                               "launches each step with python -m instead")
        self._ctx = ctx
        # the forkserver skips a module that fails to import, without a word: its steps import it themselves
        got = f"{len(PRELOAD) - missing} of {len(PRELOAD)}" if missing else f"{len(PRELOAD)}"
        self.say(f"== forkserver: {got} modules imported in {time.perf_counter() - t0:.1f} s, once for this "
                 "call's steps, each a fresh process forked from it")

    def close(self) -> None:
        if self._exe is not None:
            _stop_forkserver()
            spawn.set_executable(self._exe)
            self._ctx = self._exe = None

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _has_cuda() -> bool:
    """Whether this process has a CUDA context (it named the GPU): then its steps must reach CUDA too
    (:func:`_cuda_problem`)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _stop_forkserver() -> None:
    """Stop this process's forkserver, if one runs. Killed first: it holds nothing to save, and a
    grandchild that escaped its step and still holds the forkserver's alive pipe would make the polite
    stop wait for ever."""
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()


def _copy_lines(stream, fh, t0: float) -> threading.Thread:
    """A thread that writes each line of ``stream`` to ``fh`` after the seconds since ``t0``
    (``[  12.3 s] …``: where a step's time goes, read off its log)."""

    def copy():
        with stream:
            for line in stream:
                fh.write(f"[{time.perf_counter() - t0:7.1f} s] {line}")
                fh.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    return reader


def _logged(cmd: list[str], fh, limit: float, env: dict[str, str]) -> int | str:
    """Run ``cmd`` (the ``exec`` launch), its output into ``fh``; its exit status, or "timeout"."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"})
    if env.get(CPUS_ENV):
        # set on the new process rather than in a preexec_fn, which may deadlock a child forked while other
        # threads run (record's workers); the interpreter is then only starting, and torch, imported later,
        # sizes its thread pool by these cores (torch.get_num_threads follows the affinity it starts with)
        try:
            os.sched_setaffinity(proc.pid, parse_cpu_list(env[CPUS_ENV]))
        except ProcessLookupError:
            pass  # the step already ended
    reader = _copy_lines(proc.stdout, fh, t0)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "timeout"
    reader.join(timeout=5)
    return rc


def _forked(ctx, argv: list[str], fh, limit: float, cuda: bool, env: dict[str, str],
            lock: threading.Lock) -> int | str:
    """Run one step as a child of the forkserver (the ``forkserver`` launch): its fd 1 and 2 are the
    write end of a pipe whose lines go to ``fh``. At the limit the step's whole process group is killed,
    and so is anything a finished step left running in it. ``lock``: :class:`Launcher`'s, held wherever
    multiprocessing reads an exit status, so that steps may run from several threads."""
    r, w = os.pipe()
    t0 = time.perf_counter()
    proc = ctx.Process(target=_step, args=(argv, _ChildFd(w), cuda, env), name="record-step")
    try:
        with lock:
            proc.start()
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)  # the child holds its own copy: the pipe ends when the step's processes are gone
    reader = _copy_lines(open(r, errors="replace"), fh, t0)
    try:
        connection.wait([proc.sentinel], limit)  # not join(limit): it reads the exit status, outside the lock
    finally:
        with lock:
            rc = "timeout" if proc.exitcode is None else proc.exitcode
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group the child made (_step)
            except (ProcessLookupError, PermissionError):
                pass  # none left, or the child died before it made one
            if proc.exitcode is None:
                proc.kill()
            proc.join()
            proc.close()
    reader.join(timeout=5)
    return rc


class _ChildFd:
    """An fd that travels to the forkserver's child with the process object, the way multiprocessing
    sends a Connection's (SCM_RIGHTS); it arrives there as an fd of the child's own."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (reduction.DupFd(self.fd),)


def _received_fd(dup) -> int:
    return dup.detach()


def _ready(preload: tuple[str, ...]) -> None:
    """The forkserver's first child: starting it waits for the preload; it exits with the number of
    modules of ``preload`` that the forkserver could not import."""
    sys.exit(sum(name not in sys.modules for name in preload))


def _step(argv: list[str], out: int, cuda: bool, env: dict[str, str]) -> None:
    """The child: ``python -m lfm2vl_lab <argv>`` in this process, as the interpreter would run it."""
    # a process group of its own, so that a kill at the limit reaches what the command started too; in
    # the record's session still, so that what ends the session (a lent machine's call) ends the step
    os.setpgid(0, 0)
    for fd in (1, 2):  # at fd level: what C++ writes reaches the log too
        os.dup2(out, fd)
    os.close(out)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    # the forkserver's environment is the one it started with: the step's own goes in here
    os.environ.update(env, PYTHONUNBUFFERED="1")  # unbuffered as exec sets it, for what the command starts
    if env.get(CPUS_ENV):
        keep_to_cpus(parse_cpu_list(env[CPUS_ENV]))
    problem = _cuda_problem(cuda)
    if problem:
        raise SystemExit(problem)  # one line on stderr, exit 1
    sys.argv = [sys.argv[0], *argv]  # run_module makes argv[0] lfm2vl_lab/__main__.py, as -m does
    try:
        runpy.run_module("lfm2vl_lab", run_name="__main__", alter_sys=True)  # sys.exit(main())
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException:
        sys.excepthook(*sys.exc_info())  # the traceback, as an uncaught exception prints it
        code = 1
    # a forked child ends in os._exit, which skips what the interpreter runs at exit
    atexit._run_exitfuncs()
    raise SystemExit(code)  # multiprocessing reads it as Python does: None 0, an int itself, else 1


def keep_to_cpus(cpus: list[int]) -> None:
    """Keep this forked step, and what it starts, to ``cpus``, with the threads a process started on them
    would have: the forkserver imported torch (and inductor's config) with every core of the machine,
    and they sized their pools by those."""
    os.sched_setaffinity(0, cpus)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cpus))
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:  # one the user set stays
        inductor.compile_threads = len(cpus)


def cpu_list_text(cpus: list[int]) -> str:
    """``[0, 1, 2, 3, 8, 9]`` as ``"0-3,8-9"``: the form of :data:`CPUS_ENV` (and of ``taskset -c``)."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def parse_cpu_list(text: str) -> list[int]:
    """:func:`cpu_list_text`'s inverse."""
    cpus = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def _cuda_problem(cuda: bool) -> str | None:
    """Why this forked child cannot use CUDA as a fresh process would, in one line; None: it can."""
    torch = sys.modules.get("torch")
    if torch is None:  # not imported by the preload: nothing in it touched CUDA through torch
        return None
    where = "a module of the forkserver's preload (lfm2vl_lab.measure.launch.PRELOAD) "
    fix = f"; {LAUNCH_ENV}=exec launches each step with python -m instead"
    # torch marks the child of a process with a CUDA context a "bad fork", and is_initialized() then
    # reads False: ask both
    if torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork():
        return f"record: {where}initialised CUDA when imported, and a forked step cannot use that context{fix}"
    if cuda and not torch.cuda.is_available():
        return (f"record: no CUDA device in this forked step though the record process has one: {where}"
                f"initialised the CUDA driver (cuInit, as torch.cuda.is_available() does){fix}")
    return None
