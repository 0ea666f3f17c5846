"""The kit's pipeline on vLLM's A/B: the same cases, arms, prompt, weights and judge, in the kit's place.

Role ``pipeline`` (``python -m lfm2vl_lab pipeline``), beside role ``vllm``, which serves the same
requests inside vLLM (:mod:`.vllm_preset`). Per preset, from :func:`.ab_inputs.prepare` (the seeded
weights, their model folder's processor and prompt, the same images):

1. **The references**: transformers' ``generate`` in bf16 and a float32 copy of the same weights (the
   judge), on the parity prompts (one 512 px image, one tiled image).
2. **The kit's three arms**, text model graphed (the fused engine) in each: encoder eager (``off``),
   graphed with the PR's config (``pr``) and with the kit's (``kit``).
3. **Parity**: each arm's tokens and first-token logits on the parity prompts, judged as vLLM's are.
4. **The cases**, timed in turns (:func:`~.timing.time_paired`), the arms' order rotating per round.

The two roles are recorded apart, so that a change to the kit's serving code re-records this role
alone; a table that sets one beside the other names both files.
"""

from __future__ import annotations

import time

import torch

from ..core.config import GraphOptions
from ..core.graphed_encoder import GraphedEncoder
from ..serving.cache import bucket_len
from ..serving.engine import TextEngine
from ..serving.pipeline import VlmPipeline
from .ab_inputs import Images, judge, kit_batch, prepare, ref_summary, references
from .timing import time_paired
from .ttft import PhaseClock, median_phases, request_call
from .vllm_ab import CASES, PARITY_TOKENS, TOKENS, TOP_LOGITS, case_rows


def kit_pipes(model, cases_len: list[tuple[int, int]], max_tokens: int) -> tuple[dict, dict]:
    """The kit's three arms, text model graphed (the fused engine) in each: encoder eager (``off``),
    graphed with the PR's config (``pr``) and with the kit's (``kit``). Returns the pipelines and
    what their capture cost."""
    longest = max(length for _, length in cases_len)
    engine = TextEngine(model, max_batch=max(n for n, _ in cases_len), fuse=True,
                        max_len=bucket_len(longest) + max_tokens + 1)
    setup = {"engine_capture": engine.capture(cases_len)}
    gencs = {"pr": GraphedEncoder(model, GraphOptions.named("pr")), "kit": GraphedEncoder(model)}
    for arm, g in gencs.items():
        t0 = time.perf_counter()
        g.capture()
        setup[f"{arm}_capture_s"] = time.perf_counter() - t0
    pipes = {"off": VlmPipeline(model, "eager", "graphed", engine=engine)}
    pipes.update({arm: VlmPipeline(model, "graphed", "graphed", genc=g, engine=engine) for arm, g in gencs.items()})
    return pipes, setup


def kit_parity(pipes: dict, refs: list[dict]) -> dict:
    """The kit's pipeline on the parity prompts: tokens and first-token logits, as vLLM's are judged."""
    out = {}
    for arm, pipe in pipes.items():
        for r in refs:
            ids = torch.tensor([r["ids"]])
            toks = pipe.run(ids, r["inputs"], PARITY_TOKENS)[0].tolist()
            pipe.run(ids, r["inputs"], 1)
            logits = pipe.text.logits[0].float()
            top = logits.topk(TOP_LOGITS).indices
            out[f"{arm}/{r['image']}"] = judge(toks, {int(i): float(logits[i]) for i in top}, r)
    return out


def kit_rounds(model, proc, pipes: dict, text: str, images: Images, repeats: int, preset: str) -> list[dict]:
    """The kit's pipeline on the A/B's cases: one call per request batch from the processor to the
    last token, timed in turns; TTFT is the same call up to its first token (processor included, as
    in vLLM's TTFT)."""
    rows, dev = [], model.device
    for image, n in CASES:
        imgs = images(image) * n
        ids, _, _ = kit_batch(proc, model, text, imgs)
        for tokens in TOKENS:
            clock, logs = PhaseClock(dev), {arm: [] for arm in pipes}
            calls = {arm: request_call(p, imgs, ids, tokens, clock, logs[arm]) for arm, p in pipes.items()}
            totals = time_paired(calls, repeats, 1, dev)
            samples = {arm: {"e2e_ms": totals[arm],  # the first token: the call less its decode phase
                             "ttft_ms": [t - ph.get("decode", 0.0)
                                         for t, (ph, _) in zip(totals[arm], logs[arm][-repeats:])]}
                       for arm in pipes}
            rows += [dict(r, engine="kit", phases_ms=median_phases(logs[r["arm"]], repeats))
                     for r in case_rows(preset, image, n, tokens, samples)]
    return rows


def measure_preset(preset: str, repeats: int, folder_root, seed: int = 0, say=print, **where) -> dict:
    """One preset's section of the ``pipeline`` result (see the module), its rows under ``rows``;
    ``where``: :func:`.ab_inputs.prepare`'s device and dtype, for the CPU's tests."""
    t0 = time.perf_counter()
    model, folder, proc, text, images = prepare(preset, folder_root, seed, **where)
    refs = references(model, proc, text, images)
    # each case's prompt length, from one request of it: the engine's graphs are captured for these
    length = {im: kit_batch(proc, model, text, images(im))[0].shape[1] for im in dict.fromkeys(im for im, _ in CASES)}
    pipes, setup = kit_pipes(model, [(n, length[im]) for im, n in CASES], max(TOKENS))
    t1 = time.perf_counter()
    say(f"{preset}: weights, references and captures in {t1 - t0:.1f} s")
    sec = {"preset": preset, "folder": folder.name, "prompt_text": text, "repeats": repeats, "setup": setup,
           "references": [ref_summary(r) for r in refs], "parity": kit_parity(pipes, refs),
           "rows": kit_rounds(model, proc, pipes, text, images, repeats, preset)}
    sec["seconds"] = {"set-up": round(t1 - t0, 1), "parity and rounds": round(time.perf_counter() - t1, 1)}
    say(f"{preset}: parity and {repeats} rounds in {sec['seconds']['parity and rounds']} s")
    return sec
