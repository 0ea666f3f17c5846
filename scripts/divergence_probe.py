"""Where do two runs of the same request through the fused decode graphs first part? The race probe
(``pdl_race_probe.py``) counts runs whose last logits differ; this one finds the first place they differ.

One engine of each variant (``pdl_race_probe``'s names: ``fold-none``, ``split-none``, ...), two requests
(``--lengths``), ``--runs`` runs of prefill, sample and ``--steps`` decode steps, each step its own call.
Run 0's state is kept after the prefill (every layer's K/V and conv state, the prefill's last hidden
rows), after the sample (logits) and after each decode step (logits, and every layer's cache), the K/V
compared only where the run has written them (the positions past them hold the run before's steps). For each
later run that differs: the first phase that differs (``prefill``, ``sample``, ``decode s``), the rows
(requests) that differ there, and the layers whose cache differs there, in order. A kernel that races
shows as the first layer (and kind, attention or conv) to differ.

Copying the state between steps changes the timing, so the same variant's runs are first counted as the
race probe counts them (``decode(steps)`` in one call, no copies), to say whether the race survives the
copies.

    python scripts/divergence_probe.py --variants fold-none,split-none --json div.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdl_race_probe import make_engine, run_variants  # noqa: E402  (this folder, first on sys.path)

from lfm2vl_lab.serving.cache import bucket_len  # noqa: E402


def cache_state(eng) -> dict:
    """Every layer's cache as copies: ``{"k 3": ..., "v 3": ..., "conv 0": ...}``."""
    c = eng.cache
    out = {f"{kind} {i}": t.clone() for kind, d in (("k", c.k), ("v", c.v), ("conv", c.conv)) for i, t in d.items()}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0].split()[1])))


def differs(a: dict, b: dict, upto: list[int] | None = None) -> list[str]:
    """The names whose tensors differ, in layer order, each with the rows (dim 0) that differ. ``upto``: each
    row's K/V positions this run has written by then (its prefill bucket, then each decode step's
    position); the positions past them hold what the run before left there, so they are not compared."""
    out = []
    for name, t in a.items():
        u = b[name]
        if upto is not None and name[0] in "kv":  # [batch, kv_heads, max_len, d]
            rows = [r for r in range(t.shape[0]) if not torch.equal(t[r, :, : upto[r]], u[r, :, : upto[r]])]
        else:
            rows = [r for r in range(t.shape[0]) if not torch.equal(t[r], u[r])]
        if rows:
            out.append(f"{name} rows {rows}")
    return out


def one_run(eng, emb, lengths, steps: int) -> list[tuple[str, dict, list[int]]]:
    """The run's phases, their state, and each row's K/V positions written by then, in order."""
    n = len(lengths)
    eng.prompt(n, max(lengths)).copy_(emb)
    eng.prefill(lengths)
    bucket = bucket_len(max(lengths), eng.len_bucket)
    phases = [("prefill", {"hidden": eng.hidden[:n].clone(), **cache_state(eng)}, [bucket] * n)]
    eng.sample()
    phases.append(("sample", {"logits": eng.logits[:n].clone()}, [bucket] * n))
    for s in range(steps):
        eng.decode(1)
        upto = [max(bucket, length + s + 1) for length in lengths]
        phases.append((f"decode {s}", {"logits": eng.logits[:n].clone(), **cache_state(eng)}, upto))
    torch.cuda.synchronize()
    return phases


def count_runs(eng, emb, lengths, runs: int, steps: int) -> int:
    """Runs whose last logits differ from the first's, as the race probe runs them (no copies between steps)."""
    n, first, differ = len(lengths), None, 0
    for _ in range(runs):
        eng.prompt(n, max(lengths)).copy_(emb)
        eng.prefill(lengths)
        eng.sample()
        eng.decode(steps)
        lg = eng.logits[:n].clone()
        first = lg if first is None else first
        differ += not torch.equal(lg, first)
    return differ


def localize(model, name: str, emb, lengths, runs: int, steps: int) -> dict:
    eng, restore = make_engine(model, name, lengths)
    counted = count_runs(eng, emb, lengths, runs, steps)
    base, found = one_run(eng, emb, lengths, steps), []
    for r in range(1, runs):
        phases = one_run(eng, emb, lengths, steps)
        for (phase, state, upto), (_, want, _) in zip(phases, base):
            d = differs(state, want, upto)
            if d:
                found.append({"run": r, "phase": phase, "differ": d})
                print(f"{name}: run {r} first differs at {phase}: {', '.join(d[:8])}"
                      f"{' ...' if len(d) > 8 else ''}", flush=True)
                break
        del phases
    restore()
    row = {"variant": name, "runs": runs, "steps": steps, "runs_differing_without_copies": counted,
           "runs_differing_with_copies": len(found), "first_differences": found}
    print(f"{name}: without copies {counted} of {runs} runs differ; with copies {len(found)} of {runs - 1}",
          flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="fold-none,split-none")
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--lengths", default="280,211")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    run_variants(a, localize)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
