"""Capture and replay every graph the kit records, small enough to run under compute-sanitizer.

The tiny preset in bf16 on CUDA. For each ``cu_seqlens`` rule (``safe``, ``repeat_last``): a
``GraphedEncoder`` with dense graphs and a small run budget (budgets 64 and 512, runs of up to 3
tiles), which captures ``varlen`` and ``dense1`` at 64; ``varlen``, ``dense1``, ``dense2`` and
``dense1+varlen`` at 512; and ``dense3`` in the 768-token run budget. Then one ``encode`` per
captured (budget, variant) with patch grids that route to it, checked against the packed eager
encoder. Then a ``TextEngine`` capture (prefill, sample, decode for 1 and 2 requests) and its
replays, checked against the same engine's eager bodies: the unfused engine, then the fused one, whose
graphs hold the kit's own Triton GEMV with its split-K tile counters, and inductor's kernels, so memcheck
reads their loads and stores too; its eager twin runs the
same compiled bodies without graphs, so the tokens must be equal. Each phase prints a line before it runs,
so a sanitizer report in the same log sits under the phase that made it; a summary line ends the
run, and the exit status is 1 when a graph was not replayed or an output is off.

    python scripts/sanitize_replay.py                                     # natively: seconds
    compute-sanitizer --tool memcheck python scripts/sanitize_replay.py   # scripts/h200_run.sh sanitize
    python scripts/sanitize_replay.py --cpu   # the same routing on a CPU, with eager stand-ins for graphs
    compute-sanitizer --tool initcheck python scripts/sanitize_replay.py --probe   # see probe()
"""

from __future__ import annotations

import argparse
import sys
import time
from unittest import mock

import torch

from lfm2vl_lab import GraphedEncoder, build_model, random_processor_output
from lfm2vl_lab.core.capture import capture_graph, eager_stand_in
from lfm2vl_lab.model.parity import max_rel_error
from lfm2vl_lab.serving import engine as engine_module
from lfm2vl_lab.serving.engine import TextEngine

BUDGETS, MAX_RUN_ITEMS, WARMUP = [64, 512], 3, 1
RULES = ("safe", "repeat_last")
# One batch per captured graph: its patch grids, and the (budget, variant) it must replay.
CASES = [
    ([(12, 16)], (64, "varlen")),  # 48 tokens, not a full-length item
    ([(16, 16)], (64, "dense1")),  # the 64-token budget's full-length item
    ([(8, 16), (24, 32)], (512, "varlen")),
    ([(32, 32)], (512, "dense1")),
    ([(32, 32), (32, 32)], (512, "dense2")),
    ([(32, 32), (16, 24)], (512, "dense1+varlen")),
    ([(32, 32)] * 3, (768, "dense3")),  # a run of three 256-token tiles: the run budget
]
TOL = 5e-2  # replay vs eager, both bf16: catches garbage and wrong rows, not rounding
TEXT_SHAPES, TEXT_REQUESTS, DECODE_STEPS = [(1, 40), (2, 100)], ([40], [100, 60]), 4


def say(msg: str) -> None:
    print(msg, flush=True)


def replayed(genc, before: dict) -> list[tuple[int, str]]:
    """The (budget, variant) pairs one encode replayed, from the stats' change."""
    s = genc.stats
    budgets = [b for b, n in s.replays.items() if n != before["replays"].get(b, 0)]
    variants = [v for v, n in s.variant_replays.items() if n != before["variants"].get(v, 0)]
    return [(b, v) for b in budgets for v in variants]


def encoder_part(model, rule: str, record, problems: list[str]) -> dict:
    genc = GraphedEncoder(model, budgets=BUDGETS, max_run_items=MAX_RUN_ITEMS, cu_seqlens_rule=rule, record=record)
    say(f"== [{rule}] capture: budgets {genc.config.graph_budgets}, variants {[v.name for v in genc.adapter.variants]}")
    t0 = time.perf_counter()
    genc.capture(warmup_iters=WARMUP)
    captured = {(b, v.name) for b, g in genc.graphs.items() for v in g.graphs}
    say(f"== [{rule}] captured {len(captured)} graphs in {time.perf_counter() - t0:.1f} s")
    if captured != {want for _, want in CASES}:
        problems.append(f"[{rule}] captured {sorted(captured)}, the cases cover {sorted(w for _, w in CASES)}")
    for i, (shapes, want) in enumerate(CASES):
        inputs = random_processor_output(shapes, model, seed=100 + i)
        before = {"replays": dict(genc.stats.replays), "variants": dict(genc.stats.variant_replays)}
        say(f"== [{rule}] replay {want[0]} {want[1]}: patch grids {shapes}")
        outs = genc.encode(inputs)
        got = replayed(genc, before)
        say(f"== [{rule}] eager {want[0]} {want[1]}")
        err = max_rel_error(outs, genc.encoder.encode(inputs))
        if got != [want] or not err <= TOL:
            problems.append(f"[{rule}] {shapes}: replayed {got} (want {want}), rel error vs eager {err:.3g}")
    missing = sorted({v.name for v in genc.adapter.variants} - set(genc.stats.variant_replays))
    if missing:
        problems.append(f"[{rule}] variants never replayed: {missing}")
    say(f"== [{rule}] variant_replays {dict(sorted(genc.stats.variant_replays.items()))}, "
        f"replays per budget {dict(sorted(genc.stats.replays.items()))}")
    return {"graphs": len(captured), "variants": [v.name for v in genc.adapter.variants]}


