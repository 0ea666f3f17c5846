"""Where a record step's fixed seconds go: each phase of a step's start, timed in one fresh process.

Every step of ``python -m lfm2vl_lab record`` runs in a process of its own, and the step logs show
that even the smallest (``graph-apis``, a four-layer toy) takes about 30 s. This probe times, in the
order a step meets them: importing torch, transformers and the kit's measuring modules; the CUDA
context and a first kernel; building each preset on the device with random weights; the processor;
the pointer check's build or load; capturing the encoder's graphs; and the interpreter's exit (the
parent times the whole child, so what follows the last phase is the exit). One JSON line per phase
on stdout, then a summary line. A host-side measurement: its numbers are not a GPU result file.

    python scripts/startup_probe.py                      # the child, timed from a parent
    python scripts/startup_probe.py --presets lfm2-vl-450m lfm2-vl-1.6b
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = time.perf_counter()
_last = T0


def phase(name: str, **extra) -> None:
    """One line: the phase's seconds and the seconds since the process's first line."""
    global _last
    now = time.perf_counter()
    print(json.dumps({"phase": name, "s": round(now - _last, 3), "at_s": round(now - T0, 3), **extra}), flush=True)
    _last = now


def child(presets: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    phase("import torch", version=torch.__version__)
    import transformers

    phase("import transformers", version=transformers.__version__)
    import lfm2vl_lab.measure.bench  # noqa: F401  (what `bench` imports; `ttft` shares most of it)
    import lfm2vl_lab.measure.ttft  # noqa: F401

    phase("import the kit's measuring modules")
    if not torch.cuda.is_available():
        phase("no CUDA here: the device phases are skipped")
        return
    torch.cuda.init()
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    phase("CUDA context and a first kernel", gpu=torch.cuda.get_device_name(0))
    from lfm2vl_lab import GraphedEncoder, build_model
    from lfm2vl_lab.core import ptrcheck

    ptrcheck.build_pointer_check()
    phase("pointer check built or loaded")
    for name in presets:
        model = build_model(name, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        phase(f"build {name} on the device (random weights, and its processor)")
        genc = GraphedEncoder(model)
        phase(f"{name}: GraphedEncoder")
        info = genc.capture()
        torch.cuda.synchronize()
        phase(f"{name}: capture", graphs=len(info))
        del genc, model
        torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["lfm2-vl-450m"])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.presets)
        return 0
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", "--presets", *a.presets], capture_output=True,
                         text=True)
    whole = time.perf_counter() - t
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    for x in lines:
        print(json.dumps(x))
    last = lines[-1]["at_s"] if lines else 0.0
    print(json.dumps({"phase": "whole process, as its parent saw it", "s": round(whole, 3),
                      "after_last_phase_s": round(whole - last, 3), "rc": out.returncode}))
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
