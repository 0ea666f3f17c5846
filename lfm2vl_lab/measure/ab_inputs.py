"""What both sides of the A/B share: the model folder, the prompt, new images, the references, the judge.

vLLM's side (:mod:`.vllm_preset`, role ``vllm``) and the kit's pipeline (:mod:`.pipeline_ab`, role
``pipeline``) each run a preset in a process of their own, from the same seeded weights and the same
images: the preset's weights written as a model folder (whose processor both use), the chat prompt every
request sends, images from the same seeds, and the float32 references their parity is judged against.
Nothing here imports the kit's serving code or vLLM, so a change to the kit's pipeline leaves vLLM's
measurement recorded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..model.folder import write_model_folder
from ..model.inputs import process_images
from ..model.parity import float32_reference, lowp_parity
from ..model.presets import build_model
from .e2e import IMAGES, generate_once
from .vllm_ab import PARITY_IMAGES, PARITY_TOKENS, PROMPT_TEXT
from .workloads import synthetic_image

IMAGE_SEED = 1000  # added to the weights' seed: the first image's seed, counted up per image


class Images:
    """A new image for every request (vLLM caches processed images and encoder outputs by content):
    the A/B's sizes with seeds counted up from ``seed``. Both sides draw the parity images first, so
    those two are the same images on both."""

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


def prepare(preset: str, folder_root, seed: int = 0, device: str = "cuda", dtype=torch.bfloat16) -> tuple:
    """One preset's side of the A/B, made ready: its seeded model (bf16, full text depth, on the GPU),
    the model folder written from it (the processor, chat template and weights vLLM loads), that
    folder's processor, the prompt text and the image source. Returns ``(model, folder, proc, text,
    images)``. ``device`` and ``dtype`` are for the CPU's tests: the A/B runs on the defaults."""
    from transformers import Lfm2VlProcessor

    model = build_model(preset, dtype=dtype, device=device, seed=seed, text_layers="full")
    shutil.rmtree(Path(folder_root) / preset, ignore_errors=True)  # a scratch folder a stopped run may have left
    folder = write_model_folder(model, Path(folder_root) / preset)
    proc = Lfm2VlProcessor.from_pretrained(folder, local_files_only=True)
    return model, folder, proc, chat_text(proc), Images(seed + IMAGE_SEED)


def kit_batch(proc, model, text: str, images: list) -> tuple[torch.Tensor, dict, dict]:
    """The same prompt as vLLM sees it, for the kit: the processor's ids (host), the kit's pixel
    inputs, and transformers' own batch for ``generate``."""
    hf = proc(text=[text] * len(images), images=[[im] for im in images], return_tensors="pt")
    batch = {k: (v.to(model.device, model.dtype) if k == "pixel_values" else v.to(model.device)) for k, v in hf.items()}
    return hf["input_ids"], process_images(images, model), batch


@torch.no_grad()
def references(model, proc, text: str, images: Images) -> list[dict]:
    """Per parity image: the prompt ids, transformers' bf16 greedy tokens and first-token logits, and
    the float32 copy's (the judge). Logits stay on the GPU until a side's are compared with them."""
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


def ref_summary(r: dict) -> dict:
    """What a result file keeps of one reference: the prompt's length, both greedy paths, float32's lead."""
    top2 = r["fp32_logits"].topk(2).values
    return {"image": r["image"], "prompt_len": len(r["ids"]), "hf_tokens": r["hf_tokens"],
            "fp32_tokens": r["fp32_tokens"], "fp32_top2_margin": float(top2[0] - top2[1])}


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
