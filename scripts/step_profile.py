"""Where a record step's seconds go: one step of ``python -m lfm2vl_lab record`` (its command from
``measure/record.py``'s ``STEPS``), run in a fresh process under cProfile, and its seconds split into
the phases that every step pays (imports, building models, first compiles, graph captures, the
profiler, transformers' reference path) and the rest (warm-up and the timed calls).

cProfile slows Python-heavy code, so the phases' seconds are upper bounds and the step's result file
(written under ``--out``/res) is not a measurement: it stays with the probe, never in the reference set.
A phase is the cumulative time of the named functions, outermost call only; phases can nest (a capture
inside a build, say), so they are shown side by side, not summed.

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

# phase -> the functions whose outermost calls it counts, as (file name ends with, function name)
PHASES = {
    "imports": (("<frozen importlib._bootstrap>", "_find_and_load"),),
    "build a model (random weights)": (("lfm2vl_lab/model/presets.py", "build_model"),),
    "first compile (dynamo and inductor)": (("torch/_dynamo/convert_frame.py", "_compile"),),
    "encoder graph capture": (("lfm2vl_lab/core/manager.py", "capture"),),
    "text engine capture": (("lfm2vl_lab/serving/engine.py", "capture"),),
    "torch.profiler (profiled calls)": (("torch/profiler/profiler.py", "__exit__"),
                                        ("torch/autograd/profiler.py", "__exit__")),
    "CUDA synchronize": (("torch/cuda/__init__.py", "synchronize"),),
}


def phase_seconds(prof_path: Path) -> dict:
    """Each phase's cumulative seconds in a saved profile, and the profile's total."""
    stats = pstats.Stats(str(prof_path)).stats  # {(file, line, fn): (cc, nc, tt, ct, callers)}
    out = {}
    for phase, funcs in PHASES.items():
        out[phase] = round(sum(ct for (file, _, fn), (_, _, _, ct, _) in stats.items()
                               if any(file.replace("\\", "/").endswith(f) and fn == name for f, name in funcs)), 2)
    out["total (profiled)"] = round(pstats.Stats(str(prof_path)).total_tt, 2)
    return out


def top_functions(prof_path: Path, n: int = 30) -> list[str]:
    """The ``n`` kit, torch and transformers functions with the most cumulative seconds."""
    stats = pstats.Stats(str(prof_path)).stats
    rows = sorted(((ct, f"{Path(file).parent.name}/{Path(file).name}:{fn}") for (file, _, fn), (_, _, _, ct, _)
                   in stats.items() if any(k in file for k in ("lfm2vl_lab", "torch", "transformers"))),
                  reverse=True)
    return [f"{ct:8.2f} s  {name}" for ct, name in rows[:n]]


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
    if done:
        (a.out / "step-profile.json").write_text(json.dumps(done, indent=1) + "\n")
    return max((d["rc"] for d in done), default=0)


if __name__ == "__main__":
    sys.exit(main())
