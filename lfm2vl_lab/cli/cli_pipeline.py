"""``python -m lfm2vl_lab pipeline``: the kit's pipeline on vLLM's A/B (:mod:`~lfm2vl_lab.measure.pipeline_ab`).

The same presets, cases, arms, prompt, seeded weights and parity judge as ``python -m lfm2vl_lab vllm``,
with the kit's :class:`~lfm2vl_lab.serving.pipeline.VlmPipeline` (text model graphed, the fused engine)
in vLLM's place: one ``pipeline-<date>.json``, rewritten after each preset. A preset that fails is
recorded with its traceback and the next one runs (exit status 1). Needs a CUDA GPU: the A/B's
weights are bf16 at full depth, and its cases are timed as vLLM's are, on the GPU.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import traceback
from pathlib import Path

from ..measure.results import ResultFile, provenance
from ..measure.values import UsageError
from ..measure.vllm_ab import ARMS, CASES, PRESETS, TOKENS

NAME = "pipeline"
FOLDERS = Path(tempfile.gettempdir()) / "lfm2vl-pipeline-models"


def new_result(args, command: str) -> dict:
    """An empty ``pipeline`` result: provenance and the A/B's settings."""
    prov = provenance(command, dtype="bfloat16", preset=",".join(args.preset or PRESETS),
                      text="full depth, random weights (the kit's seeded presets)")
    settings = {"arms": list(ARMS), "cases": [list(c) for c in CASES], "tokens": list(TOKENS),
                "repeats": args.repeats, "seed": args.seed, "engine": "the kit's VlmPipeline, text model fused"}
    return {"name": NAME, "provenance": prov, "settings": settings, "presets": {}, "rows": [], "errors": [],
            "complete": False}


def run_pipeline_cli(args) -> int:
    """The kit's pipeline on vLLM's A/B: the same cases, arms, weights and parity judge."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("pipeline needs a CUDA GPU (the A/B runs bf16 at full depth); the recorded run is "
                         "data/results/nvidia-h200/pipeline-*.json")
    from ..measure.pipeline_ab import measure_preset

    say = (lambda s: None) if args.no_progress else (lambda s: print(s, flush=True))
    result = new_result(args, "python -m lfm2vl_lab " + " ".join(sys.argv[1:]))
    file = ResultFile(args.out, args.name)
    for preset in args.preset or PRESETS:
        try:
            sec = measure_preset(preset, args.repeats, FOLDERS, args.seed, say)
            result["rows"] += sec.pop("rows")
            result["presets"][preset] = sec
        except Exception as exc:  # recorded with its traceback, then the next preset
            result["errors"].append({"preset": preset, "error": repr(exc), "traceback": traceback.format_exc()})
            print(traceback.format_exc(), flush=True)
        file.save(result)
        torch._dynamo.reset()  # the next preset compiles afresh: its capture costs are its own
        gc.collect()
        torch.cuda.empty_cache()
    result["complete"] = not result["errors"]
    file.save(result)
    from ..report.vllm_report import summary_lines

    for line in summary_lines(result):
        print(line, flush=True)
    print("results:", file.path)
    return 1 if result["errors"] else 0
