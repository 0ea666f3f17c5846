"""One preset through vLLM, in one GPU process: three engines on the kit's seeded weights and images.

In order, so that each part has the GPU to itself:

1. **The weights**: the preset's seeded random model (bf16, full text depth) and its model folder,
   written here on the GPU machine (:func:`.ab_inputs.prepare`): config with the fields vLLM reads,
   safetensors in the checkpoint layout, the processor and chat template.
2. **The references**: transformers' ``generate`` in bf16 and a float32 copy of the same weights
   (the judge), on the parity prompts (one 512 px image, one tiled image); then the model is freed.
3. **vLLM**: one engine per arm (:mod:`.vllm_ab`), each with :data:`MEMORY_FRACTION` of the GPU; the
   parity prompts through each, warm-up, then the rounds; last, each graphed engine's encoder capture
   measured once more.

The kit's own pipeline on the same cases, weights and images is role ``pipeline``
(:mod:`.pipeline_ab`), recorded in a process of its own.
"""

from __future__ import annotations

import statistics
import time

import torch

from .ab_inputs import Images, judge, prepare, ref_summary, references
from .vllm_ab import (
    ARMS,
    CASES,
    GRAPHED_ARMS,
    PARITY_IMAGES,
    PARITY_TOKENS,
    TOKENS,
    TOP_LOGITS,
    breakdown,
    case_rows,
    compilation_config,
    round_orders,
    vllm_cases,
)

MEMORY_FRACTION = 0.25  # of the GPU per engine: three engines side by side
MAX_MODEL_LEN = 4096  # the longest request here is one tiled image (~1,500 positions) and 128 tokens


# --------------------------------------------------------------------------------------------
# vLLM's side
# --------------------------------------------------------------------------------------------


def vllm_parity(llm, text: str, refs: list[dict], images=PARITY_IMAGES) -> dict:
    """vLLM on the parity prompts (those of ``images``): the prompt ids it built (against the kit's),
    its greedy tokens and the raw logits of its 20 most likely first tokens, judged by :func:`judge`."""
    from .vllm_engine import run_batch

    out = {}
    for r in (r for r in refs if r["image"] in images):
        got = run_batch(llm, text, [r["pil"]], PARITY_TOKENS, logprobs=TOP_LOGITS)["requests"][0]
        out[r["image"]] = {**judge(got["tokens"], got["first_logits"], r),
                           "same_prompt_ids": got["prompt_token_ids"] == r["ids"], "prompt_len": got["prompt_len"]}
    return out


def vllm_rounds(llms: dict, text: str, images: Images, rounds: int, cases=CASES) -> dict:
    """Warm-up (one request per arm and case), then ``rounds`` rounds: every case and token count
    once per arm, the arms rotated per round. Returns, per (case, tokens, arm), each round's result."""
    from .vllm_engine import run_batch

    for llm in llms.values():
        for image, n in cases:
            run_batch(llm, text, images(image, n), 2)
    got: dict = {}
    for order in round_orders(list(llms), rounds):
        for image, n in cases:
            for tokens in TOKENS:
                for arm in order:
                    res = run_batch(llms[arm], text, images(image, n), tokens)
                    for r in res["requests"]:
                        r.pop("tokens"), r.pop("prompt_token_ids")
                    got.setdefault((image, n, tokens, arm), []).append(res)
    return got


def vllm_rows(preset: str, got: dict, cases=CASES) -> tuple[list[dict], dict]:
    """Rows per case (medians, spread, paired cuts with their interval, decode per token) and, per
    arm, where the TTFT of one request of one image went (:func:`breakdown`)."""
    rows, parts = [], {}
    for image, n in cases:
        for tokens in TOKENS:
            samples = {}
            for arm in ARMS:
                runs = got.get((image, n, tokens, arm), [])
                if runs:
                    samples[arm] = {"e2e_ms": [r["wall_ms"] for r in runs],
                                    "ttft_ms": [statistics.median(q["ttft_ms"] for q in r["requests"]) for r in runs]}
            for row in case_rows(preset, image, n, tokens, samples):
                runs = got[(image, n, tokens, row["arm"])]
                row.update(engine="vllm", decode_ms_per_token=(row["e2e_ms"] - row["ttft_ms"]) / max(tokens - 1, 1),
                           graph_stats=runs[-1]["graph_stats"])
                rows.append(row)
                if n == 1 and tokens == TOKENS[0]:
                    parts[f"{row['arm']}/{image}"] = breakdown([q for r in runs for q in r["requests"]],
                                                               [c for r in runs for c in r["encoder"]])
    return rows, parts


# --------------------------------------------------------------------------------------------
# The whole preset
# --------------------------------------------------------------------------------------------


def measure_preset(preset: str, rounds: int, folder_root, seed: int = 0, say=print) -> dict:
    """Everything of one preset (see the module), as one section of the ``vllm`` result."""
    import gc

    from .vllm_engine import encoder_capture, start_engine

    clock = {"start": time.perf_counter()}

    def lap(what):
        clock[what] = round(time.perf_counter() - clock.pop("start"), 1)
        clock["start"] = time.perf_counter()
        say(f"{preset}: {what} in {clock[what]} s")

    model, folder, proc, text, images = prepare(preset, folder_root, seed)
    sec = {"preset": preset, "folder": folder.name, "prompt_text": text, "engines": {}, "rounds": rounds}
    lap("weights and model folder")
    refs = references(model, proc, text, images)
    sec["references"] = [ref_summary(r) for r in refs]
    lap("references")
    for r in refs:
        r["hf_logits"], r["fp32_logits"] = r["hf_logits"].cpu(), r["fp32_logits"].cpu()
        r.pop("inputs")
    del model
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    llms = {}
    for arm in ARMS:
        cfg = compilation_config(arm, preset)
        llms[arm], start_s, worker = start_engine(folder, cfg, MEMORY_FRACTION, MAX_MODEL_LEN)
        sec["engines"][arm] = {"start_s": round(start_s, 1), "compilation_config": cfg, "worker": worker}
        lap(f"engine {arm}")
    cases, sec["skipped"] = vllm_cases(preset)
    sec["parity"] = {arm: vllm_parity(llm, text, refs, [im for im in PARITY_IMAGES if im not in sec["skipped"]])
                     for arm, llm in llms.items()}
    lap("vLLM parity")
    sec["rows"], sec["breakdown"] = vllm_rows(preset, vllm_rounds(llms, text, images, rounds, cases), cases)
    lap(f"{rounds} rounds")
    for arm in GRAPHED_ARMS:  # last: a capture that went wrong could leave an engine unusable
        sec["engines"][arm]["encoder_capture"] = encoder_capture(llms[arm])
    lap("encoder captures")
    clock.pop("start")
    sec["seconds"] = clock
    return sec
