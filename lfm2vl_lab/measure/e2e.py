"""End to end: transformers' ``generate`` with the eager image path vs the graphed encoder.

The seed's headline is an end-to-end number (vLLM PR #44930: "~10-20% lower e2e latency at low
batch size"). Here the same effect is measured in one process: a random-weight LFM2-VL with the
preset's real text depth, a prompt whose image placeholders match the encoder's output tokens,
and ``generate`` timed to the first token (TTFT) and to 16/64 new tokens.
"""

from __future__ import annotations

import functools
import statistics
import time
from contextlib import contextmanager, nullcontext

import torch

from ..core.graphed_encoder import GraphedEncoder
from ..core.packing import tokens_for
from ..model.hf import hf_image_features
from ..model.inputs import process_images
from .timing import time_paired
from .values import check_choice
from .workloads import TILED_SIZE, synthetic_image

PROMPT_TEXT_TOKENS = 24  # a short instruction around the image, as in a chat turn


def build_prompt(model, inputs: dict, n_requests: int, seed: int = 0) -> dict:
    """``n_requests`` identical requests: text tokens, then one placeholder per image token.

    Each request carries the same image, so the batch's pixel inputs repeat per request.
    """
    cfg = model.config
    f = cfg.downsample_factor
    tokens = sum(tokens_for(s, f) for s in inputs["spatial_shapes"].tolist())
    g = torch.Generator().manual_seed(seed)
    vocab = cfg.text_config.vocab_size
    text = torch.randint(3, min(vocab, 300), (PROMPT_TEXT_TOKENS,), generator=g)
    text[text == cfg.image_token_id] = 5
    ids = torch.cat([text[:8], torch.full((tokens,), cfg.image_token_id), text[8:]])
    dev = model.device

    def rep(t):
        return torch.cat([t] * n_requests)

    return {
        "input_ids": ids.repeat(n_requests, 1).to(dev),
        "attention_mask": torch.ones(n_requests, ids.numel(), dtype=torch.long, device=dev),
        "pixel_values": rep(inputs["pixel_values"]).to(dev, model.dtype),
        "pixel_attention_mask": rep(inputs["pixel_attention_mask"]).to(dev),
        "spatial_shapes": rep(inputs["spatial_shapes"]),
    }


def generate_once(model, batch: dict, new_tokens: int) -> torch.Tensor:
    return model.generate(
        **batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=0, eos_token_id=None,
    )


IMAGES = {"1x512": (512, 512), "tiled": TILED_SIZE}  # name -> (width, height)
# The two image paths compared: "hf-eager" and the graphed encoder's. Where no graph was captured
# (no CUDA), the latter is the packed eager encoder, and its rows say so: mode "lab-eager" (see
# ``lab_mode``) and this note.
NO_GRAPHS_NOTE = "no CUDA graphs captured: the packed eager encoder ran"
# The decode steps never call the image encoder, so their per-token time is a control: when it
# differs between the two modes by more than this, the process was disturbed during one of them
# (a recorded row's ``decode_drift`` shows it), and that row's TTFT difference is not the encoder alone.
DECODE_DRIFT_WARN = 0.05


def lab_mode(genc: GraphedEncoder) -> str:
    """What the graphed encoder really runs: ``lab-graph`` once captured, else ``lab-eager``."""
    return "lab-graph" if genc.captured else "lab-eager"


def decode_ms_per_token(row: dict) -> float | None:
    """Decode time per new token from a row's totals: (longest − shortest) / their token difference.
    None with fewer than two ``total_<n>_ms`` columns."""
    totals = sorted((int(k.split("_")[1]), v) for k, v in row.items() if k.startswith("total_") and k.endswith("_ms"))
    if len(totals) < 2:
        return None
    (lo, t_lo), (hi, t_hi) = totals[0], totals[-1]
    return (t_hi - t_lo) / (hi - lo)


