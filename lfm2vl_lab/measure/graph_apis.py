"""The CUDA-graph APIs that vLLM PR #44930's readers are pointed to, measured on a toy module.

Three ways to get CUDA graphs in PyTorch, and what each does on the host (notebook 02, section 5):

* ``torch.cuda.graph``: stream capture, instantiate, launch. :func:`capture_trace` profiles one
  eager call, one capture and two replays, and :func:`phase_calls` reads the CUDA API calls of each
  phase out of the Chrome trace (``cudaStreamBeginCapture`` … ``cudaGraphLaunch``).
* ``torch.cuda.make_graphed_callables``: fixed sample arguments, forward *and* backward graphs.
  :func:`graphed_callable_demo` checks parity and feeds it other shapes; :func:`shape_checked` is
  the shape check it does not make.
* ``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees): :func:`reduce_overhead_demo` times
  the first calls of each new shape and counts the graph captures (:func:`counting_captures`);
  :func:`compile_vs_capture` sets the benchmark's recorded ``compile`` rows next to ``lab-graph``'s.

What breaks a capture (:func:`capture_errors`, :func:`capture_outcome`) lives in :mod:`.capture_breaks`,
with a check for host reads that runs on any machine; both names are importable from here too.

The demos need CUDA. ``python -m lfm2vl_lab graph-apis`` (:func:`.cli.record_graph_apis`) records them into
``graph-apis-<date>.json``; on a machine without CUDA the notebooks' ``live_or_recorded``
(:mod:`.notebook`) reads the reference set's ``graph-apis`` file.
"""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
import textwrap
import warnings
from collections.abc import Callable
from contextlib import contextmanager

import torch

from ..core.capture import capture_graph
from ..model.parity import rel_error
from .capture_breaks import capture_errors, capture_outcome, first_line  # noqa: F401 (capture_outcome: re-exported)
from .modes import counter_diff, dynamo_counters
from .profiler_log import quiet_profile
from .timing import time_call, time_calls
from .trace_analysis import GRAPH_APIS, PHASE_PREFIX, phase_calls

NAME = "graph-apis"  # result files: data/results/<gpu>/graph-apis-<date>.json
TOY_BLOCKS, TOY_WIDTH, TOY_BATCH = 4, 256, 8  # the toy: 4 x (Linear(256, 256) + GELU) on 8 rows
NEW_BATCHES = (16, 4, 1)  # batches a graph captured at TOY_BATCH is fed: more rows, fewer, one
COMPILE_BATCHES = (8, 16, 32)  # the shapes torch.compile sees, in this order


# --- The toy module and the trace of capture and replay ------------------------------------------------------------


def toy_mlp(blocks: int = TOY_BLOCKS, width: int = TOY_WIDTH, device="cuda", seed: int = 0) -> torch.nn.Module:
    """``blocks`` x (Linear + GELU): many small kernels, the case graphs are made for. Seeded
    without touching the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(blocks)]
    return torch.nn.Sequential(*layers).to(device)


def toy_label(blocks: int = TOY_BLOCKS, width: int = TOY_WIDTH, batch: int | None = TOY_BATCH) -> str:
    """How results name the toy: ``"4 x (Linear(256, 256) + GELU), batch 8, float32"``."""
    return f"{blocks} x (Linear({width}, {width}) + GELU)" + (f", batch {batch}" if batch else "") + ", float32"


def graph_api_sequence(phases: list[dict]) -> list[str]:
    """The graph-making calls (:data:`GRAPH_APIS`) over all phases, in order, runs collapsed."""
    return [f"{name} x{n}" if n > 1 else name for ph in phases for name, n in ph["calls"]
            if name.startswith(GRAPH_APIS)]


def capture_trace(device="cuda", replays: int = 2, blocks: int = TOY_BLOCKS, width: int = TOY_WIDTH,
                  batch: int = TOY_BATCH) -> dict:
    """Profile the toy's eager call, its capture with ``torch.cuda.graph`` and ``replays`` replays;
    return each phase's API calls and kernels (:func:`phase_calls`) and the replay's parity.

    Warm-up (the kit's :func:`~lfm2vl_lab.core.capture.capture_graph`, a throw-away graph) runs
    before the profiler, so cuBLAS set-up and the first capture's one-off work stay out of it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    module = toy_mlp(blocks, width, device).eval()
    static_x = torch.randn(batch, width, device=device)
    with torch.no_grad(), warnings.catch_warnings():
        # one profiling cycle here, so torch's "clears events at the end of each cycle" notice says nothing
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        capture_graph(lambda: module(static_x))  # warm-up, and a first capture, thrown away
        graph = torch.cuda.CUDAGraph()
        with quiet_profile(profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])) as prof:
            with record_function(PHASE_PREFIX + "eager"):
                eager = module(static_x)
            torch.cuda.synchronize()
            with record_function(PHASE_PREFIX + "capture"), torch.cuda.graph(graph):
                static_y = module(static_x)
            torch.cuda.synchronize()
            for i in range(replays):
                with record_function(f"{PHASE_PREFIX}replay {i + 1}"):
                    graph.replay()
                torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".pt.trace.json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        phases = phase_calls(path)
    finally:
        os.unlink(path)
    return {"module": toy_label(blocks, width, batch), "replays": replays, "phases": phases,
            "replay_rel_err": rel_error(static_y, eager)}


