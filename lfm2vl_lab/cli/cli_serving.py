"""The whole-request commands of ``python -m lfm2vl_lab`` (:mod:`.cli` holds the parser and the
encoder's commands): their options beside their run.

* ``e2e``: transformers' ``generate`` with its eager image path vs the graphed encoder
  (:mod:`.e2e`), TTFT and total latency, with a logits parity record per preset.
* ``ttft``: the four modes' TTFT grid (:mod:`.ttft`), text model eager/graphed × encoder
  eager/graphed. Per preset: build the full-depth random-weight model, capture the encoder's graphs
  and the text engine's, check parity (every mode against ``generate`` and a float32 copy),
  optionally profile one request per mode, time the grid, and measure the image path
  (:mod:`.image_path`).

Each result file is rewritten after every row, so a run cut short keeps what it measured; a ``ttft``
error is recorded with its traceback and the run goes on to the next preset.
"""

from __future__ import annotations

import sys
import traceback

import torch

from ..core.config import GraphOptions
from ..core.graphed_encoder import GraphedEncoder
from ..measure.e2e import NO_GRAPHS_NOTE, lab_mode, logits_parity, parity_line, print_profile, profile_ttft, run_e2e
from ..measure.e2e import print_row as print_e2e_row
from ..measure.meter import measured_capture
from ..measure.request import (
    NEW_TOKENS,
    STAND_IN,
    THROUGHPUT_BATCH,
    e2e_line,
    judge_requests,
    print_throughput,
    run_requests,
    throughput_run,
)
from ..measure.results import RESULTS_ROOT, ResultFile, provenance
from ..measure.results import target_line as results_target_line
from ..measure.ttft import (
    PARITY_CASES,
    build_pipelines,
    capture_engine,
    judge_ttft,
    print_row,
    profile_modes,
    prompt_len,
    run_ttft,
    shown_mode,
    ttft_parity,
)
from ..measure.values import dtype_name, parse_dtype
from ..measure.workloads import default_device, device_defaults
from ..model.presets import build_model
from ..serving.cache import bucket_len
from ..serving.engine import TextEngine


def start_run(name: str, args, **sections) -> tuple:
    """What both end-to-end CLIs (``e2e``, ``ttft``) start from: the device, the dtype (``--dtype`` or
    the device's default), the presets (``--preset`` or the device's default) and the result dict
    with its provenance (full-depth random-weight text model) and empty ``sections``."""
    dev = default_device()
    default_preset, default_dtype = device_defaults(dev)
    dt = parse_dtype(args.dtype) if args.dtype else default_dtype
    presets = args.preset or [default_preset]
    command = "python -m lfm2vl_lab " + " ".join(sys.argv[1:])
    prov = provenance(command, dtype=dtype_name(dt), preset=",".join(presets), text="full depth, random weights")
    return dev, dt, presets, {"name": name, "provenance": prov, **sections}


# --------------------------------------------------------------------------------------------
# e2e
# --------------------------------------------------------------------------------------------


def run_e2e_cli(args) -> int:
    """End to end: generate() TTFT and latency, transformers' image path vs the graphed encoder."""
    dev, dt, presets, result = start_run("e2e", args, rows=[], parity=[])
    file = ResultFile(args.out or RESULTS_ROOT, "e2e")

    def on_row(row):  # save after every row: a run cut short still leaves what it measured
        result["rows"].append(row)
        print_e2e_row(row)
        file.save(result)

    for name in presets:
        model = build_model(name, dtype=dt, device=dev, text_layers="full")
        genc = GraphedEncoder(model)
        if dev.type == "cuda":
            measured_capture(genc, progress=not args.no_progress)
        else:
            print(f"note: {lab_mode(genc)} rows: {NO_GRAPHS_NOTE} (no CUDA)", flush=True)
        result["parity"].append({"preset": name, **logits_parity(model, genc)})
        print(parity_line(result["parity"][-1]), flush=True)
        if args.profile:
            prof = {"preset": name, **profile_ttft(model, genc)}
            result.setdefault("ttft_profile", []).append(prof)
            print_profile(name, prof, ("hf-eager", lab_mode(genc)))
        run_e2e(model, images=args.image, requests=args.requests, new_tokens=args.new_tokens, repeats=args.repeats,
                genc=genc, progress=not args.no_progress, on_row=on_row)
        del model, genc
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for p in result["parity"]:
        print(parity_line(p))
    print("results:", file.path, "(every sample and the parity records)")
    return 0


# --------------------------------------------------------------------------------------------
# ttft
# --------------------------------------------------------------------------------------------

# What ttft prints where no graph can be captured (the rows and the result file say it too).
TTFT_NO_GRAPHS_NOTE = (
    "note: no CUDA, so no CUDA graphs: every mode runs eagerly, and the lines below name each by what\n"
    "      ran (lab-eager: the kit's packed encoder or text engine, without graphs; the result file\n"
    "      keeps the modes' names, with a note on each row)")
