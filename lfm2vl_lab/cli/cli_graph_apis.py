"""``python -m lfm2vl_lab graph-apis``: notebook 02's demos of torch's graph APIs, recorded on a GPU
(:mod:`.graph_apis` holds the demos; :mod:`.cli` the parser)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path

from ..measure.graph_apis import NAME, RECORDERS, graphed_lines, reduce_overhead_lines, trace_lines
from ..measure.results import RESULTS_ROOT, ResultFile, provenance
from .cli import command_line, need_cuda

# each part's result as the terminal shows it
FORMATTERS: dict[str, Callable] = {
    "trace": trace_lines, "graphed_callables": graphed_lines, "reduce_overhead": reduce_overhead_lines,
    "capture_errors": lambda errs: "\n".join(
        f"capture of {name:<24} {'captured' if o['captured'] else o['error']}" for name, o in errs.items())}


def record_graph_apis(root=None, command: str | None = None, device="cuda",
                      recorders: dict | None = None) -> tuple[dict, Path]:
    """Run ``recorders`` (default: every part of :data:`~.graph_apis.RECORDERS`: the API calls of
    capture and replay, the ``make_graphed_callables`` demo, the ``reduce-overhead`` demo, what
    breaks a capture) on ``device`` in turn; return the result and the path of the
    ``graph-apis-<date>.json`` that holds it, rewritten after each part. ``seconds`` says how long
    each part took; ``errors`` lists the parts that failed (their entry is then ``None``), each
    with its traceback, while the next part runs."""
    prov = provenance(command or "python -m lfm2vl_lab graph-apis", device=device, preset="toy-mlp",
                      dtype="float32")
    result: dict = {"name": NAME, "provenance": prov, "seconds": {}, "errors": []}
    file = ResultFile(root if root is not None else RESULTS_ROOT, NAME)  # saved after every part
    for part, fn in (RECORDERS if recorders is None else recorders).items():
        t0 = time.perf_counter()
        try:
            result[part] = fn(device)
        except Exception as exc:  # recorded with its traceback, then the next part
            result[part] = None
            result["errors"].append({"part": part, "error": repr(exc), "traceback": traceback.format_exc(),
                                     "recovery": _recover()})
        result["seconds"][part] = round(time.perf_counter() - t0, 2)
        file.save(result)
    return result, file.path


def _recover() -> str:
    """After a failed part, put torch's stream and CUDA RNG back in case it failed inside a capture
    (see :func:`~lfm2vl_lab.core.capture.recover_from_failed_capture`), so the next part can run.
    Returns what that did, or why it could not: the next part then shows what is still broken."""
    from ..core.capture import recover_from_failed_capture

    try:
        return str(recover_from_failed_capture())
    except Exception as exc:  # recorded, not raised: the run goes on
        return f"recovery failed: {exc!r}"



def run_graph_apis_cli(args) -> int:
    """Record the graph-API demos of notebook 02 (capture trace, make_graphed_callables, reduce-overhead)."""
    need_cuda("graph-apis")
    result, path = record_graph_apis(args.out, command_line())
    for part, fmt in FORMATTERS.items():
        if result.get(part) is not None:
            print(fmt(result[part]), flush=True)
    for err in result["errors"]:
        print(f"{err['part']} FAILED: {err['error']}\n{err['traceback']}", flush=True)
    print("results:", path)
    return 1 if result["errors"] else 0
