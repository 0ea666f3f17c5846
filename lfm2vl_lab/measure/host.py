"""How fast this machine's host is, in three numbers, printed at the start of every device call.

The H200 machines the device tool lends report the same CPU model, CPU count and platform, yet the
host side of one call can differ twice over between them: transformers' encoder on one 512 px image
took 3.82 ms on one machine and 6.39 ms on another, with the same GPU-busy time. Every eager number
and every launch-bound one moves with the host, so each call's log names its host's speed:

* ``python``: a fixed pure-Python loop (the interpreter alone), ms;
* ``torch op``: one tiny CPU tensor op through torch's dispatcher, µs per op;
* ``cuda launch``: one tiny in-place op on a CUDA tensor, launched back to back and synchronised at
  the end, µs per launch (the host's launch rate: the GPU finishes each long before the next arrives).

Each is the median of five rounds. ``record`` runs it once per call, in a process of its own before
the first step, and keeps it in each manifest entry it writes (``host``): roles recorded on different
hosts can then be told apart. A host-side probe: its numbers are not a GPU result file.

    python -m lfm2vl_lab.measure.host [--json]     # scripts/host_probe.py: the line alone
"""

from __future__ import annotations

import json
import statistics
import sys
import time

LOOP = 2_000_000
OPS = 5_000
ROUNDS = 5


def _median_s(fn) -> float:
    fn()  # once before timing: first-call costs are not the host's speed
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def python_loop() -> None:
    total = 0
    for i in range(LOOP):
        total += i
    assert total == LOOP * (LOOP - 1) // 2


def probe() -> dict:
    """The three numbers (``cuda launch`` None without a CUDA GPU), and the device."""
    import torch

    out = {"python_ms": 1e3 * _median_s(python_loop)}
    a, b = torch.ones(4), torch.ones(4)

    def cpu_ops():
        for _ in range(OPS):
            torch.add(a, b)

    out["torch_op_us"] = 1e6 * _median_s(cpu_ops) / OPS
    out["cuda_launch_us"], out["device"] = None, "cpu"
    if torch.cuda.is_available():
        x = torch.zeros(1, device="cuda")

        def launches():
            for _ in range(OPS):
                x.add_(1)
            torch.cuda.synchronize()

        out["cuda_launch_us"] = 1e6 * _median_s(launches) / OPS
        out["device"] = torch.cuda.get_device_name(0)
    return out


def line(p: dict) -> str:
    cuda = f"{p['cuda_launch_us']:.2f} us per CUDA launch" if p["cuda_launch_us"] is not None else "no CUDA GPU"
    return (f"host: python loop {p['python_ms']:.1f} ms, {p['torch_op_us']:.2f} us per torch CPU op, {cuda} "
            f"(medians of {ROUNDS}; {p['device']})")


if __name__ == "__main__":
    found = probe()
    print(json.dumps(found) if "--json" in sys.argv[1:] else line(found), flush=True)
