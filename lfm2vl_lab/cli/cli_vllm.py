"""``python -m lfm2vl_lab vllm``: vLLM PR #44930 measured inside vLLM.

Per preset (:mod:`.vllm_preset`): the preset's seeded weights written as a model folder, the float32
references on them, then three vLLM engines (encoder graphs off, the PR's graph config, the kit's)
serving the same requests in rotating turns. The kit's own pipeline on the same cases is ``python -m
lfm2vl_lab pipeline`` (role ``pipeline``), recorded apart so that a change to the kit re-runs no vLLM.
Each preset runs in a process of its own, so its engines and their GPU memory are gone before the next
preset starts; the result file (``vllm-<date>.json``) is rewritten after each preset.

``--deadline`` leaves a preset that no longer fits its expected seconds (:data:`EXPECTED_S`) for a
later call, and ``--resume FILE`` continues such a file: ``complete`` says whether every preset asked
for is in it. Needs a CUDA GPU and vLLM :data:`~.vllm_release.VLLM_VERSION`
(``scripts/h200_run.sh vllm`` installs it on the H200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..measure.results import ResultFile, gpu_slug, provenance
from ..measure.values import UsageError
from ..measure.vllm_ab import ARMS, CASES, PRESETS, TOKENS
from ..measure.vllm_release import ENGINE_ENV, VLLM_VERSION

NAME = "vllm"
# Seconds one preset is expected to take on the H200 at the defaults, what --deadline plans with: each
# preset's recorded seconds of vLLM's part (engine starts, parity, 20 rounds), with about 10% to spare.
EXPECTED_S = {"lfm2-vl-450m": 280, "lfm2-vl-1.6b": 370, "lfm2-vl-3b": 420}
FOLDERS = Path(tempfile.gettempdir()) / "lfm2vl-vllm-models"
BUNDLE_ENV = "LFM2VL_VLLM_BUNDLE"  # bundle.json of the installed bundle (scripts/vllm_bundle.py), for provenance


def _installed_vllm() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def _check_machine() -> str:
    """The vLLM version installed; a :class:`UsageError` (one line) where this machine cannot run it."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"vllm needs a CUDA GPU and vLLM {VLLM_VERSION}, and this machine has no GPU; the recorded "
                         "run is data/results/nvidia-h200/vllm-*.json (scripts/h200_run.sh vllm makes it)")
    got = _installed_vllm()
    if got is None:
        raise UsageError(f"vllm needs vLLM {VLLM_VERSION} installed (scripts/h200_run.sh vllm installs the bundle "
                         "scripts/vllm_bundle.py builds)")
    return got


def _bundle() -> dict | None:
    path = os.environ.get(BUNDLE_ENV)
    if not path or not Path(path).is_file():
        return None
    b = json.loads(Path(path).read_text())
    return {"vllm": b.get("vllm"), "parts": {p.get("name"): p.get("sha256") for p in b.get("parts", [])}}


def new_result(args, command: str, vllm_version: str) -> dict:
    """An empty ``vllm`` result: provenance (the vLLM release and bundle beside the kit's), the settings."""
    prov = provenance(command, dtype="bfloat16", preset=",".join(args.preset or PRESETS), vllm=vllm_version,
                      vllm_bundle=_bundle(), text="full depth, random weights (the kit's seeded presets)")
    settings = {"arms": list(ARMS), "cases": [list(c) for c in CASES], "tokens": list(TOKENS), "rounds": args.rounds,
                "seed": args.seed, "engine_env": ENGINE_ENV}
    return {"name": NAME, "provenance": prov, "settings": settings, "presets": {}, "rows": [], "errors": [],
            "complete": False}


def _child(preset: str, args, left: float | None) -> dict:
    """One preset in a process of its own (its engines die with it); returns its section."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "section.json"
        cmd = [sys.executable, "-m", "lfm2vl_lab", "vllm", "--one-preset", preset, "--section-out", str(out),
               "--rounds", str(args.rounds), "--seed", str(args.seed)]
        env = {**os.environ, **ENGINE_ENV}
        try:
            rc = subprocess.run(cmd, env=env, timeout=left).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"{preset}: stopped at the call's deadline ({left:.0f} s)"}
        if rc != 0 or not out.is_file():
            return {"error": f"{preset}: its process ended with exit status {rc} (the log above says why)"}
        return json.loads(out.read_text())


def run_presets(args, result: dict, save) -> dict:
    """Run each preset the result lacks, in order, while it fits the deadline; save after each."""
    t0 = time.perf_counter()
    for preset in args.preset or PRESETS:
        if preset in result["presets"]:
            continue
        left = None if args.deadline is None else args.deadline - (time.perf_counter() - t0)
        if left is not None and left < EXPECTED_S[preset]:
            print(f"== {preset}: left for --resume ({left:.0f} s left, about {EXPECTED_S[preset]} s needed)",
                  flush=True)
            break
        print(f"== {preset}", flush=True)
        t1 = time.perf_counter()
        sec = _child(preset, args, left)
        if "error" in sec:
            result["errors"].append(sec)
            print("   FAILED:", sec["error"], flush=True)
            save(result)
            break
        sec["seconds"]["total"] = round(time.perf_counter() - t1, 1)
        result["rows"] += sec.pop("rows")
        result["presets"][preset] = sec
        save(result)
    result["complete"] = all(p in result["presets"] for p in args.preset or PRESETS) and not result["errors"]
    save(result)
    return result


def run_vllm_cli(args) -> int:
    """vLLM itself on the GPU: encoder graphs off, the PR's config and the kit's."""
    version = _check_machine()
    if args.one_preset:
        from ..measure.vllm_preset import measure_preset

        say = (lambda s: None) if args.no_progress else (lambda s: print(s, flush=True))
        sec = measure_preset(args.one_preset, args.rounds, FOLDERS, args.seed, say)
        Path(args.section_out).write_text(json.dumps(sec, default=str))
        return 0
    if version != VLLM_VERSION:
        print(f"warning: vLLM {version} is installed; the kit pins {VLLM_VERSION}", flush=True)
    command = "python -m lfm2vl_lab " + " ".join(sys.argv[1:])
    file = ResultFile(args.out, args.name)  # saved after every preset: --resume continues it
    if args.resume:
        path = Path(args.resume)
        if not path.is_file():
            raise UsageError(f"--resume {args.resume}: no such file")
        result = json.loads(path.read_text())
        if result.get("name") != NAME or result["provenance"].get("vllm") != version:
            raise UsageError(f"--resume {args.resume}: not a vllm result of vLLM {version}")
        result.setdefault("resumed", []).append({"date": provenance(command)["date"], "command": command})
        # the file keeps its name, under --out (where this call's results are collected)
        file.path = Path(args.out) / gpu_slug(result["provenance"]["gpu"]) / path.name
        file.path.parent.mkdir(parents=True, exist_ok=True)
    else:
        result = new_result(args, command, version)

    result = run_presets(args, result, file.save)
    from ..report.vllm_report import summary_lines

    for line in summary_lines(result):
        print(line, flush=True)
    print("results:", file.path, "(complete)" if result["complete"] else "(incomplete: --resume it)")
    return 1 if result["errors"] else 0
