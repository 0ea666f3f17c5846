"""The weight stamp's pointer check both ways (core/ptrcheck.py), on each preset's encoder stamp.

Builds each ``--preset`` with random weights on ``--device``, stamps what the encoder's graphs read (as the
graph manager does at capture), and times one call with ``timeit`` (the median, and the fastest, of
``--rounds`` rounds of ``--calls`` calls): torch's ``_tensors_data_ptrs_at_indices_equal`` on the
stamp's lists, the kit's ``PointerCheck.equal``, and the whole ``WeightStamp.current()`` with each.
It also times building the extension (``--cold``: into a fresh folder, so the compiler runs; without
it, ``build_pointer_check()`` as a user calls it, into torch's extension cache, where later stamps find
it) and loading the build from a fresh process, and checks that both ways see a ``.data`` swap and a
``torch.utils.swap_tensors``. A host-side measurement: its numbers are not a GPU result file.

    python scripts/ptrcheck_bench.py --preset lfm2-vl-450m --preset lfm2-vl-1.6b --cold --json ptrcheck.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lfm2vl_lab import build_model  # noqa: E402
from lfm2vl_lab.core import ptrcheck  # noqa: E402
from lfm2vl_lab.core.graphed_encoder import GraphedEncoder  # noqa: E402
from lfm2vl_lab.core.guard import WeightStamp, named_tensors  # noqa: E402

WARM_LOAD = ("import sys, time, torch; sys.path.insert(0, sys.argv[1]); from lfm2vl_lab.core import ptrcheck; "
             "t = time.perf_counter(); ptrcheck.build_pointer_check(); print(time.perf_counter() - t)")


def per_call_us(fn, calls: int, rounds: int) -> dict:
    times = [t / calls * 1e6 for t in timeit.repeat(fn, number=calls, repeat=rounds)]
    return {"median_us": statistics.median(times), "min_us": min(times)}


def build_times(cold: bool) -> dict:
    """Seconds to build (or find) the extension here, and to load the build in a fresh process."""
    if cold:
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="ptrcheck-")
    t = time.perf_counter()
    ptrcheck.build_pointer_check()
    built = time.perf_counter() - t
    out = subprocess.run([sys.executable, "-c", WARM_LOAD, str(ROOT)], capture_output=True, text=True, check=True)
    return {"cold": cold, "build_s": built, "warm_load_s": float(out.stdout.split()[-1]),
            "folder": str(ptrcheck.extension_dir())}


def stamp_for(adapter, which: str) -> WeightStamp:
    ptrcheck._CHOSEN["ext"] = ptrcheck.load_built() if which == ptrcheck.EXTENSION else None
    stamp = adapter.weight_stamp()  # what the graph manager stamps at capture
    assert stamp.pointer_check == which and stamp.current(), (stamp.pointer_check, stamp.dirty, stamp.changes())
    return stamp


def sees_swaps() -> dict:
    """Both ways answer False after a ``.data`` swap and after ``swap_tensors``."""
    out = {}
    for which in (ptrcheck.TORCH, ptrcheck.EXTENSION):
        ptrcheck._CHOSEN["ext"] = ptrcheck.load_built() if which == ptrcheck.EXTENSION else None
        for how in ("data", "swap_tensors"):
            net = torch.nn.Linear(4, 4)
            stamp = WeightStamp({"net": net})
            if how == "data":
                net.weight.data = torch.zeros(4, 4)
            else:
                torch.utils.swap_tensors(net.bias, torch.nn.Parameter(torch.zeros(4)))
            out[f"{which} sees {how}"] = not stamp.current()
    return out


def time_preset(preset: str, device: str, calls: int, rounds: int) -> dict:
    """One preset's encoder stamp: each way's time per call."""
    model = build_model(preset, dtype=torch.bfloat16, device=device)
    adapter = GraphedEncoder(model).adapter  # fuses q/k/v first, as capture finds them
    stamps = {which: stamp_for(adapter, which) for which in (ptrcheck.TORCH, ptrcheck.EXTENSION)}
    assert all(s.current() for s in stamps.values())
    tensors = list(named_tensors(stamps[ptrcheck.TORCH].read_parts()).values())
    pointers, indices = [t.data_ptr() for t in tensors], list(range(len(tensors)))
    raw = ptrcheck.load_built().PointerCheck(tensors, pointers)
    fn = torch._C._tensors_data_ptrs_at_indices_equal
    timed = {"torch function": lambda: fn(tensors, pointers, indices), "PointerCheck.equal": raw.equal,
             **{f"WeightStamp.current ({which})": s.current for which, s in stamps.items()}}
    per_call = {name: per_call_us(f, calls, rounds) for name, f in timed.items()}
    print(f"{preset}:")
    for name, t in per_call.items():
        print(f"{name:>34}: median {t['median_us']:.3f} µs, fastest {t['min_us']:.3f} µs ({len(tensors)} tensors)")
    return {"tensors": len(tensors), "per_call": per_call}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="a preset to time (repeat for more; default lfm2-vl-450m)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cold", action="store_true", help="build into a fresh folder (the compiler runs)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    presets = args.preset or ["lfm2-vl-450m"]
    result = {"torch": torch.__version__, "python": sys.version.split()[0], "device": args.device,
              "build": build_times(args.cold),
              "presets": {p: time_preset(p, args.device, args.calls, args.rounds) for p in presets},
              "sees_swaps": sees_swaps()}
    print(json.dumps({k: result[k] for k in ("build", "sees_swaps")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
