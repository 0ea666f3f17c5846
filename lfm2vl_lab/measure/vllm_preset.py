"""One preset through vLLM and through the kit, in one GPU process, on the same weights and images.

In order, so that each part has the GPU to itself:

1. **The weights**: the preset's seeded random model (bf16, full text depth) and its model folder,
   written here on the GPU machine (:func:`lfm2vl_lab.model.folder.write_model_folder`): config with
   the fields vLLM reads, safetensors in the checkpoint layout, the processor and chat template.
2. **The references**: transformers' ``generate`` in bf16, a float32 copy of the same weights
   (the judge), and the kit's :class:`~lfm2vl_lab.serving.pipeline.VlmPipeline`, on the parity
   prompts (one 512 px image, one tiled image).
3. **The kit beside vLLM**: the kit's pipeline, text model graphed (the fused engine), encoder eager
   and graphed with both graph configs, on the A/B's cases, timed in turns.
4. **vLLM**: one engine per arm (:mod:`.vllm_ab`); the parity prompts through each, warm-up, then
   the rounds; last, each graphed engine's encoder capture measured once more.

The kit's side runs first, with the GPU and the host to itself; its model is freed before the engines
start (each takes :data:`MEMORY_FRACTION` of the GPU).
"""

from __future__ import annotations

import statistics
import time

import torch

from ..core.config import GraphOptions
from ..core.graphed_encoder import GraphedEncoder
from ..model.folder import write_model_folder
from ..model.inputs import process_images
from ..model.parity import float32_reference, lowp_parity
from ..model.presets import build_model
from ..serving.cache import bucket_len
from ..serving.engine import TextEngine
from ..serving.pipeline import VlmPipeline
from .e2e import IMAGES, generate_once
from .timing import time_paired
from .ttft import PhaseClock, median_phases, request_call
from .vllm_ab import (
    ARMS,
    CASES,
    GRAPHED_ARMS,
    PARITY_IMAGES,
    PARITY_TOKENS,
    PROMPT_TEXT,
    TOKENS,
    TOP_LOGITS,
    breakdown,
    case_rows,
    compilation_config,
    round_orders,
    vllm_cases,
)
from .workloads import synthetic_image

MEMORY_FRACTION = 0.25  # of the GPU per engine: three engines side by side
MAX_MODEL_LEN = 4096  # the longest request here is one tiled image (~1,500 positions) and 128 tokens


class Images:
    """A new image for every request (vLLM caches processed images and encoder outputs by content):
    the A/B's sizes with seeds counted up from ``seed``."""

    def __init__(self, seed: int):
        self.next = seed

    def __call__(self, image: str, n: int = 1) -> list:
        out = [synthetic_image(*IMAGES[image], seed=self.next + i) for i in range(n)]
        self.next += n
        return out


def chat_text(proc) -> str:
    """The prompt every request sends: one user turn with an image and :data:`PROMPT_TEXT`."""
    msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT_TEXT}]}]
    return proc.apply_chat_template(msg, add_generation_prompt=True, tokenize=False)


def kit_batch(proc, model, text: str, images: list) -> tuple[torch.Tensor, dict, dict]:
    """The same prompt as vLLM sees it, for the kit: the processor's ids (host), the kit's pixel
    inputs, and transformers' own batch for ``generate``."""
    hf = proc(text=[text] * len(images), images=[[im] for im in images], return_tensors="pt")
    batch = {k: (v.to(model.device, model.dtype) if k == "pixel_values" else v.to(model.device)) for k, v in hf.items()}
    return hf["input_ids"], process_images(images, model), batch


# --------------------------------------------------------------------------------------------
# The kit's side
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def references(model, proc, text: str, images: Images) -> list[dict]:
    """Per parity image: the prompt ids, transformers' bf16 greedy tokens and first-token logits, and
    the float32 copy's (the judge). Logits stay on the GPU until vLLM's are compared with them."""
    ref32 = float32_reference(model)
    out = []
    for image in PARITY_IMAGES:
        imgs = images(image)
        ids, inputs, batch = kit_batch(proc, model, text, imgs)
        n = ids.shape[1]
        out.append({"image": image, "pil": imgs[0], "ids": ids[0].tolist(), "inputs": inputs,
                    "hf_tokens": generate_once(model, batch, PARITY_TOKENS)[0, n:].tolist(),
                    "fp32_tokens": generate_once(ref32, {**batch, "pixel_values": batch["pixel_values"].float()},
                                                 PARITY_TOKENS)[0, n:].tolist(),
                    "hf_logits": model(**batch).logits[0, -1].float(),
                    "fp32_logits": ref32(**{**batch, "pixel_values": batch["pixel_values"].float()}).logits[0, -1]})
    del ref32
    torch.cuda.empty_cache()
    return out


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


