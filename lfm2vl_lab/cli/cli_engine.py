"""``python -m lfm2vl_lab engine``: the text model's peers side by side (:mod:`.engine_peers`),
one ``engine-<date>.json`` with every mode, its first-call cost, tokens, parity, the bandwidth floor
and the targets judged from it (:mod:`.engine_measure`).

Per preset: build the full-depth random-weight model, measure every mode, save; a preset that fails
is recorded with its traceback and the next one runs (exit status 1). A mode that fails is data, not
a failure of the run: its row holds the error (exit status 0). The file is rewritten after each preset.
"""

from __future__ import annotations

import traceback

import torch

from ..measure.engine_measure import judge_engine, measure_preset, summary_lines
from ..measure.engine_peers import PROMPT_SOURCE
from ..measure.results import RESULTS_ROOT, ResultFile, target_line
from ..model.presets import build_model
from .cli_serving import start_run


def run_engine_cli(args) -> int:
    """The text model's peers: generate, transformers' static compile, torch.compile, the engine, fused."""
    dev, dt, presets, result = start_run(args.name, args, prompt=PROMPT_SOURCE, setup=[], rows=[], profile={},
                                         targets=[], errors=[])
    result["provenance"]["modes"] = list(dict.fromkeys(args.modes))
    file = ResultFile(args.out or RESULTS_ROOT, args.name)  # saved after every preset
    say = None if args.no_progress else (lambda s: print(s, flush=True))
    status = 0
    for name in presets:
        try:
            model = build_model(name, dtype=dt, device=dev, text_layers="full")
            got = measure_preset(model, list(dict.fromkeys(args.modes)), args.repeats, args.decode_tokens,
                                 args.profile, say)
            result["setup"].append(got["setup"])
            result["rows"] += got["rows"]
            if got["profile"] is not None:
                result["profile"][name] = got["profile"]
            del model, got
        except Exception as exc:  # recorded with its traceback, then the next preset
            status = 1
            result["errors"].append({"preset": name, "error": repr(exc), "traceback": traceback.format_exc()})
            print(traceback.format_exc(), flush=True)
        result["targets"] = judge_engine(result["rows"])
        file.save(result)
        if dev.type == "cuda":
            torch._dynamo.reset()  # the next preset compiles afresh: its first-call costs are its own
            torch.cuda.empty_cache()
    for line in summary_lines(result):
        print(line, flush=True)
    for t in result["targets"]:
        print(target_line(t, dev.type == "cuda"), flush=True)
    print("results:", file.path, "(every sample, first-call cost, token and parity record)")
    return int(status)
