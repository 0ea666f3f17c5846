"""``python -m lfm2vl_lab graph-apis``: record notebook 02's graph-API demos on a GPU.

Runs each part of :data:`.graph_apis.RECORDERS` (the API calls of capture and replay, the
``make_graphed_callables`` demo, the ``reduce-overhead`` demo over three shapes, what breaks a
capture) and writes ``graph-apis-<date>.json`` with provenance under ``data/results/<gpu>/``. The
file is rewritten after each part, and a part that fails is recorded with its traceback while the
next one runs. Without CUDA, notebook 02 reads the newest such file instead.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import torch

from ..core.capture import recover_from_failed_capture
from .graph_apis import NAME, RECORDERS, graphed_lines, reduce_overhead_lines, trace_lines
from .results import RESULTS_ROOT, provenance, save_result

FORMATTERS = {"trace": trace_lines, "graphed_callables": graphed_lines, "reduce_overhead": reduce_overhead_lines,
              "capture_errors": lambda errs: "\n".join(
                  f"capture of {name:<24} {'captured' if o['captured'] else o['error']}" for name, o in errs.items())}


def record(root=None, command: str | None = None, device="cuda", recorders: dict | None = None) -> tuple[dict, Path]:
    """Run ``recorders`` (default: every part of :data:`~.graph_apis.RECORDERS`) on ``device`` in
    turn; return the result and the path of the file that holds it. ``seconds`` says how long each
    part took; ``errors`` lists the parts that failed (their entry is then ``None``)."""
    prov = provenance(command or "python -m lfm2vl_lab graph-apis", device=device, preset="toy-mlp",
                      dtype="float32")
    result: dict = {"name": NAME, "provenance": prov, "seconds": {}, "errors": []}
    path = None
    for part, fn in (RECORDERS if recorders is None else recorders).items():
        t0 = time.perf_counter()
        try:
            result[part] = fn(device)
        except Exception as exc:  # recorded with its traceback, then the next part
            result[part] = None
            result["errors"].append({"part": part, "error": repr(exc), "traceback": traceback.format_exc(),
                                     "recovery": _recover()})
        result["seconds"][part] = round(time.perf_counter() - t0, 2)
        path = save_result(result, root if root is not None else RESULTS_ROOT, NAME, path)
    return result, path


def _recover() -> str:
    """After a failed part, put torch's stream and CUDA RNG back in case it failed inside a capture
    (see :func:`~lfm2vl_lab.core.capture.recover_from_failed_capture`), so the next part can run.
    Returns what that did, or why it could not: the next part then shows what is still broken."""
    try:
        return str(recover_from_failed_capture())
    except Exception as exc:  # recorded, not raised: the run goes on
        return f"recovery failed: {exc!r}"


def add_graph_apis_args(p) -> None:
    """Options of ``python -m lfm2vl_lab graph-apis``."""
    p.add_argument("--out", default=None, help="results root (default: data/results)")


def run_graph_apis_cli(args) -> int:
    """Record the graph-API demos of notebook 02 (capture trace, make_graphed_callables, reduce-overhead)."""
    from .args import UsageError

    if not torch.cuda.is_available():
        raise UsageError("graph-apis needs a CUDA GPU and none is available; without one, notebook 02 "
                         f"reads the recorded {NAME}-*.json from data/results/")
    result, path = record(args.out, "python -m lfm2vl_lab " + " ".join(sys.argv[1:]))
    for part, fmt in FORMATTERS.items():
        if result.get(part) is not None:
            print(fmt(result[part]), flush=True)
    for err in result["errors"]:
        print(f"{err['part']} FAILED: {err['error']}\n{err['traceback']}", flush=True)
    print("results:", path)
    return 1 if result["errors"] else 0