# --------------------------------------------------------------------------------------------
# vLLM's side
# --------------------------------------------------------------------------------------------


def judge(tokens: list[int], top_logits: dict[int, float], ref: dict) -> dict:
    """One path's parity against the float32 copy, the kit's rule (:func:`lowp_parity`): its logits
    over its top tokens within 1e-2 of float32's, or no worse than transformers' bf16 over the same
    tokens; and how many of its greedy tokens follow float32's path and transformers' bf16 path."""
    ids = torch.tensor(list(top_logits))
    mine = torch.tensor(list(top_logits.values()), dtype=torch.float64)
    p = lowp_parity([mine], [ref["hf_logits"][ids].cpu()], [ref["fp32_logits"][ids].cpu()])
    top2 = ref["fp32_logits"].topk(2).values

    def lead(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    return {"rel_err_vs_fp32": p["rel_err"], "hf_rel_err_vs_fp32": p["hf_rel_err"], "logits_ok": p["pass"],
            "tokens": tokens, "distinct_tokens": len(set(tokens)),  # 1: a repeated token, a weak comparison
            "as_fp32": lead(tokens, ref["fp32_tokens"]), "as_hf": lead(tokens, ref["hf_tokens"]),
            "first_as_fp32": tokens[0] == ref["fp32_tokens"][0], "fp32_top2_margin": float(top2[0] - top2[1])}


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


def _kit_side(model, proc, text: str, images: Images, refs: list[dict], repeats: int, preset: str) -> dict:
    """Steps 2 and 3 of the module: the kit's pipeline judged on the parity prompts and timed on the cases."""
    sample = {image: kit_batch(proc, model, text, images(image))[0].shape[1] for image in {im for im, _ in CASES}}
    pipes, setup = kit_pipes(model, [(n, sample[image]) for image, n in CASES], max(TOKENS))
    out = {"setup": setup, "parity": kit_parity(pipes, refs),
           "rows": kit_rounds(model, proc, pipes, text, images, repeats, preset)}
    del pipes
    return out


def _ref_summary(r: dict) -> dict:
    top2 = r["fp32_logits"].topk(2).values
    return {"image": r["image"], "prompt_len": len(r["ids"]), "hf_tokens": r["hf_tokens"],
            "fp32_tokens": r["fp32_tokens"], "fp32_top2_margin": float(top2[0] - top2[1])}


def measure_preset(preset: str, rounds: int, kit_repeats: int, folder_root, seed: int = 0, say=print) -> dict:
    """Everything of one preset (see the module), as one section of the ``vllm`` result. The kit's side
    runs before any engine starts: in the first recording the engines waited beside the kit's timed
    rounds, and those rounds came out disturbed (one arm's processor phase seven times the others')."""
    import gc
    import shutil
    from pathlib import Path

    from transformers import Lfm2VlProcessor

    from .vllm_engine import encoder_capture, start_engine

    clock = {"start": time.perf_counter()}

    def lap(what):
        clock[what] = round(time.perf_counter() - clock.pop("start"), 1)
        clock["start"] = time.perf_counter()
        say(f"{preset}: {what} in {clock[what]} s")

    model = build_model(preset, dtype=torch.bfloat16, device="cuda", seed=seed, text_layers="full")
    shutil.rmtree(Path(folder_root) / preset, ignore_errors=True)  # a scratch folder a stopped run may have left
    folder = write_model_folder(model, Path(folder_root) / preset)
    proc = Lfm2VlProcessor.from_pretrained(folder, local_files_only=True)
    text, images = chat_text(proc), Images(seed + 1000)
    sec = {"preset": preset, "folder": folder.name, "prompt_text": text, "engines": {}, "rounds": rounds,
           "kit_repeats": kit_repeats}
    lap("weights and model folder")
    refs = references(model, proc, text, images)
    sec["references"] = [_ref_summary(r) for r in refs]
    lap("references")
    if kit_repeats:
        sec["kit"] = _kit_side(model, proc, text, images, refs, kit_repeats, preset)
        lap("the kit's pipeline")
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