def text_tokens(eng, lengths: list[int], hidden: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(len(lengths), max(lengths), hidden, generator=gen).to(eng.device, eng.dtype)
    eng.prompt(*emb.shape[:2]).copy_(emb)
    eng.prefill(lengths)
    return torch.cat([eng.sample()[:, None], eng.decode(DECODE_STEPS)], 1)


def text_part(model, record, problems: list[str], fuse: bool = False) -> dict:
    hidden, tag = model.config.text_config.hidden_size, "text fused" if fuse else "text"
    graphed, eager = (TextEngine(model, max_batch=2, max_len=128, fuse=fuse) for _ in range(2))
    say(f"== [{tag}] capture {TEXT_SHAPES}")
    kw = {} if record is capture_graph else {"record": record}
    keys = graphed.capture(TEXT_SHAPES, **kw)["captured"]
    for i, lengths in enumerate(TEXT_REQUESTS):
        say(f"== [{tag}] replay prefill/sample/decode for prompts of {lengths}")
        got = text_tokens(graphed, lengths, hidden, seed=i)
        say(f"== [{tag}] eager for prompts of {lengths}")
        if not torch.equal(got, text_tokens(eager, lengths, hidden, seed=i)):
            problems.append(f"[{tag}] prompts of {lengths}: graphed tokens differ from the eager bodies'")
    s = graphed.stats
    if graphed.stats.eager or sorted(s.replays) != keys:
        problems.append(f"[{tag}] replays {s.replays}, eager {s.eager}, captured {keys}")
    say(f"== [{tag}] replays {dict(sorted(s.replays.items()))}")
    return {"graphs": len(keys)}


def fused_text_part(model, record, problems: list[str]) -> dict:
    """:func:`text_part` for the fused engine. On a CPU its layer functions compile with dynamo's
    ``aot_eager`` backend: the same tracing, without inductor's C++ builds, which take minutes on a
    few cores and have nothing to do with the routing checked there."""
    cpu = next(model.parameters()).device.type == "cpu"
    with mock.patch.dict(engine_module.FUSE_COMPILE, {"backend": "aot_eager"} if cpu else {}):
        return text_part(model, record, problems, fuse=True)


def probe() -> int:
    """initcheck's question about ``embed`` in three cases: a GEMM's output read by an add, each on
    memory fresh from the driver. Hopper GEMMs store their tiles through TMA bulk copies; if initcheck
    does not see those writes, it flags the add's reads of a fresh output (case 1) but not of one a
    memset wrote first (case 2), although the add reads the values the GEMM wrote (checked). Case 2
    runs first: initcheck prints only its first reports (--print-limit)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    # case 4: the shape of the tiny preset's patch embedding in its first capture (the 768-token run
    # budget: 3072 rows of 768 pixel values onto 64 channels), the add initcheck flagged there.
    # Cases 1-4 write through addmm(out=), which first copies the bias into the output (a plain
    # kernel, which initcheck sees); case 5 is nn.Linear's own path, F.linear, whose bias rides in
    # the GEMM's epilogue, so only the GEMM writes the output, as in the encoder's embed.
    for case, dtype, zeroed, rows in (("2", torch.bfloat16, True, 2048), ("1", torch.bfloat16, False, 2048),
                                      ("3", torch.float32, False, 2048), ("4", torch.bfloat16, False, 3072),
                                      ("5", torch.bfloat16, False, 3072)):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # every case on new segments: nothing earlier wrote them
        x, w, b = (torch.randn(*s, device="cuda", dtype=dtype, generator=gen) for s in ((rows, 768), (64, 768), (64,)))
        y = (torch.zeros if zeroed else torch.empty)(rows, 64, device="cuda", dtype=dtype)
        say(f"== [probe {case}] linear of {rows} rows into a {'zeroed' if zeroed else 'fresh'} {str(dtype)[6:]} "
            "output, then an add")
        if case == "5":
            say(f"== [probe {case}] (F.linear: a fresh output only the GEMM writes)")
            y = torch.nn.functional.linear(x, w, b)
        else:
            torch.addmm(b, x, w.t(), out=y)
        z = y + 1.0
        say(f"== [probe {case}] check")
        err = max_rel_error([z.double() - 1.0], [torch.addmm(b.double(), x.double(), w.t().double())])
        say(f"== [probe {case}] done: the add read the GEMM's values (rel error vs float64 {err:.1e})")
        del x, w, b, y, z
        if not err < 2e-2:
            return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="fp32 on the CPU with eager stand-ins (checks the routing)")
    ap.add_argument("--probe", action="store_true", help="only the GEMM-then-add probe for initcheck (CUDA)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.probe:
        return probe() if torch.cuda.is_available() else 2
    if args.cpu:
        device, dtype, record = "cpu", torch.float32, eager_stand_in
    elif torch.cuda.is_available():
        device, dtype, record = "cuda", torch.bfloat16, capture_graph
    else:
        say("sanitize_replay: no CUDA device (run with --cpu to check the routing here)")
        return 2
    model = build_model("tiny", dtype=dtype, device=device, text_layers="full")
    problems: list[str] = []
    enc = {rule: encoder_part(model, rule, record, problems) for rule in RULES}
    text = text_part(model, record, problems)
    fused = fused_text_part(model, record, problems)
    if device == "cuda":
        torch.cuda.synchronize()
    where = f"{device} {str(dtype).removeprefix('torch.')}, {time.perf_counter() - t0:.1f} s"
    if problems:
        say(f"sanitize_replay: FAILED ({len(problems)}): {' | '.join(problems)}; {where}")
        return 1
    graphs = ", ".join(f"{rule}: {e['graphs']} encoder graphs" for rule, e in enc.items())
    say(f"sanitize_replay: ok; {graphs}, every variant replayed ({', '.join(enc[RULES[0]]['variants'])}); "
        f"text engine: {text['graphs']} graphs replayed, fused: {fused['graphs']}; {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
