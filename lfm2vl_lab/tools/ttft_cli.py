"""``python -m lfm2vl_lab ttft``: the four modes' TTFT grid (``tools/ttft.py``), saved with provenance.

Per preset: build the full-depth random-weight model, capture the encoder's graphs and the text
engine's, check parity (every mode against ``generate`` and a float32 copy), optionally profile one
request per mode, time the grid, and measure the image path (``tools/image_path.py``). The result
file is rewritten after every row, so a run cut short keeps what it measured; an error is recorded
with its traceback and the run goes on to the next preset.
"""

from __future__ import annotations

import traceback

import torch

from .e2e import IMAGES, start_run
from .ttft import (
    DECODE_TOKENS,
    PARITY_CASES,
    build_pipelines,
    capture_engine,
    judge_ttft,
    print_row,
    profile_modes,
    prompt_len,
    run_ttft,
    ttft_parity,
)


def add_ttft_args(p) -> None:
    from .args import choice_arg, dtype_arg, list_arg, positive_int, preset_arg

    p.add_argument("--preset", action="append", type=preset_arg, default=None,
                   help="preset(s) (repeatable; default: lfm2-vl-450m on CUDA, tiny on CPU)")
    p.add_argument("--image", type=list_arg(choice_arg("image", tuple(IMAGES))), default="1x512,tiled",
                   help="images, comma list of: " + ", ".join(IMAGES))
    p.add_argument("--requests", type=list_arg(positive_int), default="1,2,4,8", help="requests per call, comma list")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--decode-tokens", type=positive_int, default=DECODE_TOKENS,
                   help="tokens after the first in the decode calls (decode ms per token)")
    p.add_argument("--dtype", type=dtype_arg, default=None,
                   help="bf16 | fp16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--out", default=None, help="results root (default: data/results)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--profile", action="store_true", help="also profile one 1x512 request per mode (GPU-busy vs wall)")
    p.add_argument("--image-path", action="store_true",
                   help="also time encode() from the CPU processor output vs GPU-resident input, and the "
                        "processor on the CPU vs on the GPU")


def _one_preset(name: str, args, dt, dev, result: dict, save) -> None:
    from ..core.engine import TextEngine, bucket_len
    from ..core.graphs import GraphedEncoder
    from ..core.presets import build_model
    from .meter import measured_capture

    progress = not args.no_progress
    model = build_model(name, dtype=dt, device=dev, text_layers="full")
    genc = GraphedEncoder(model)
    longest = max(prompt_len(model, im) for im in {*args.image, *(im for im, _ in PARITY_CASES)})
    engine = TextEngine(model, max_batch=max(*args.requests, 2), max_len=bucket_len(longest) + args.decode_tokens + 1)
    setup = {"preset": name}
    result["setup"].append(setup)
    if dev.type == "cuda":
        setup["encoder_capture"] = measured_capture(genc, progress=progress)
        setup["engine_capture"] = capture_engine(engine, model, args.image, args.requests, progress)
    pipes = build_pipelines(model, genc, engine)
    for case in ttft_parity(model, pipes):
        result["parity"].append({"preset": name, **case})
        print(f"parity {case['image']} x{case['requests']}:", case["modes"], flush=True)
    save()
    if args.profile:
        result["profile"].append({"preset": name, **profile_modes(model, pipes)})
        save()
    if args.image_path:
        from .image_path import image_path_rows

        result["image_path"] += [dict(r, preset=name) for r in image_path_rows(model, genc)]
        save()

    def on_row(row):
        result["rows"].append(row)
        print_row(row)
        save()

    run_ttft(model, genc, engine, images=args.image, requests=args.requests, repeats=args.repeats,
             decode_tokens=args.decode_tokens, progress=progress, on_row=on_row)
    setup["engine_stats"] = {"replays": engine.stats.replays, "eager": engine.stats.eager}


def run_ttft_cli(args) -> int:
    """TTFT like an engine: text eager/graphed x encoder eager/graphed, phases, decode, parity."""
    from .results import RESULTS_ROOT, save_result

    dev, dt, presets, result = start_run("ttft", args, setup=[], parity=[], profile=[], image_path=[], rows=[],
                                         errors=[])
    saved: dict = {}

    def save():
        result["targets"] = judge_ttft(result["rows"], result["image_path"], result["parity"])
        saved["path"] = save_result(result, args.out or RESULTS_ROOT, "ttft", saved.get("path"))

    status = 0
    for name in presets:
        try:
            _one_preset(name, args, dt, dev, result, save)
        except Exception as exc:  # recorded with its traceback, then the next preset
            status = 1
            result["errors"].append({"preset": name, "error": repr(exc), "traceback": traceback.format_exc()})
            print(traceback.format_exc(), flush=True)
        save()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for t in result["targets"]:
        print(f"target {t['target']}: {t['value']} (limit {t['limit']}) {'ok' if t['ok'] else 'MISSED'}", flush=True)
    print("results:", saved.get("path"))
    return status
