"""Which steps of a ``record`` call run, and where and when: on a machine of several GPUs, one step per
GPU at once.

:func:`record_gpus` says how many steps run at once: the GPUs the record process sees, or fewer where
``LFM2VL_RECORD_GPUS`` says so. Each worker is a thread of the record process that owns one GPU
(``CUDA_VISIBLE_DEVICES`` in its steps' environment) and an equal, disjoint share of the cores
(:func:`cpu_shares`, :data:`.launch.CPUS_ENV`): a step's launch overhead is what the kit measures, so
steps must not take each other's cores. The workers take the steps from one queue, longest first
(:func:`longest_first`), so that the longest step does not start last and hold the call open alone.
"""

from __future__ import annotations

import os
import threading

from .launch import CPUS_ENV, Launcher, cpu_list_text
from .values import UsageError

GPUS_ENV = "LFM2VL_RECORD_GPUS"


def record_gpus(gpus: int | None, machine: int | None) -> int:
    """How many steps run at once, one GPU each: ``gpus`` where given, else :data:`GPUS_ENV` where set
    (at most ``machine``), else ``machine``: the GPUs the record process sees (None where the caller
    named the GPU, as the tests do: then 1)."""
    if gpus is not None:
        if gpus < 1:
            raise UsageError(f"gpus={gpus}: at least one")
        return gpus
    asked = os.environ.get(GPUS_ENV, "").strip()
    if not asked:  # unset or empty, as a script passes an unset variable
        return machine or 1
    n = int(asked) if asked.isascii() and asked.isdigit() else 0
    if n < 1:
        raise UsageError(f"{GPUS_ENV}={asked}: a whole number of GPUs, at least 1")
    if machine is not None and n > machine:
        raise UsageError(f"{GPUS_ENV}={asked}: this machine has {machine} GPU(s)")
    return n


def asked_roles(roles, steps) -> set[str]:
    """The roles a call was asked for by name (none where ``roles`` is None), each checked against ``steps``."""
    known = [s.role for s in steps]
    unknown = [r for r in roles or () if r not in known]
    if unknown:
        raise UsageError(f"unknown role {', '.join(unknown)}; the roles are {', '.join(known)}")
    return set(roles or ())


def expected_seconds(step, man: dict) -> float:
    """How long ``step`` is expected to take: its seconds when the set last recorded it, else its limit."""
    seconds = (man["files"].get(step.role) or {}).get("seconds")
    return step.limit_s if seconds is None else seconds


def longest_first(todo, man: dict) -> list:
    """``todo`` in the order the workers take it: longest expected first (ties in ``todo``'s order)."""
    return sorted(todo, key=lambda s: -expected_seconds(s, man))


def cpu_shares(n: int) -> list[list[int]] | None:
    """``n`` equal, disjoint shares of this process's cores, each of neighbouring cores (which tend to
    share caches and a memory node); cores an uneven split leaves over run no step. With fewer cores than
    workers, the workers share them. None where the platform cannot pin a process to cores."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    size = len(cpus) // n
    if size == 0:
        return [[cpus[i % len(cpus)]] for i in range(n)]
    return [cpus[i * size:(i + 1) * size] for i in range(n)]


def devices(n: int) -> list[str]:
    """Each worker's ``CUDA_VISIBLE_DEVICES``: its index among the GPUs the record process sees, named as
    the record process's own ``CUDA_VISIBLE_DEVICES`` names it where that is set."""
    seen = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not seen:
        return [str(i) for i in range(n)]
    if len(seen) < n:
        raise UsageError(f"CUDA_VISIBLE_DEVICES={','.join(seen)} names {len(seen)} GPU(s), fewer than the "
                         f"{n} steps asked to run at once ({GPUS_ENV})")
    return seen[:n]


def places(n: int) -> list[dict]:
    """Per worker: ``env``, added to its steps' environment (its GPU, its cores), and ``entry``, added to
    their manifest entries (which GPU, and how many steps ran at once)."""
    shares = cpu_shares(n)
    return [{"env": {"CUDA_VISIBLE_DEVICES": dev, **({CPUS_ENV: cpu_list_text(shares[i])} if shares else {})},
             "entry": {"gpu": i, "gpus": n}} for i, dev in enumerate(devices(n))]


def labelled(say, label: str, lock: threading.Lock):
    """``say``, one call at a time, each line with ``label`` (if any) after its lead (``"== "`` or its
    indent): the lines of workers that run at once, whole and told apart."""

    def said(text: str) -> None:
        lines = []
        for line in str(text).split("\n"):
            lead = "== " if line.startswith("== ") else line[:len(line) - len(line.lstrip(" "))]
            lines.append(f"{lead}{label} {line[len(lead):]}" if label else line)
        with lock:
            say("\n".join(lines))

    return said


def spread(order: list, n: int, run_one) -> None:
    """Run ``run_one(item, k, worker)`` for each item of ``order`` (``k`` its place in it, from 1) on ``n``
    worker threads, each taking the next item when its last one ends. An exception in a worker stops
    the workers taking more (the steps running go on to their end) and is raised here."""
    queue, lock, errors = iter(enumerate(order, 1)), threading.Lock(), []

    def work(worker: int) -> None:
        while True:
            with lock:
                k, item = next(queue, (None, None))
                if k is None or errors:
                    return
            try:
                run_one(item, k, worker)
            except BaseException as e:  # raised again in the calling thread
                with lock:
                    errors.append(e)
                return

    # daemons: a call interrupted in the join below ends without waiting for the steps under way
    threads = [threading.Thread(target=work, args=(i,), name=f"record-gpu-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_steps(todo: list, workers: int, man: dict, python: str, record_step, say) -> None:
    """Run each step of ``todo`` through ``record_step(step, k, n, launch, say, where)`` (``k`` of ``n``;
    ``where``: its worker's :func:`places`, None where the steps run in turn) with one
    :class:`~.launch.Launcher` for them all: in ``todo``'s order one after another where ``workers`` is
    1 (or one step is left), else on ``workers`` GPUs at once, longest first, each line said labelled
    with its GPU."""
    n, lock = min(workers, len(todo)), threading.Lock()
    if n <= 1:
        with Launcher(python, say) as launch:
            for k, step in enumerate(todo, 1):
                record_step(step, k, len(todo), launch, say)
        return
    where, order = places(n), longest_first(todo, man)
    say(f"== {len(order)} steps on {n} GPUs at once, longest first; each GPU's cores: "
        + ", ".join(w["env"].get(CPUS_ENV, "all") for w in where))
    says = [labelled(say, f"[gpu {i}]", lock) for i in range(n)]
    with Launcher(python, labelled(say, "", lock)) as launch:
        spread(order, n, lambda step, k, i: record_step(step, k, len(order), launch, says[i], where[i]))