def short_kernel(name: str) -> str:
    """A kernel's name without its template and argument lists and ``void``: what a reader scans for."""
    return name.split("<")[0].split("(")[0].removeprefix("void ").strip()


def trace_lines(trace: dict) -> str:
    """A trace (:func:`capture_trace`) as text: per phase, the kernels that ran and the API calls;
    in a phase that captured, also the kernels that did run (torch's set-up before the capture)."""
    lines = [f"{trace['module']}: per phase, the kernels that ran on the GPU, the launch calls on the host, "
             "then every CUDA API call in order (repeats collapsed)"]
    wrap = {"width": 116, "initial_indent": " " * 6, "subsequent_indent": " " * 6}
    for ph in trace["phases"]:
        calls = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in ph["calls"]) or "(none)"
        captured = ph.get("captured_launches", 0)
        during = f" ({captured} while capturing)" if captured else ""
        lines.append(f"  {ph['phase']:<9} kernels run: {ph['kernels']:>3}   launch calls: {ph['kernel_launches']:>3} "
                     f"kernel{during}, {ph['graph_launches']} graph")
        lines += textwrap.wrap(calls, **wrap)
        if captured and ph.get("kernel_names"):
            ran = ", ".join(f"{short_kernel(n)} x{c}" if c > 1 else short_kernel(n) for n, c in ph["kernel_names"])
            lines += textwrap.wrap(f"kernels that ran: {ran}", **wrap)
    lines.append("graph APIs in order: " + " -> ".join(graph_api_sequence(trace["phases"])))
    unnamed = sum(ph.get("unnamed", 0) for ph in trace["phases"])
    if unnamed:
        lines.append(f"({unnamed} API calls the profiler could not name are left out)")
    lines.append(f"replay vs eager: rel. error {trace['replay_rel_err']:.1e}")
    return "\n".join(lines)


# --- make_graphed_callables ----------------------------------------------------------------------------------------


@contextmanager
def counting_captures():
    """Count the CUDA-graph captures begun inside the block, by anyone (``torch.cuda.graph``,
    ``make_graphed_callables``, torch.compile's graph trees): yields ``{"captures": n}``, kept up to
    date. It wraps ``torch.cuda.CUDAGraph.capture_begin`` for the block and puts it back after."""
    cls = torch.cuda.CUDAGraph
    original = cls.capture_begin
    seen = {"captures": 0}

    def capture_begin(self, *args, **kwargs):
        seen["captures"] += 1
        return original(self, *args, **kwargs)

    cls.capture_begin = capture_begin
    try:
        yield seen
    finally:
        cls.capture_begin = original


def _shapes(args) -> list[tuple]:
    return [(tuple(a.shape), str(a.dtype).removeprefix("torch.")) for a in args]


