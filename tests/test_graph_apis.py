"""measure/graph_apis.py and ``python -m lfm2vl_lab graph-apis``: the graph APIs of notebook 02, section 5.

On a CPU: the trace reading on a synthetic Chrome trace, the shape guard, the capture counter, the
compile-vs-capture table on the reference set's H200 benchmark files, the CLI's error without CUDA, and
the result file of a faked run, read back through a reference set (its shape is what the notebook
reads). On a GPU (``gpu`` marker): the real recorders and the real command.
"""

from __future__ import annotations

import json

import pytest
import torch

from lfm2vl_lab.cli.cli import main
from lfm2vl_lab.cli.cli_graph_apis import FORMATTERS
from lfm2vl_lab.cli.cli_graph_apis import record_graph_apis as record
from lfm2vl_lab.measure import graph_apis as ga
from lfm2vl_lab.measure.results import RESULTS_ROOT
from lfm2vl_lab.measure.trace_analysis import GRAPH_APIS, PHASE_PREFIX, collapse, phase_calls
from lfm2vl_lab.report import notebook as nb
from lfm2vl_lab.report import reference

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="the case is an error only on a machine without CUDA")
P = PHASE_PREFIX


def _x(name, ts, dur=1, cat="cuda_runtime", corr=None):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {} if corr is None else {"correlation": corr}}


def synthetic_trace() -> list[dict]:
    """What torch.profiler records for one eager call (3 kernels), a capture and two replays."""
    ev = [_x(P + "eager", 0, 100, "user_annotation"),
          _x("cudaLaunchKernel", 10, corr=1), _x("cuLaunchKernelEx", 20, cat="cuda_driver", corr=2),
          _x("cudaLaunchKernel", 30, corr=3),
          _x("cudaDeviceSynchronize", 150),  # between phases: in no window
          _x(P + "capture", 200, 100, "user_annotation"), _x("cudaDeviceSynchronize", 205),
          _x("cudaLaunchKernel", 207, corr=9),  # torch's set-up before the capture: this kernel runs
          _x("cudaStreamBeginCapture", 210), _x("INVALID", 215),
          _x("cudaLaunchKernel", 220, corr=4), _x("cudaLaunchKernel", 230, corr=5),
          _x("cudaStreamEndCapture", 240), _x("cudaGraphInstantiateWithFlags", 250)]
    for i, t in enumerate((400, 500)):
        ev += [_x(f"{P}replay {i + 1}", t, 50, "user_annotation"), _x(P + "replay", t, 50, "gpu_user_annotation"),
               _x("cudaGraphLaunch", t + 10, corr=6 + i)]
    # kernels run on the GPU: the eager ones, the set-up one, none of the captured ones, three per replay
    ev += [_x(f"k{c}", 40 + c, cat="kernel", corr=c) for c in (1, 2, 3)]
    ev += [_x("void at::native::fill_kernel<float>(float*)", 208, cat="kernel", corr=9)]
    ev += [_x(f"k{j}", t + 20 + j, cat="kernel", corr=6 + i) for i, t in enumerate((400, 500)) for j in range(3)]
    return ev


# ------------------------------------------------------------------------------------------------
# Reading the trace


def test_collapse_keeps_order_and_counts_runs():
    assert collapse(["a", "a", "b", "a"]) == [["a", 2], ["b", 1], ["a", 1]]
    assert collapse([]) == []


