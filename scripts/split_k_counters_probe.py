"""Are the GEMV's split-K tile counters back at zero after each replay of the fused decode step?

K is split for two rows as the table split it before 2026-12-04 (``pdl_race_probe.split_any_rows``),
since the table no longer splits two rows. A counter left above zero makes the wrong program of its
tile the last one: that program writes the tile from partial sums not all there yet, and the true
last one writes nothing. One 450M engine in bf16 (the GEMV without PDL, no folds), two requests, then
each workspace's counters summed after the capture and after each of a few runs; and the same runs'
last logits compared with the first's.

    python scripts/split_k_counters_probe.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdl_race_probe import split_any_rows  # noqa: E402  (this folder, first on sys.path)

from lfm2vl_lab import build_model  # noqa: E402
from lfm2vl_lab.kernels import gemv as G  # noqa: E402
from lfm2vl_lab.serving.engine import TextEngine  # noqa: E402


def counters() -> dict:
    return {f"{k[0]}/{k[3]}": int(t.abs().sum()) for k, t in G._WORKSPACES.items() if k[2] == "counters"}


def main() -> int:
    os.environ[G.PDL_ENV] = "0"
    G.pick_config = split_any_rows(G.pick_config)
    torch.manual_seed(0)
    model = build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda", text_layers="full")
    H = model.config.text_config.hidden_size
    lengths = [int(n) for n in (sys.argv[1] if len(sys.argv) > 1 else "280,211").split(",")]
    emb = torch.randn(len(lengths), max(lengths), H, device="cuda", dtype=torch.bfloat16)
    eng = TextEngine(model, max_batch=len(lengths), max_len=512, fuse=True, pdl=False)
    eng.linear.fold = False
    print("before capture:", counters(), flush=True)
    eng.capture([(len(lengths), max(lengths))])
    torch.cuda.synchronize()
    print("after capture: ", counters(), flush=True)
    first = None
    for run in range(4):
        eng.prompt(len(lengths), max(lengths)).copy_(emb)
        eng.prefill(lengths)
        torch.cuda.synchronize()
        after_prefill = counters()
        eng.sample()
        if run == 0:  # step by step, the counters read after each
            for step in range(96):
                eng.decode(1)
                torch.cuda.synchronize()
                c = counters()
                if any(c.values()):
                    print(f"run {run} step {step}: counters not zero: {c}", flush=True)
                    break
        else:  # the 96 steps as one call, as the race probe runs them
            eng.decode(96)
            torch.cuda.synchronize()
        logits = eng.logits[: len(lengths)].float().clone()
        first = logits if first is None else first
        print(f"run {run}: after prefill {after_prefill}, after decode {counters()}, "
              f"logits differ from run 0 by {(logits - first).abs().max().item():.4g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
