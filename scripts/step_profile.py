"""Where a record step's seconds go: one step of ``python -m lfm2vl_lab record`` (its command from
``measure/record.py``'s ``STEPS``), run in a fresh process under cProfile, and its seconds split by
where they were spent: torch.compile's machinery (dynamo, inductor, fake tensors, FX, sympy, Triton),
Python's own ``compile()``, imports, transformers, the kit, the rest of torch, waiting on the GPU.

Self time is what is split, not cumulative time: torch.profiler and dynamo swap the interpreter's
profile hook while a step runs, which leaves the cumulative times of outer frames short, but each
function's own time is counted whenever the hook is cProfile's. cProfile slows Python-heavy code, so
the shares matter, not the seconds; the step's result file (under ``--out``/res) is not a
measurement and never joins the reference set.

    python scripts/step_profile.py --role bench-450m --out /tmp/probe      # on the H200
    python scripts/step_profile.py --summarize /tmp/probe/bench-450m.prof  # anywhere, from the saved profile
"""

from __future__ import annotations

import argparse
import json
import pstats
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# where a function's own time goes, by its file (first match wins); C functions (file "~") by name
BUCKETS = (
    ("torch.compile's machinery", ("torch/_inductor/", "torch/_dynamo/", "torch/_subclasses/", "torch/fx/",
                                   "torch/_functorch/", "torch/_prims", "torch/_refs/", "torch/_decomp/",
                                   "torch/utils/_sympy/", "/sympy/", "/triton/")),
    ("imports", ("<frozen importlib",)),
    ("transformers", ("/transformers/",)),
    ("the kit", ("lfm2vl_lab/",)),
    ("matplotlib", ("/matplotlib/",)),
    ("the rest of torch", ("/torch/",)),
)
C_BUCKETS = (("Python's compile() (code generation, imports)", ("builtins.compile",)),
             ("waiting on the GPU", ("synchronize",)),
             ("torch's C++ ops", ("torch._C.", "of 'torch._C.")))


def bucket(file: str, fn: str) -> str:
    """Which part of a step a function's own time belongs to."""
    if file == "~":
        return next((name for name, keys in C_BUCKETS if any(k in fn for k in keys)), "other built-ins")
    file = file.replace("\\", "/")
    return next((name for name, keys in BUCKETS if any(k in file for k in keys)), "other Python")


def phase_seconds(prof_path: Path) -> dict:
    """Each bucket's self seconds in a saved profile (largest first), and the profile's total."""
    stats = pstats.Stats(str(prof_path))
    out: dict[str, float] = {}
    for (file, _, fn), (_, _, tt, _, callers) in stats.stats.items():
        name, shares = bucket(file, fn), {}
        if name == "other built-ins" and callers:
            # a generic built-in (isinstance, a read) counts where it was called from: each caller's share
            for (cf, _, cfn), c in callers.items():
                shares[bucket(cf, cfn)] = shares.get(bucket(cf, cfn), 0.0) + c[2]
            shares[name] = shares.get(name, 0.0) + tt - sum(shares.values())  # what no caller's share holds
        else:
            shares[name] = tt
        for k, v in shares.items():
            out[k] = out.get(k, 0.0) + v
    return {**{k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])},
            "total (profiled)": round(stats.total_tt, 3)}


def top_functions(prof_path: Path, n: int = 30) -> list[str]:
    """The ``n`` functions with the most self seconds, with their bucket."""
    stats = pstats.Stats(str(prof_path)).stats
    rows = sorted(((tt, f"{Path(file).parent.name}/{Path(file).name}:{fn}", bucket(file, fn))
                   for (file, _, fn), (_, _, tt, _, _) in stats.items()), reverse=True)
    return [f"{tt:8.2f} s  {name}  ({b})" for tt, name, b in rows[:n]]


def run_step(role: str, out: Path, limit_s: float) -> dict:
    """The step's command under cProfile; past ``limit_s`` it gets SIGINT, and cProfile still saves the
    profile of what ran (``stopped`` says so)."""
    sys.path.insert(0, str(ROOT))
    from lfm2vl_lab.measure.record import STEPS

    step = next((s for s in STEPS if s.role == role), None)
    if step is None:
        raise SystemExit(f"no record step plays role {role!r}: one of {', '.join(s.role for s in STEPS)}")
    out.mkdir(parents=True, exist_ok=True)
    prof = out / f"{role}.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "lfm2vl_lab", *step.argv,
           "--out", str(out / "res")]
    t, stopped = time.perf_counter(), False
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        rc = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        stopped = True
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    return {"role": role, "command": step.command, "rc": rc, "stopped_at_limit": stopped,
            "wall_s": round(time.perf_counter() - t, 2), "profile": prof.name}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", action="append", default=[], help="a record step's role (repeatable)")
    p.add_argument("--out", type=Path, default=Path("step-profile"))
    p.add_argument("--limit", type=float, default=170.0, help="seconds per step before it is stopped (SIGINT)")
    p.add_argument("--summarize", type=Path, nargs="*", default=[], help="saved .prof files to split")
    a = p.parse_args()
    done = [run_step(role, a.out, a.limit) for role in a.role]
    for d in done:
        prof = a.out / d["profile"]
        if prof.exists():
            d["phases_s"] = phase_seconds(prof)
            print("\n".join(top_functions(prof)))
        print(json.dumps(d), flush=True)
    for prof in a.summarize:
        print(json.dumps({"profile": str(prof), "phases_s": phase_seconds(prof)}))
        print("\n".join(top_functions(prof)))
    for d in done:
        (a.out / f"{d['role']}.json").write_text(json.dumps(d, indent=1) + "\n")
    return max((d["rc"] for d in done), default=0)


if __name__ == "__main__":
    sys.exit(main())