def paired_reduction(base: list[float], new: list[float]) -> float:
    """Median over rounds of ``1 - new_i / base_i``: the saving measured pair by pair."""
    return statistics.median(1 - n / b for b, n in zip(base, new, strict=True))


@contextmanager
def timed_image_features(model, samples: list[float]):
    """Within the block, every call of ``model``'s image-feature function (whichever is installed:
    transformers' own, or a graphed encoder's) is timed; on exit the block's total encoder time in
    ms is appended to ``samples``.

    This is how ``run_e2e`` measures the encoder *inside* the TTFT call it is a share of. On CUDA
    the time is between two events on the current stream, so no host sync is added to the call.
    """
    inner = getattr(model, "model", model)
    prev = inner.__dict__.get("get_image_features")  # an override (GraphedEncoder.installed), if any
    current = inner.get_image_features
    cuda = model.device.type == "cuda"
    spans = []

    # functools.wraps keeps the signature: generate() picks the keyword arguments to pass by it
    @functools.wraps(current)
    def get_image_features(*args, **kwargs):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = current(*args, **kwargs)
            end.record()
            spans.append((start, end))
        else:
            t0 = time.perf_counter()
            out = current(*args, **kwargs)
            spans.append((time.perf_counter() - t0) * 1e3)
        return out

    inner.get_image_features = get_image_features
    try:
        yield
    finally:
        if prev is None:
            del inner.get_image_features
        else:
            inner.get_image_features = prev
    if cuda:
        for _, end in spans:
            end.synchronize()
        spans = [a.elapsed_time(b) for a, b in spans]
    samples.append(sum(spans))


def _paired_calls(model, batch: dict, genc: GraphedEncoder, lab: str, new_tokens: int, enc: dict | None = None):
    """The two generate calls for :func:`time_paired`; with ``enc``, each mode's encoder time inside
    the call is appended to ``enc[mode]``."""
    def call():
        return generate_once(model, batch, new_tokens)

    def hf_ctx():
        return timed_image_features(model, enc["hf-eager"]) if enc is not None else nullcontext()

    @contextmanager
    def lab_ctx():
        with genc.installed(), (timed_image_features(model, enc[lab]) if enc is not None else nullcontext()):
            yield

    return {"hf-eager": (call, hf_ctx), lab: (call, lab_ctx)}


def _pair_rows(model, genc: GraphedEncoder, image: str, n: int, new_tokens: list[int], repeats: int) -> list[dict]:
    """The hf-eager row and the graphed encoder's row of one image and request count."""
    lab, dev = lab_mode(genc), model.device
    batch = build_prompt(model, process_images([synthetic_image(*IMAGES[image], seed=1)], model.lab_preset), n)
    enc: dict[str, list[float]] = {"hf-eager": [], lab: []}
    ttft = time_paired(_paired_calls(model, batch, genc, lab, 1, enc), repeats, 1, dev)
    totals = {t: time_paired(_paired_calls(model, batch, genc, lab, t), repeats, 1, dev) for t in new_tokens}
    pair = []
    for mode in ("hf-eager", lab):
        encoder = enc[mode][-repeats:]  # the warm-up call's sample comes first
        row = {"preset": model.lab_preset.name, "image": image, "requests": n, "mode": mode,
               "items": int(batch["spatial_shapes"].shape[0]), "prompt_len": int(batch["input_ids"].shape[1]),
               "repeats": repeats, "timing": "paired",
               "encoder_ms": statistics.median(encoder), "encoder_samples_ms": encoder,
               "ttft_ms": statistics.median(ttft[mode]), "ttft_samples_ms": ttft[mode]}
        if mode == "lab-eager":
            row["note"] = NO_GRAPHS_NOTE
        for t in new_tokens:
            row[f"total_{t}_ms"] = statistics.median(totals[t][mode])
        if len(new_tokens) >= 2:
            row["decode_ms_per_token"] = decode_ms_per_token(row)
        row["encoder_share_of_ttft"] = row["encoder_ms"] / row["ttft_ms"]
        pair.append(row)
    base, graph = pair
    base["ttft_reduction"] = 0.0
    graph["ttft_reduction"] = 1 - graph["ttft_ms"] / base["ttft_ms"]
    graph["ttft_reduction_paired"] = paired_reduction(ttft["hf-eager"], ttft[lab])
    if "decode_ms_per_token" in graph:
        graph["decode_drift"] = graph["decode_ms_per_token"] / base["decode_ms_per_token"] - 1
    return pair