def test_phase_calls_lists_each_phase_calls_in_order_and_the_kernels_they_started():
    phases = phase_calls(synthetic_trace())
    assert [p["phase"] for p in phases] == ["eager", "capture", "replay 1", "replay 2"]
    eager, capture, r1, r2 = phases
    assert eager["calls"] == [["cudaLaunchKernel", 1], ["cuLaunchKernelEx", 1], ["cudaLaunchKernel", 1]]
    assert eager["counts"] == {"cudaLaunchKernel": 2, "cuLaunchKernelEx": 1} and eager["kernels"] == 3
    assert [n for n, _ in capture["calls"]] == ["cudaDeviceSynchronize", "cudaLaunchKernel", "cudaStreamBeginCapture",
                                              "cudaLaunchKernel", "cudaStreamEndCapture",
                                              "cudaGraphInstantiateWithFlags"]
    assert capture["unnamed"] == 1 and "INVALID" not in capture["counts"]
    # three launch calls, two of them recorded by the capture; only the set-up kernel ran
    assert (capture["kernel_launches"], capture["captured_launches"], capture["kernels"]) == (3, 2, 1)
    assert capture["kernel_names"] == [["void at::native::fill_kernel<float>(float*)", 1]]
    assert r1["calls"] == r2["calls"] == [["cudaGraphLaunch", 1]] and r1["kernels"] == r2["kernels"] == 3
    launches = [(p["kernel_launches"], p["graph_launches"]) for p in phases]
    assert launches == [(3, 0), (3, 0), (0, 1), (0, 1)]  # the driver's cuLaunchKernelEx counts too
    assert ga.graph_api_sequence(phases) == ["cudaStreamBeginCapture", "cudaStreamEndCapture",
                                             "cudaGraphInstantiateWithFlags", "cudaGraphLaunch", "cudaGraphLaunch"]


def test_trace_lines_show_every_phase_and_the_graph_apis_in_order():
    text = ga.trace_lines({"module": "toy", "phases": phase_calls(synthetic_trace()), "replay_rel_err": 0.0})
    assert ("  capture   kernels run:   1   launch calls:   3 kernel (2 while capturing), 0 graph\n"
            "      cudaDeviceSynchronize, cudaLaunchKernel, cudaStreamBeginCapture, cudaLaunchKernel x2,") in text
    assert "      kernels that ran: at::native::fill_kernel\n" in text
    assert "(1 API calls the profiler could not name are left out)" in text
    assert "  replay 1  kernels run:   3   launch calls:   0 kernel, 1 graph\n      cudaGraphLaunch\n" in text
    assert max(len(line) for line in text.splitlines() if line.startswith(" " * 6)) <= 116  # long lists wrap
    assert ("graph APIs in order: cudaStreamBeginCapture -> cudaStreamEndCapture -> cudaGraphInstantiateWithFlags"
            " -> cudaGraphLaunch -> cudaGraphLaunch") in text


# ------------------------------------------------------------------------------------------------
# make_graphed_callables' missing check, and the capture counter


def test_shape_checked_refuses_another_shape_or_dtype_and_passes_the_sample_shape():
    checked = ga.shape_checked(lambda x: x * 2, (torch.zeros(8, 4),))
    assert torch.equal(checked(torch.ones(8, 4)), torch.full((8, 4), 2.0))
    with pytest.raises(ValueError, match=r"captured for \[\(\(8, 4\), 'float32'\)\], called with \[\(\(4, 4\), "):
        checked(torch.ones(4, 4))
    with pytest.raises(ValueError, match="'float64'"):
        checked(torch.ones(8, 4, dtype=torch.float64))


def test_counting_captures_counts_every_capture_begin_and_puts_the_method_back(monkeypatch):
    def fake(self, *args, **kwargs):
        return "began"

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", fake)
    with ga.counting_captures() as seen:
        assert torch.cuda.CUDAGraph.capture_begin(object(), pool=None) == "began"
        torch.cuda.CUDAGraph.capture_begin(object())
        assert seen == {"captures": 2}
    assert torch.cuda.CUDAGraph.capture_begin is fake
    with pytest.raises(KeyError), ga.counting_captures():
        raise KeyError("a failed block")
    assert torch.cuda.CUDAGraph.capture_begin is fake


# ------------------------------------------------------------------------------------------------
# compile vs capture, from the reference set's H200 benchmark files


