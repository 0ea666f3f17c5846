"""Do the fused decode graphs give the same bits on every replay of the same request, and with which
launches? An engine whose kernels start early (programmatic dependent launch, PDL) and read an input
before the kernel writing it has finished would give different bits from run to run.

For each variant (``--variants``: ``fold`` or ``nofold`` (the GEMV's folds, ``linear.fold``) or ``torch``
(torch's linears, no GEMV: ``gemv=False``) or ``nosplit`` (``nofold`` with K never split) or ``split``
(``nofold`` with K split for any number of rows, as the table split it before 2026-12-04), then
``none``, ``gemv`` (the GEMV launched with PDL), ``inductor`` (inductor's decode kernels compiled with it)
or ``both``), and optionally ``-nocudnn`` (torch's SDPA kept off cuDNN's attention), one fused 450M
engine in bf16 is compiled and captured, and one batch of requests is run
``--runs`` times from the same prompt through ``--steps`` decode steps. Each run's tokens and last logits
are compared with the first run's: the number of runs that differ, and the largest logit difference.

First (``--kernel-replays``), the GEMV alone: the decode step's three split shapes for 1, 2 and 4 rows in
one graph, split as the table splits one row, replayed on the same inputs; a race inside the kernel
shows there without the engine.

    python scripts/pdl_race_probe.py --json race.json
    python scripts/pdl_race_probe.py --variants fold-none,fold-both --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lfm2vl_lab import build_model  # noqa: E402
from lfm2vl_lab.kernels import gemv as gemv_module  # noqa: E402
from lfm2vl_lab.measure.results import code_hash  # noqa: E402
from lfm2vl_lab.serving.engine import TextEngine  # noqa: E402

VARIANTS = "fold-none,fold-gemv,fold-inductor,fold-both,nofold-none,nofold-both"


def split_any_rows(table):
    """The table as it was before K was split for one row only: where one row splits, any rows split
    (with one row's tiling)."""
    def pick(m, n, k, sms=gemv_module.SMS_DEFAULT):
        one = table(1, n, k, sms)
        return one if one.split_k > 1 else table(m, n, k, sms)
    return pick


def make_engine(model, name: str, lengths):
    """The fused 450M engine of variant ``name``, compiled and captured for ``lengths``, and a function that
    puts the GEMV's table back (a ``split`` or ``nosplit`` variant swaps it while the engine is used)."""
    fold, launches, *rest = name.split("-")
    cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
    if rest == ["nocudnn"]:  # torch's SDPA never picks cuDNN's attention (it is not deterministic, torch says)
        torch.backends.cuda.enable_cudnn_sdp(False)
    table = gemv_module.pick_config
    if fold == "nosplit":  # the GEMV never splits K (so no workspace, no counters): is the race there?
        gemv_module.pick_config = lambda *a, **k: table(*a, **k)._replace(split_k=1)
    elif fold == "split":  # K split for two rows too, as before: is the race still there?
        gemv_module.pick_config = split_any_rows(table)
    fold = "nofold" if fold in ("nosplit", "split") else fold
    gemv_pdl, inductor_pdl = launches in ("gemv", "both"), launches in ("inductor", "both")
    torch._dynamo.reset()  # this variant compiles its own decode step
    with mock.patch.dict(os.environ, {gemv_module.PDL_ENV: "1" if gemv_pdl else "0"}):
        eng = TextEngine(model, max_batch=len(lengths), max_len=512, fuse=True, pdl=inductor_pdl,
                         gemv=fold != "torch")
        if eng.linear is not None:
            eng.linear.fold = fold == "fold"
        eng.capture([(len(lengths), max(lengths))])

    def restore():
        gemv_module.pick_config = table
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
    return eng, restore


def run_variant(model, name: str, emb, lengths, runs: int, steps: int) -> dict:
    eng, restore = make_engine(model, name, lengths)
    outs = []
    for _ in range(runs):
        eng.prompt(len(lengths), max(lengths)).copy_(emb)
        eng.prefill(lengths)
        first = eng.sample()
        tokens = torch.cat([first[:, None], eng.decode(steps)], 1)
        outs.append((tokens, eng.logits[: len(lengths)].float().clone()))
    restore()
    t0, l0 = outs[0]
    differ = [i for i, (t, lg) in enumerate(outs) if not (torch.equal(t, t0) and torch.equal(lg, l0))]
    worst = max((lg - l0).abs().max().item() for _, lg in outs)
    row = {"variant": name, "runs": runs, "steps": steps, "runs_differing": len(differ),
           "max_logit_diff": worst, "tokens_differing_runs": sum(not torch.equal(t, t0) for t, _ in outs),
           "recaptures": eng.stats.recaptures, "eager": dict(eng.stats.eager)}
    print(f"{name:16s} runs differing from the first: {len(differ)} of {runs - 1} "
          f"(tokens: {row['tokens_differing_runs']}), largest logit difference {worst:.4g}", flush=True)
    return row


# The 450M decode step's split shapes (N, K) in its order: q/k/v, out_proj, w2
KERNEL_SHAPES = ((2048, 1024), (1024, 1024), (1024, 4608))


def kernel_alone(rows: int, replays: int) -> dict:
    """The GEMV alone, split over K as the table splits one row (an explicit config), for ``rows`` rows:
    the step's three split shapes in one graph, sharing their workspaces as in the engine, replayed
    ``replays`` times on the same inputs. Replays whose outputs differ from the first's: a race inside
    the kernel (or between launches that share a workspace) without the engine around it."""
    xs = {k: torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _, k in KERNEL_SHAPES}
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for n, k in KERNEL_SHAPES]
    cfgs = [gemv_module.pick_config(1, n, k) for n, k in KERNEL_SHAPES]

    def step():
        return [gemv_module.gemv(xs[w.shape[1]], w, None, cfg) for w, cfg in zip(ws, cfgs)]

    step()  # compiles, and makes the workspaces outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = step()
    graph.replay()
    torch.cuda.synchronize()
    first = [y.clone() for y in ys]
    refs = [torch.nn.functional.linear(xs[w.shape[1]].float(), w.float()) for w in ws]
    differ, worst = 0, 0.0  # worst: the largest error against fp32 over all replays (a missing partial is large)
    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        differ += any(not torch.equal(y, f) for y, f in zip(ys, first))
        worst = max(worst, max((y.float() - r).abs().max().item() for y, r in zip(ys, refs)))
    row = {"rows": rows, "replays": replays, "splits": [c.split_k for c in cfgs], "replays_differing": differ,
           "max_err_vs_fp32": worst}
    print(f"kernel alone, {rows} row(s), splits {row['splits']}: replays differing from the first: {differ} of "
          f"{replays}; largest error against fp32 {worst:.3g}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=VARIANTS)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--lengths", default="280,211", help="the prompt lengths of the batch's requests")
    p.add_argument("--kernel-replays", type=int, default=2000,
                   help="first, the GEMV alone for 1, 2 and 4 rows, this many graph replays (0: not)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    kernel = [kernel_alone(rows, a.kernel_replays) for rows in (1, 2, 4)] if a.kernel_replays else []
    run_variants(a, run_variant, kernel=kernel)
    return 0


def run_variants(a, run, **extra) -> dict:
    """The 450M model in bf16 and one batch of prompts (``a.lengths``), then ``run(model, name, emb, lengths,
    a.runs, a.steps)`` for each of ``a.variants``: the rows, written to ``a.json`` after each."""
    model = build_model("lfm2-vl-450m", dtype=torch.bfloat16, device="cuda", text_layers="full")
    H = model.config.text_config.hidden_size
    lengths = [int(n) for n in a.lengths.split(",")]
    emb = torch.randn(len(lengths), max(lengths), H, device="cuda", dtype=torch.bfloat16)
    res = {"code_hash": code_hash(), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), **extra,
           "rows": []}
    for name in a.variants.split(","):
        res["rows"].append(run(model, name, emb, lengths, a.runs, a.steps))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    raise SystemExit(main())