def run_e2e(model, images=("1x512", "tiled"), requests=(1, 2, 4), new_tokens=(16, 64), repeats: int = 5,
            genc: GraphedEncoder | None = None, progress: bool = True, on_row=None) -> list[dict]:
    """TTFT (generate with one new token) and total latency, eager image path vs graphed encoder.

    The two modes are timed in turns (``timing.time_paired``), one untimed warm-up call each. Rows
    keep every TTFT sample. ``encoder_ms`` is the image-feature call timed *inside* each TTFT call
    (median over the same calls as ``ttft_ms``), so ``encoder_share_of_ttft`` = encoder_ms / ttft_ms
    is a share of the calls it was measured in and never exceeds 1. (An encoder timed in calls of
    its own could: on a CPU, where the encoder is most of TTFT, the noise between two medians of
    different calls can put it above 100%.)

    The graphed encoder's row has mode ``lab-graph``, or ``lab-eager`` with a ``note`` where nothing
    was captured (no CUDA): then the packed eager encoder ran. With two or more ``new_tokens``
    values each row also gets the decode time per token (from the smallest and largest totals),
    and the graphed encoder's row its drift against eager's: the control described at
    ``DECODE_DRIFT_WARN``. ``on_row(row)`` is called as each row completes (the CLI saves partial
    results with it).
    """

    for im in images:
        check_choice("image", im, IMAGES)
    new_tokens = list(dict.fromkeys(new_tokens))
    if repeats < 1 or min(requests, default=0) < 1 or min(new_tokens, default=0) < 1:
        raise ValueError(f"need repeats >= 1 and at least one request and one new token, each >= 1; got "
                         f"repeats={repeats}, requests={list(requests)}, new_tokens={new_tokens}")
    if genc is None:
        genc = GraphedEncoder(model)
        if model.device.type == "cuda":
            genc.capture()
    return grid_rows([(im, n) for im in images for n in requests], "end to end",
                     lambda im, n: _pair_rows(model, genc, im, n, new_tokens, repeats), progress, on_row)