def test_compile_vs_capture_on_the_reference_450m_run():
    res = reference.load("bench-450m")
    rows = ga.compile_vs_capture(res)
    compiled = [r for r in res["rows"] if r["mode"] == "compile"]
    graphed = {r["workload"]: r for r in res["rows"] if r["mode"] == "lab-graph"}
    assert [r["workload"] for r in rows] == [r["workload"] for r in compiled]  # the order they ran in
    for row, c in zip(rows, compiled):
        assert row["compile_first_ms"] == (c.get("first_calls_ms") or None)  # the stream has none
        assert row["compile_median_ms"] == c["median_ms"]
        assert row["new_graphs"] == c["dynamo"].get("stats.unique_graphs", 0)
        assert row["graph_median_ms"] == graphed[c["workload"]]["median_ms"]
        assert row["capture_s"] == graphed[c["workload"]]["capture_s"]
    # the structural facts the notebook states: compile compiles on the first shape and re-records
    # later ones without compiling; its first call costs seconds, the kit's capture well under that
    assert rows[0]["new_graphs"] >= 1 and all(r["recorded"] for r in rows)
    assert rows[0]["compile_first_ms"][0] > 100 * rows[0]["compile_median_ms"]
    assert rows[0]["compile_first_ms"][0] / 1e3 > rows[0]["capture_s"]
    text = ga.compile_vs_capture_lines(rows)
    firsts = sum(r["compile_first_ms"][0] for r in rows if r["compile_first_ms"]) / 1e3
    assert f"compile's first calls add up to {firsts:.1f} s" in text and f"in {rows[0]['capture_s']:.2f} s" in text
    assert all(any(line.startswith(r["workload"] + " ") for line in text.splitlines()) for r in rows)


@pytest.mark.parametrize("role", ["bench-450m", "bench-1.6b"])
def test_what_notebook_02_says_of_the_first_calls_holds_in_both_runs(role):
    """Seconds for the shapes that made new graphs, tens of ms or more for the later ones (which made
    none, and come after them), and lab-graph's first call within about a millisecond of its median."""
    rows = ga.compile_vs_capture(reference.load(role))
    s = ga.compile_vs_capture_summary(rows)
    timed = [r["workload"] for r in rows if r["compile_first_ms"]]
    assert s["new_graph_workloads"] and timed[:len(s["new_graph_workloads"])] == s["new_graph_workloads"]
    assert s["new_graph_first_min_ms"] > 1000 and s["later_workloads"] and s["later_first_two_ms"][0] > 10
    assert 0 < s["graph_excess_ms"] < 1.5
    text = ga.compile_vs_capture_lines(rows)
    assert f"took {s['new_graph_first_min_ms'] / 1e3:.1f} s or more" in text
    assert f"at most {s['graph_excess_ms']:.2f} ms above its median ({s['graph_excess_workload']})" in text


def test_compile_vs_capture_summary_on_synthetic_rows():
    def row(w, first, new, g_first, g_med):
        return {"workload": w, "compile_first_ms": first, "new_graphs": new, "graph_first_ms": g_first,
                "graph_median_ms": g_med}
    rows = [row("a", [3000.0, 40.0, 2.0], 2, 1.5, 1.0), row("b", [60.0, 30.0, 2.0], 0, 1.1, 1.0),
            row("stream", None, 0, None, 1.0)]
    s = ga.compile_vs_capture_summary(rows)
    assert s["new_graph_workloads"] == ["a"] and s["new_graph_first_min_ms"] == 3000.0
    assert s["later_workloads"] == ["b"] and s["later_first_two_ms"] == (30.0, 60.0)
    assert s["graph_excess_ms"] == pytest.approx(0.5) and s["graph_excess_workload"] == "a"
    empty = ga.compile_vs_capture_summary([])
    assert empty["later_first_two_ms"] is None and empty["graph_excess_ms"] is None


def test_compile_vs_capture_joins_another_files_lab_graph_rows():
    comp = reference.load("bench-1.6b")
    cap = {**comp, "rows": [r for r in comp["rows"] if r["workload"] != "2x512"]}  # a file without one workload
    rows = {r["workload"]: r for r in ga.compile_vs_capture(comp, cap)}
    graphed = {r["workload"]: r for r in cap["rows"] if r["mode"] == "lab-graph"}
    assert set(rows) == {r["workload"] for r in comp["rows"] if r["mode"] == "compile"}
    for w, row in rows.items():
        assert row["graph_median_ms"] == (graphed[w]["median_ms"] if w in graphed else None)
    assert rows["2x512"]["graph_median_ms"] is None
    line = next(x for x in ga.compile_vs_capture_lines(list(rows.values())).splitlines() if x.startswith("2x512 "))
    assert line.split("|")[1].split() == ["-", "-", "-"]  # the workload the capture file lacks