def shape_checked(fn: Callable, sample_args: tuple) -> Callable:
    """``fn`` behind the check ``make_graphed_callables`` does not make: each argument must have its
    sample's shape and dtype, else ``ValueError`` (a graph replays fixed sizes; the graphed callable
    itself copies a new input into the sample's buffer, which fails or broadcasts)."""
    expected = _shapes(sample_args)

    def checked(*args):
        got = _shapes(args)
        if got != expected:
            raise ValueError(f"captured for {expected}, called with {got}: a graph replays fixed shapes, so pad "
                             "the input to a captured shape or capture one graph per shape (the kit's budgets)")
        return fn(*args)

    return checked


def _fwd_bwd_parity(graphed, eager, x: torch.Tensor) -> dict:
    """Forward output, input gradient and first weight gradient: graphed vs eager, same input."""
    xg, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    yg, ye = graphed(xg), eager(xe)
    grad = torch.randn_like(ye)
    (yg * grad).sum().backward()
    (ye * grad).sum().backward()
    wg, we = next(graphed.parameters()).grad, next(eager.parameters()).grad
    return {"forward": rel_error(yg, ye), "input_grad": rel_error(xg.grad, xe.grad), "weight_grad": rel_error(wg, we)}


def _new_shape(graphed, eager, batch: int, width: int, device) -> dict:
    """Call the graphed module on ``batch`` rows: an error, a wrong shape, or a right answer."""
    x = torch.randn(batch, width, device=device, requires_grad=True)
    try:
        y = graphed(x)
    except RuntimeError as exc:
        return {"batch": batch, "outcome": "error", "error": first_line(exc)}
    right = tuple(y.shape) == (batch, width) and rel_error(y, eager(x)) < 1e-4
    return {"batch": batch, "outcome": "ok" if right else "wrong", "out_shape": list(y.shape)}


def graphed_callable_demo(device="cuda", batch: int = TOY_BATCH, new_batches=NEW_BATCHES,
                          blocks: int = TOY_BLOCKS, width: int = TOY_WIDTH) -> dict:
    """``make_graphed_callables`` on the toy (training mode, sample of ``batch`` rows): how many
    graphs it captures, parity with an eager copy (forward, input and weight gradients), what
    ``new_batches`` rows do to it, and what :func:`shape_checked` says instead."""
    module = toy_mlp(blocks, width, device)
    eager = copy.deepcopy(module)
    sample = (torch.randn(batch, width, device=device, requires_grad=True),)
    with counting_captures() as seen, warnings.catch_warnings():
        # The warm-up backward make_graphed_callables runs on a side stream leaves AccumulateGrad nodes
        # that later meet the demo's default-stream backward: torch warns of a possible sync. The
        # gradients are checked against the eager copy below, which is what matters here.
        warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
        graphed = torch.cuda.make_graphed_callables(module, sample)
        parity = _fwd_bwd_parity(graphed, eager, torch.randn(batch, width, device=device))
        shapes = [_new_shape(graphed, eager, b, width, device) for b in new_batches]
    try:
        shape_checked(graphed, sample)(torch.randn(new_batches[0], width, device=device))
        guard = None
    except ValueError as exc:
        guard = first_line(exc)
    return {"module": toy_label(blocks, width, batch), "captures": seen["captures"], "parity": parity,
            "new_shapes": shapes, "guard": guard}


def graphed_lines(demo: dict) -> str:
    """A :func:`graphed_callable_demo` result as text."""
    p = demo["parity"]
    lines = [f"make_graphed_callables on {demo['module']}: {demo['captures']} graphs captured"
             + (" (forward and backward)" if demo["captures"] == 2 else ""),
             f"  at the sample's shape, graphed vs eager rel. error: forward {p['forward']:.1e}, "
             f"input grad {p['input_grad']:.1e}, weight grad {p['weight_grad']:.1e}"]
    for s in demo["new_shapes"]:
        what = {"error": lambda s: s["error"], "ok": lambda s: "right answer",
                "wrong": lambda s: f"no error, but {s['out_shape'][0]} rows came back: silently wrong"}[s["outcome"]]
        lines.append(f"  batch {s['batch']:>2}: {what(s)}")
    lines.append(f"  with shape_checked: {demo['guard']}")
    return "\n".join(lines)