def profile_ttft(model, genc: GraphedEncoder, image: str = "1x512", n_requests: int = 1, iters: int = 3) -> dict:
    """Where a TTFT call's time goes, per mode, from torch.profiler: the whole ``generate`` call
    with one new token, and the image-feature call alone; the text part is the difference.

    It answers the end-to-end question the encoder numbers cannot: when the graphed encoder saves
    ms but TTFT barely moves, is the rest (prefill and the first decode step) GPU work or host
    launch overhead? ``gpu_busy_ms`` well below ``wall_ms`` in the text part means launch-bound.
    The graphed encoder's entry is keyed by ``lab_mode(genc)`` (``lab-eager`` when nothing was captured).
    """
    from .profiling import profile_callable

    inputs = process_images([synthetic_image(*IMAGES[image], seed=1)], model.lab_preset)
    batch = build_prompt(model, inputs, n_requests)
    dev_inputs = {k: batch[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")}
    out = {"image": image, "requests": n_requests, "iters": iters}
    paths = (("hf-eager", nullcontext, lambda: hf_image_features(model, dev_inputs)),
             (lab_mode(genc), genc.installed, lambda: genc.encode(dev_inputs)))
    keep = ("kernels", "launch_calls", "launch_cpu_ms", "graph_launches", "gpu_busy_ms", "wall_ms", "gap_median_us")
    for mode, ctx, encode in paths:
        with ctx():
            ttft = profile_callable(lambda: generate_once(model, batch, 1), warmup=1, iters=iters, device=model.device)
        enc = profile_callable(encode, warmup=1, iters=iters, device=model.device)
        t, e = ttft.as_dict(timeline=False, gaps=False), enc.as_dict(timeline=False, gaps=False)
        text = {k: t[k] - e[k] for k in ("kernels", "launch_calls", "gpu_busy_ms", "wall_ms")}
        text["busy_share"] = text["gpu_busy_ms"] / text["wall_ms"] if text["wall_ms"] > 0 else None
        out[mode] = {"ttft": {k: t[k] for k in keep}, "encoder": {k: e[k] for k in keep}, "text": text}
    return out


@torch.no_grad()
def logits_parity(model, genc: GraphedEncoder, n_requests: int = 1, seed: int = 0) -> dict:
    """Logits and greedy first token with transformers' image path vs the graphed encoder."""
    inputs = process_images([synthetic_image(512, 512, seed=seed)], model.lab_preset)
    batch = build_prompt(model, inputs, n_requests, seed)
    ref = model(**batch).logits.float()
    with genc.installed():
        out = model(**batch).logits.float()
    rel = ((out - ref).norm() / ref.norm()).item()
    same_first = bool((out[:, -1].argmax(-1) == ref[:, -1].argmax(-1)).all())
    return {"rel_err": rel, "same_first_token": same_first, "finite": bool(torch.isfinite(out).all())}


def print_row(row: dict) -> None:
    """One e2e row as a line, with the decode-drift warning where the control fails."""
    paired = f", paired {-100 * row['ttft_reduction_paired']:+.1f}%" if "ttft_reduction_paired" in row else ""
    print(f"{row['preset']:>14} {row['image']:>6} x{row['requests']} {row['mode']:>10}  encoder "
          f"{row['encoder_ms']:7.2f} ms  TTFT {row['ttft_ms']:7.2f} ms "
          f"({-100 * row['ttft_reduction'] + 0:+.1f}% vs hf{paired})"
          f"  encoder share {100 * row['encoder_share_of_ttft']:.0f}%"
          + "".join(f"  {k} {v:.1f}" for k, v in row.items() if k.startswith("total_")), flush=True)
    drift = row.get("decode_drift")
    if drift is not None and abs(drift) > DECODE_DRIFT_WARN:
        print(f"  warning: decode (which never runs the encoder) differs by {100 * drift:+.0f}% between the modes; "
              "this row's TTFT difference is not the encoder alone", flush=True)


def parity_line(p: dict) -> str:
    """A :func:`logits_parity` record (with its preset) as one line."""
    return (f"parity {p['preset']}: logits rel err {p['rel_err']:.1e} vs transformers' image path, "
            f"same first token {p['same_first_token']}, finite {p['finite']}")


def print_profile(name: str, prof: dict, modes) -> None:
    """The lines of one :func:`profile_ttft` result."""
    for mode in modes:
        t, e, x = prof[mode]["ttft"], prof[mode]["encoder"], prof[mode]["text"]
        share = "-" if x["busy_share"] is None else f"{100 * x['busy_share']:.0f}%"
        print(f"profile {name} {mode:>10}: TTFT wall {t['wall_ms']:.2f} ms, busy {t['gpu_busy_ms']:.2f} ms, "
              f"{t['kernels']:.0f} kernels | encoder wall {e['wall_ms']:.2f} ms | text wall {x['wall_ms']:.2f} ms, "
              f"busy {x['gpu_busy_ms']:.2f} ms ({share}), {x['kernels']:.0f} kernels", flush=True)


def grid_rows(cases: list, desc: str, rows_for, progress: bool, on_row=None) -> list[dict]:
    """``rows_for(*case)`` for every case, under a progress bar; ``on_row(row)`` as each row lands."""
    from tqdm.auto import tqdm

    rows = []
    for case in tqdm(cases, desc=desc, disable=not progress):
        for row in rows_for(*case):
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