# ------------------------------------------------------------------------------------------------
# The command: its error without CUDA, and the file of a (faked) run


@NO_CUDA
def test_cli_without_cuda_is_one_error_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["graph-apis", "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "graph-apis: error: graph-apis needs a CUDA GPU" in err
    assert list(tmp_path.iterdir()) == []


def _fake_recorders(fail: str | None = None) -> dict:
    fakes = {
        "trace": lambda d: {"module": "toy", "replays": 2, "phases": phase_calls(synthetic_trace()),
                            "replay_rel_err": 0.0},
        "graphed_callables": lambda d: {
            "module": "toy", "captures": 2, "parity": {"forward": 0.0, "input_grad": 0.0, "weight_grad": 0.0},
            "new_shapes": [{"batch": 4, "outcome": "error", "error": "RuntimeError: size"},
                           {"batch": 1, "outcome": "wrong", "out_shape": [8, 256]}], "guard": "ValueError: captured"},
        "reduce_overhead": lambda d: {"module": "toy", "automatic_dynamic_shapes": True, "rows": [
            {"batch": 8, "first_calls_ms": [900.0, 30.0, 0.2], "steady_ms": 0.1, "captures": 1,
             "dynamo": {"stats.unique_graphs": 1}, "rel_err": 0.0}]},
        "capture_errors": lambda d: {".item()": {"captured": False, "error": "AcceleratorError: x"}},
    }
    if fail:
        def boom(d):
            raise RuntimeError("no luck")

        fakes[fail] = boom
    assert set(fakes) == set(ga.RECORDERS)
    return fakes


def _fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_a_run_writes_every_part_with_provenance_and_the_notebook_reads_it_back(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch)
    result, path = record(tmp_path, "python -m lfm2vl_lab graph-apis", recorders=_fake_recorders(fail="trace"))
    assert path.parent == tmp_path / "nvidia-h200" and path.name.startswith("graph-apis-")
    saved = json.loads(path.read_text())
    assert saved["provenance"]["gpu"] == "NVIDIA H200" and saved["provenance"]["command"] == \
        "python -m lfm2vl_lab graph-apis"
    assert saved["trace"] is None and [e["part"] for e in saved["errors"]] == ["trace"]
    assert "RuntimeError: no luck" in saved["errors"][0]["traceback"] and saved["errors"][0]["recovery"]
    assert set(saved["seconds"]) == set(ga.RECORDERS)  # the parts after a failure still ran
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # the notebook reads the file through the reference set: a manifest naming it as the graph-apis role
    (tmp_path / "nvidia-h200" / reference.MANIFEST).write_text(json.dumps(
        {"gpu": "NVIDIA H200", "code_hash": "sha256:0", "files": {ga.NAME: {"file": path.name}}}))
    errs = nb.live_or_recorded("capture_errors", "cpu", root=tmp_path)
    assert errs == {".item()": {"captured": False, "error": "AcceleratorError: x"}}
    assert capsys.readouterr().out.startswith("reference set, graph-apis: recorded on NVIDIA H200 on ")
    assert nb.live_or_recorded("trace", "cpu", root=tmp_path) is None  # that part failed


def test_the_command_prints_each_part_and_saves_the_file(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch)
    for part, fn in _fake_recorders().items():
        monkeypatch.setitem(ga.RECORDERS, part, fn)
    assert main(["graph-apis", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    saved = json.loads(next((tmp_path / "nvidia-h200").glob("graph-apis-*.json")).read_text())
    for part, fmt in FORMATTERS.items():  # the printout is the formatter's text of what was saved
        assert fmt(saved[part]) in out
    assert "batch  1: no error, but 8 rows came back: silently wrong" in out
    assert out.rstrip().splitlines()[-1].startswith("results: ")


def test_a_live_run_says_it_is_live_and_not_the_reference_set(monkeypatch, capsys):
    monkeypatch.setitem(ga.RECORDERS, "reduce_overhead", lambda device: {"rows": []})
    assert nb.live_or_recorded("reduce_overhead", "cuda") == {"rows": []}
    assert capsys.readouterr().out == ("measured now on cuda: this machine's live run, not the reference set's "
                                       "`graph-apis` file\n")


def test_without_a_reference_set_the_notebook_says_so(tmp_path, capsys):
    assert nb.live_or_recorded("trace", "cpu", root=tmp_path) is None
    assert capsys.readouterr().out.startswith("Not in the reference set: no 'graph-apis' in data/results/nvidia-h200/")


def test_the_default_results_root_is_the_repos():
    assert (RESULTS_ROOT / "nvidia-h200").is_dir()


# ------------------------------------------------------------------------------------------------
# On a GPU: the real recorders


@pytest.mark.gpu
def test_capture_trace_on_cuda_shows_capture_instantiate_and_one_launch_per_replay():
    t = ga.capture_trace("cuda", replays=3)
    assert [p["phase"] for p in t["phases"]] == ["eager", "capture", "replay 1", "replay 2", "replay 3"]
    eager, capture, *replays = t["phases"]
    assert eager["kernels"] > 0 and eager["kernel_launches"] >= eager["kernels"] and eager["graph_launches"] == 0
    order = [n for n, _ in capture["calls"] if n.startswith(GRAPH_APIS)]
    assert [next(a for a in GRAPH_APIS if n.startswith(a)) for n in order] == list(GRAPH_APIS[:3])
    # during capture the host still makes every launch call, but none of those kernels runs: the few
    # that run in the phase are torch's set-up, launched before cudaStreamBeginCapture
    assert capture["captured_launches"] >= eager["kernels"]
    assert capture["kernels"] == capture["kernel_launches"] - capture["captured_launches"] < eager["kernels"]
    for r in replays:
        assert (r["kernel_launches"], r["graph_launches"], r["kernels"]) == (0, 1, eager["kernels"])
    assert t["replay_rel_err"] <= 1e-5


@pytest.mark.gpu
def test_graphed_callable_demo_on_cuda():
    d = ga.graphed_callable_demo("cuda")
    assert d["captures"] == 2  # forward and backward
    assert max(d["parity"].values()) <= 1e-5
    outcome = {s["batch"]: s for s in d["new_shapes"]}
    assert outcome[16]["outcome"] == outcome[4]["outcome"] == "error"
    assert outcome[1]["outcome"] == "wrong" and outcome[1]["out_shape"][0] == ga.TOY_BATCH
    assert d["guard"].startswith("ValueError: captured for")


@pytest.mark.gpu
def test_reduce_overhead_demo_on_cuda_records_a_graph_per_new_shape():
    d = ga.reduce_overhead_demo("cuda")
    assert [r["batch"] for r in d["rows"]] == list(ga.COMPILE_BATCHES)
    assert d["rows"][0]["dynamo"].get("stats.unique_graphs", 0) >= 1
    assert all(r["captures"] >= 1 for r in d["rows"]) and all(r["rel_err"] <= 1e-3 for r in d["rows"])
    assert d["rows"][0]["first_calls_ms"][0] > d["rows"][0]["steady_ms"]


@pytest.mark.gpu
def test_capture_errors_on_cuda_and_the_gpu_works_afterwards(recwarn):
    errs = ga.capture_errors("cuda")
    assert not errs[".item()"]["captured"] and errs[".item()"]["error"]
    assert errs["v * 2 (no host read)"]["captured"]
    assert torch.randn(2, device="cuda").shape == (2,)
    # the copy fails before its first kernel: an empty graph, said in the result, its warning kept in
    assert errs["pageable CPU->GPU copy"]["empty_graph"] and not errs[".tolist()"]["empty_graph"]
    assert not [w for w in recwarn if "CUDA Graph is empty" in str(w.message)]


@pytest.mark.gpu
def test_the_command_on_cuda(tmp_path):
    assert main(["graph-apis", "--out", str(tmp_path)]) == 0
    saved = json.loads(next(tmp_path.rglob("graph-apis-*.json")).read_text())
    assert not saved["errors"] and all(saved[p] for p in ga.RECORDERS)