JUDGED_ON = "lfm2-vl-450m, 1x512, one request"  # judge_ttft's rows


def _one_preset(name: str, args, dt, dev, result: dict, save) -> None:
    progress = not args.no_progress
    model = build_model(name, dtype=dt, device=dev, text_layers="full")
    genc = GraphedEncoder(model, GraphOptions.named(args.graph_config))
    longest = max(prompt_len(model, im) for im in {*args.image, *(im for im, _ in PARITY_CASES)})
    max_batch = max(*args.requests, 2, THROUGHPUT_BATCH if args.throughput else 1)
    engine = TextEngine(model, max_batch=max_batch, fuse=args.fuse == "on",
                        max_len=bucket_len(longest) + max(args.decode_tokens, args.request_tokens) + 1)
    setup = {"preset": name, "engine_fused": engine.fuse, "graph_config": args.graph_config,
             "graph_budgets": list(genc.config.budgets), "graph_max_items": genc.config.max_items,
             "engine_max_len": engine.max_len}
    result["setup"].append(setup)
    if dev.type == "cuda":
        setup["encoder_capture"] = measured_capture(genc, progress=progress)
        setup["engine_capture"] = capture_engine(engine, model, args.image, args.requests, progress)
    pipes = build_pipelines(model, genc, engine)
    eager_sides = tuple(side for side, graphless in (("encoder", not genc.captured), ("text model", not engine.graphs))
                        if graphless)
    for case in ttft_parity(model, pipes):
        result["parity"].append({"preset": name, **case})
        print_parity(case, eager_sides)
    save()
    if args.profile:
        result["profile"].append({"preset": name, **profile_modes(model, pipes)})
        save()
    if args.image_path:
        from ..measure.image_path import image_path_rows

        result["image_path"] += [dict(r, preset=name) for r in image_path_rows(model, genc)]
        save()

    def on_row(row):
        result["rows"].append(row)
        print_row(row)
        line = e2e_line(row)
        if line:
            print(line, flush=True)
        save()

    grid = dict(images=args.image, requests=args.requests, repeats=args.repeats, decode_tokens=args.decode_tokens,
                progress=progress, on_row=on_row)
    if args.request_tokens:
        run_requests(model, genc, engine, new_tokens=args.request_tokens, **grid)
    else:
        run_ttft(model, genc, engine, **grid)
    if args.throughput:
        tp = throughput_run(model, pipes, engine, requests=args.throughput,
                            new_tokens=args.request_tokens or NEW_TOKENS)
        result["throughput"].append({"preset": name, **tp})
        print_throughput(result["throughput"][-1])
        save()
    setup["engine_stats"] = {"replays": engine.stats.replays, "eager": engine.stats.eager}


def print_parity(case: dict, eager_sides=()) -> None:
    """One parity case as a line per mode (the whole record is the result file's ``parity``)."""
    print(f"parity {case['image']} x{case['requests']}: tokens vs generate's {case['new_tokens']}, first-token logits' "
          "rel err vs float32 (transformers')", flush=True)
    for mode, r in case["modes"].items():
        print(f"  {shown_mode(mode, eager_sides):>32}  {'ok' if r['ok'] else 'FAILED':<6}  first token "
              f"{'same' if r['same_first_token'] else 'DIFFERS'}  {r['matching_tokens']}/{case['new_tokens']} "
              f"tokens  rel err {r['rel_err_vs_fp32']:.1e} ({r['hf_rel_err_vs_fp32']:.1e})", flush=True)


def target_line(t: dict, cuda: bool) -> str:
    """One target of :func:`~.ttft.judge_ttft` as the terminal shows it (:func:`.results.target_line`)."""
    return results_target_line(t, cuda, f"judged on {JUDGED_ON}: no such row in this run")


def run_ttft_cli(args) -> int:
    """TTFT like an engine: text eager/graphed x encoder eager/graphed, phases, decode, parity."""
    dev, dt, presets, result = start_run(args.name, args, setup=[], parity=[], profile=[], image_path=[], rows=[],
                                         throughput=[], errors=[])
    if args.request_tokens or args.throughput:
        result["stand_in"] = STAND_IN
    file = ResultFile(args.out or RESULTS_ROOT, args.name)

    def save():
        judged = judge_ttft(result["rows"], result["image_path"], result["parity"])
        if args.request_tokens:  # a whole-request run: its own targets, and the TTFT grid's tokens and parity
            judged = judge_requests(result) + [t for t in judged if t["target"].startswith("every mode")]
        result["targets"] = judged
        file.save(result)

    status = 0
    if dev.type != "cuda":
        print(TTFT_NO_GRAPHS_NOTE, flush=True)
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
        print(target_line(t, dev.type == "cuda"), flush=True)
    print("results:", file.path, "(every sample, phase and parity record)")
    return status