# --- torch.compile(mode="reduce-overhead"): CUDA-graph trees -------------------------------------------------------


def _compiled_shape(compiled, module, batch: int, width: int, device, seen: dict, calls: int, repeats: int) -> dict:
    """First ``calls`` calls of one new shape (timed one by one), then the steady replay."""
    x = torch.randn(batch, width, device=device)

    def call():
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last outputs may be overwritten
        return compiled(x)

    before, captures = dynamo_counters(), seen["captures"]
    first = [time_call(call, device)[0] for _ in range(calls)]
    row = {"batch": batch, "first_calls_ms": first, "captures": seen["captures"] - captures,
           "dynamo": counter_diff(before, dynamo_counters())}
    row["steady_ms"] = statistics.median(time_calls(call, repeats, 0, device))
    row["rel_err"] = rel_error(call().clone(), module(x))
    return row


def reduce_overhead_demo(device="cuda", batches=COMPILE_BATCHES, calls: int = 3, repeats: int = 20,
                         blocks: int = TOY_BLOCKS, width: int = TOY_WIDTH) -> dict:
    """``torch.compile(toy, mode="reduce-overhead")`` fed ``batches`` in turn (dynamo's defaults):
    per shape, the first ``calls`` calls (compile, warm-up, recording), the captures they made, the
    dynamo counters that moved (``stats.unique_graphs``: graphs compiled), the steady replay and
    the error vs eager."""
    torch._dynamo.reset()  # start cold: no graph compiled or recorded yet
    module = toy_mlp(blocks, width, device).eval()
    compiled = torch.compile(module, mode="reduce-overhead")
    with torch.no_grad(), counting_captures() as seen:
        rows = [_compiled_shape(compiled, module, b, width, device, seen, calls, repeats) for b in batches]
    return {"module": toy_label(blocks, width, None), "rows": rows,
            "automatic_dynamic_shapes": bool(torch._dynamo.config.automatic_dynamic_shapes)}


def reduce_overhead_lines(demo: dict) -> str:
    """A :func:`reduce_overhead_demo` result as text."""
    lines = [f"torch.compile(mode='reduce-overhead') on {demo['module']}, shapes in this order:",
             f"  {'batch':>5} {'call 1 ms':>10} {'call 2 ms':>10} {'call 3 ms':>10} {'steady ms':>10} "
             f"{'compiled':>9} {'captures':>9}"]
    for r in demo["rows"]:
        f = r["first_calls_ms"] + [float("nan")] * 3
        lines.append(f"  {r['batch']:>5} {f[0]:>10.1f} {f[1]:>10.2f} {f[2]:>10.2f} {r['steady_ms']:>10.3f} "
                     f"{r['dynamo'].get('stats.unique_graphs', 0):>9} {r['captures']:>9}")
    return "\n".join(lines)


# --- The recorded benchmark: compile vs the kit's capture ----------------------------------------------------------


def compile_vs_capture(compile_result: dict, capture_result: dict | None = None) -> list[dict]:
    """Per workload of a benchmark file's ``compile`` rows (in the order they ran, in one process, so
    each new shape meets what earlier ones compiled and recorded), next to the ``lab-graph`` row of
    the same workload from ``capture_result`` (default: the same file). Fixed workloads carry their
    first three calls; the stream, its p99. ``capture_s`` is the kit's one-off capture of every
    budget, paid once before the first request; compile pays in first calls instead."""
    graph = {r["workload"]: r for r in (capture_result or compile_result)["rows"] if r["mode"] == "lab-graph"}
    rows = []
    for c in (r for r in compile_result["rows"] if r["mode"] == "compile"):
        g, dyn, first = graph.get(c["workload"], {}), c.get("dynamo") or {}, c.get("first_calls_ms") or []
        rows.append({
            "workload": c["workload"], "items": c.get("n_items"), "compile_first_ms": first[:3] or None,
            "compile_median_ms": c["median_ms"], "compile_p99_ms": c["p99_ms"],
            "new_graphs": dyn.get("stats.unique_graphs", 0), "graph_breaks": dyn.get("graph_break.total", 0),
            "recorded": dyn.get("inductor.cudagraph_recorded_non_static_inputs", 0) > 0,
            "capture_s": g.get("capture_s"), "graph_first_ms": (g.get("first_calls_ms") or [None])[0],
            "graph_median_ms": g.get("median_ms"), "graph_p99_ms": g.get("p99_ms")})
    return rows


def _ms(v, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def compile_vs_capture_lines(rows: list[dict]) -> str:
    """:func:`compile_vs_capture` rows as a table (ms unless marked s)."""
    lines = [f"{'':<9}{'  torch.compile reduce-overhead, ms ':-^67} | {' lab-graph, ms ':-^32}",
             f"{'workload':<9}{'call 1':>16}{'call 2':>8}{'call 3':>8}{'median':>8}{'p99':>7}"
             f"{'new graphs':>11}{'recorded':>9} | {'call 1':>17}{'median':>8}{'p99':>7}"]
    for r in rows:
        f = (r["compile_first_ms"] or []) + [None] * 3
        lines.append(f"{r['workload']:<9}{_ms(f[0]):>16}{_ms(f[1]):>8}{_ms(f[2]):>8}"
                     f"{_ms(r['compile_median_ms'], '.2f'):>8}{_ms(r['compile_p99_ms']):>7}{r['new_graphs']:>11}"
                     f"{'yes' if r['recorded'] else 'no':>9} | {_ms(r['graph_first_ms'], '.2f'):>17}"
                     f"{_ms(r['graph_median_ms'], '.2f'):>8}{_ms(r['graph_p99_ms'], '.2f'):>7}")
    cap = next((r["capture_s"] for r in rows if r["capture_s"] is not None), None)
    firsts = sum(r["compile_first_ms"][0] for r in rows if r["compile_first_ms"]) / 1e3
    lines.append(f"one-off: compile's first calls add up to {firsts:.1f} s; the kit captured every budget once, "
                 f"before the first request, in {_ms(cap, '.2f')} s")
    s = compile_vs_capture_summary(rows)
    if s["new_graph_workloads"]:
        lines.append(f"compile's first call took {s['new_graph_first_min_ms'] / 1e3:.1f} s or more on the workloads "
                     f"that made new graphs ({', '.join(s['new_graph_workloads'])})")
    if s["later_workloads"]:
        lines.append(f"on the {len(s['later_workloads'])} that compiled nothing new, its first two calls took "
                     f"{s['later_first_two_ms'][0]:.1f} to {s['later_first_two_ms'][1]:.1f} ms each")
    if s["graph_excess_ms"] is not None:
        lines.append(f"lab-graph's first call was at most {s['graph_excess_ms']:.2f} ms above its median "
                     f"({s['graph_excess_workload']})")
    return "\n".join(lines)


def compile_vs_capture_summary(rows: list[dict]) -> dict:
    """What :func:`compile_vs_capture` rows say about first calls: the workloads whose compile made new
    graphs and the least their first call took; for the workloads after them that made none, the range
    of their first two calls; and how far lab-graph's first call ran above its median at most (and where)."""
    timed = [r for r in rows if r["compile_first_ms"]]
    new = [r for r in timed if r["new_graphs"]]
    later = [r for r in timed if not r["new_graphs"]]
    two = [ms for r in later for ms in r["compile_first_ms"][:2]]
    excess = [(r["graph_first_ms"] - r["graph_median_ms"], r["workload"]) for r in rows
              if r["graph_first_ms"] is not None and r["graph_median_ms"] is not None]
    worst = max(excess, default=(None, None))
    return {"new_graph_workloads": [r["workload"] for r in new],
            "new_graph_first_min_ms": min((r["compile_first_ms"][0] for r in new), default=None),
            "later_workloads": [r["workload"] for r in later],
            "later_first_two_ms": (min(two), max(two)) if two else None,
            "graph_excess_ms": worst[0], "graph_excess_workload": worst[1]}


# --- Live on a GPU, recorded elsewhere -----------------------------------------------------------------------------

RECORDERS: dict[str, Callable[..., dict]] = {
    "trace": capture_trace, "graphed_callables": graphed_callable_demo, "reduce_overhead": reduce_overhead_demo,
    "capture_errors": capture_errors}
