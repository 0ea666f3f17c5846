"""The bench CLI end to end on the tiny preset (CPU), result files, and the report figures."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lfm2vl_lab.cli.cli import SUBCOMMANDS, main
from lfm2vl_lab.measure.bench import run_bench
from lfm2vl_lab.measure.results import gpu_slug, load_results, save_result
from lfm2vl_lab.measure.table import format_table
from lfm2vl_lab.measure.timing import summarize
from lfm2vl_lab.measure.workloads import expand_workloads
from lfm2vl_lab.report.figure_source import read_sources

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"
PROVENANCE_KEYS = {"gpu", "torch", "transformers", "python", "date", "command", "host_cpu", "dtype", "preset"}
ROW_KEYS = {"preset", "mode", "workload", "median_ms", "p90_ms", "p99_ms", "gpu_busy_ms", "kernels",
            "n_items", "tokens", "speedup_vs_hf", "pct_of_floor", "device", "dtype"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU defaults and labels")
def test_cli_bench_writes_result_json(tmp_path):
    cmd = [sys.executable, "-m", "lfm2vl_lab", "bench", "--preset", "tiny", "--mode", "lab-eager,hf-eager",
           "--workload", "1x256", "--repeats", "2", "--warmup", "1", "--out", str(tmp_path),
           "--figure", str(tmp_path / "fig.png")]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list((tmp_path / "cpu").glob("bench-*.json"))
    assert len(files) == 1
    assert f"results: {files[0]}" in proc.stdout
    assert "lab-eager" in proc.stdout and "median ms" in proc.stdout  # the table
    # a CPU table says what its timings are not, and shows no speedup
    assert "CPU timings do not measure LFM2-VL" in proc.stdout
    (head,) = [line for line in proc.stdout.splitlines() if "median ms" in line]
    assert "speedup" not in head and "err vs hf" in head
    assert (tmp_path / "fig.png").stat().st_size > 1000 and f"figure: {tmp_path / 'fig.png'}" in proc.stdout

    res = json.loads(files[0].read_text())
    prov = res["provenance"]
    # the figure names the file it is drawn from, which is in no reference set
    assert read_sources(tmp_path / "fig.png") == [{"file": files[0].name, "role": None,
                                                    "code_hash": prov["code_hash"]}]
    assert PROVENANCE_KEYS <= set(prov)
    assert prov["gpu"] == "cpu" and prov["preset"] == "tiny" and prov["dtype"] == "float32"
    assert prov["torch"] == torch.__version__
    assert "bench --preset tiny" in prov["command"]
    assert res["errors"] == [] and res["skipped"] == [] and res["complete"] is True

    rows = res["rows"]
    assert sorted(r["mode"] for r in rows) == ["hf-eager", "lab-eager"]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert (r["preset"], r["workload"], r["device"]) == ("tiny", "1x256", "cpu")
        assert r["repeats"] == 2
        assert 0 < r["median_ms"] <= r["p90_ms"] <= r["p99_ms"] < 60_000
        # A 256 px image: one item of 16x16 patches → 64 tokens after the 2x2 pixel-unshuffle.
        assert (r["n_images"], r["n_items"], r["tokens"], r["patch_rows"]) == (1, 1, 64, 256)
        assert r["gpu_busy_ms"] is None  # not profiled
        assert r["max_rel_err_vs_hf"] < 1e-4  # the modes compute the same features
    by = {r["mode"]: r for r in rows}
    assert by["hf-eager"]["speedup_vs_hf"] == pytest.approx(1.0)
    assert by["lab-eager"]["speedup_vs_hf"] == pytest.approx(by["hf-eager"]["median_ms"] / by["lab-eager"]["median_ms"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="graph modes run on CUDA")
def test_graph_modes_skipped_on_cpu_and_profile_rows():
    res = run_bench(preset="tiny", modes=["lab-graph", "lab-eager", "compile"], workloads=["1x256"], repeats=2,
                    warmup=0, profile=True, progress=False, command="test")
    assert [s["mode"] for s in res["skipped"]] == ["lab-graph", "compile"]
    assert all("CUDA" in s["reason"] for s in res["skipped"])
    (row,) = res["rows"]
    assert row["mode"] == "lab-eager" and row["device"] == "cpu"
    assert row["kernels"] == 0 and row["gpu_busy_ms"] is None and row["pct_of_floor"] is None
    assert row["profile_wall_ms"] > 0 and row["timeline"]["cpu"] and row["timeline"]["gpu"] == []
    assert row["speedup_vs_hf"] is None  # no hf-eager row to compare with
    table = format_table(res)
    assert "skipped lab-graph" in table and "skipped compile" in table


def test_cpu_rows_get_no_speedup_and_a_note_saying_why():
    row = {"mode": "lab-eager", "workload": "1x512", "n_items": 1, "preset": "tiny", "median_ms": 2.0,
           "p90_ms": 2.5, "p99_ms": 3.0, "speedup_vs_hf": 4.0, "max_rel_err_vs_hf": 0.0}
    cpu, gpu = dict(row, device="cpu"), dict(row, device="cuda", preset="lfm2-vl-450m")
    lines = format_table([cpu]).splitlines()
    assert lines[0].startswith("CPU timings do not measure LFM2-VL: these rows (preset tiny)")
    (head,) = [line for line in lines if line.startswith("mode ")]
    assert "speedup" not in head and "4.00x" not in "\n".join(lines)
    gpu_table = format_table([gpu])
    assert gpu_table.startswith("mode ") and "speedup" in gpu_table and "4.00x" in gpu_table
    assert "CPU timings" not in gpu_table
    # a table of both keeps the column for the GPU row only
    mixed = format_table([gpu, cpu])
    assert "CPU timings do not measure LFM2-VL" in mixed and mixed.count("4.00x") == 1


def test_expand_workloads():
    assert expand_workloads("1..16x512") == ["1x512", "2x512", "4x512", "8x512", "16x512"]
    assert expand_workloads(["1..16"]) == expand_workloads("1..16x512")
    assert expand_workloads("1..3x256,tiled") == ["1x256", "2x256", "3x256", "tiled"]
    assert expand_workloads(["4x512", "stream", "4x512"]) == ["4x512", "stream"]
    for bad in ("big", "0..4x512", "4..2"):
        with pytest.raises(ValueError):
            expand_workloads(bad)


def test_summarize():
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert s["median_ms"] == 2.5 and s["min_ms"] == 1.0 and s["max_ms"] == 4.0 and s["mean_ms"] == 2.5
    assert s["p90_ms"] == pytest.approx(3.7)
    assert summarize([])["median_ms"] is None


def test_save_and_load_results(tmp_path):
    res = {"name": "x", "provenance": {"gpu": "NVIDIA H200", "date": "2026-11-01T12:00:00+00:00"},
           "rows": [{"mode": "a"}]}
    assert gpu_slug("NVIDIA H200") == "nvidia-h200" and gpu_slug("cpu") == "cpu"
    p1 = save_result(res, tmp_path)
    p2 = save_result(res, tmp_path)  # same timestamp: a new file, never an overwrite
    assert p1 == tmp_path / "nvidia-h200" / "x-20261101-120000.json" and p2 != p1 and p2.exists()
    (tmp_path / "not-a-result.json").write_text('{"traceEvents": []}')
    loaded = load_results(tmp_path)
    assert len(loaded) == 2 and loaded[0]["rows"] == [{"mode": "a"}] and "_path" in loaded[0]


def reference_set(root: Path, gpu: str, results: dict[str, dict]) -> dict[str, Path]:
    """A reference set under ``root`` as ``python -m lfm2vl_lab record`` leaves it: each result saved as
    ``<role>-<date>.json`` and a manifest naming them. Returns the files by role."""
    paths = {role: save_result(res, root, name=role) for role, res in results.items()}
    folder = root / gpu_slug(gpu)
    (folder / "reference.json").write_text(json.dumps({
        "gpu": gpu, "code_hash": "sha256:" + "0" * 64, "started": "2026-11-01T00:00:00+00:00",
        "finished": "2026-11-01T01:00:00+00:00", "files": {role: {"file": p.name} for role, p in paths.items()}}))
    return paths


def fixture_result() -> dict:
    return json.loads((FIX / "results" / "nvidia-h200" / "fixture-20261101-120000.json").read_text())


def test_report_draws_pngs_from_fixture(tmp_path, capsys):
    manifest = json.loads((FIX / "results" / "nvidia-h200" / "reference.json").read_text())
    assert main(["report", "--root", str(FIX / "results"), "--out", str(tmp_path)]) == 0
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    kinds = ["latency", "timeline"]
    assert pngs == [f"nvidia-h200-lfm2-vl-450m-bfloat16-{k}.png" for k in kinds]
    for p in tmp_path.glob("*.png"):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        # each names its file of the set, with the role and the manifest's code hash
        assert read_sources(p) == [{"file": "fixture-20261101-120000.json", "role": "bench-450m",
                                    "code_hash": manifest["code_hash"]}], p.name


def test_report_draws_each_figure_from_its_reference_file_only(tmp_path):
    """Another run of the same preset beside the reference set (newer, other numbers) and one in
    archive/ change no figure: each is drawn from the file the manifest names for its role."""
    from lfm2vl_lab.report.report import figure_jobs, reference_sets, report

    ref = fixture_result()
    other = copy.deepcopy(ref)
    other["provenance"]["date"] = "2026-12-24T12:00:00+00:00"
    for r in other["rows"]:
        r["median_ms"] *= 3  # a slower run: any of its rows in a figure would show
    alone = reference_set(tmp_path / "alone", "NVIDIA H200", {"bench-450m": ref})
    reference_set(tmp_path / "crowded", "NVIDIA H200", {"bench-450m": ref})
    save_result(other, tmp_path / "crowded", name="bench-450m")
    save_result(other, tmp_path / "crowded" / "nvidia-h200" / "archive", name="bench-450m")
    (files,) = reference_sets(tmp_path / "crowded").values()
    jobs = figure_jobs(files, "nvidia-h200")
    assert jobs and all([Path(f["_path"]).name for f in used] == [alone["bench-450m"].name] for _, _, used in jobs)
    latency = next(draw for stem, draw, _ in jobs if stem.endswith("-latency"))()
    heights = sorted(round(b.get_height(), 6) for b in latency.axes[0].patches if b.get_height() > 0)
    shown = [r for r in ref["rows"] if r.get("budget_set") in (None, "auto")]  # the default of each bar
    assert len(shown) == len({(r["mode"], r["workload"]) for r in ref["rows"]})
    assert heights == sorted(round(r["median_ms"], 6) for r in shown)
    assert alone["bench-450m"].name in latency.get_suptitle() and "2026-11-01" in latency.get_suptitle()
    drawn = {name: [p.read_bytes() for p in report(tmp_path / name, tmp_path / f"figs-{name}", verbose=False)]
             for name in ("alone", "crowded")}
    assert len(drawn["alone"]) == 2 and drawn["crowded"] == drawn["alone"]
    # the other run as the reference: other figures (the test can tell them apart)
    reference_set(tmp_path / "other", "NVIDIA H200", {"bench-450m": other})
    assert [p.read_bytes() for p in report(tmp_path / "other", tmp_path / "figs-other", verbose=False)] != \
        drawn["alone"]


def test_report_reads_no_file_outside_the_reference_set(tmp_path, capsys):
    save_result(fixture_result(), tmp_path / "results")  # a result file, but no reference.json
    assert main(["report", "--root", str(tmp_path / "results"), "--out", str(tmp_path / "figs")]) == 1
    assert "no reference set under" in capsys.readouterr().out and not list(tmp_path.glob("figs/*.png"))


def test_report_skips_figures_without_data(tmp_path, capsys):
    # A CPU result: latency only (no profiler floor, no graphs, one NxS workload).
    res = fixture_result()
    res["provenance"]["gpu"] = "cpu"
    res["rows"] = [dict(r, gpu_busy_ms=None, timeline=None, capture_info=None, padding_waste=None)
                   for r in res["rows"]
                   if r["mode"] in ("hf-eager", "lab-eager") and r["workload"] in ("1x512", "tiled")]
    reference_set(tmp_path / "results", "cpu", {"bench-450m": res})
    assert main(["report", "--root", str(tmp_path / "results"), "--out", str(tmp_path / "figs")]) == 0
    assert [p.name for p in (tmp_path / "figs").glob("*.png")] == ["cpu-lfm2-vl-450m-bfloat16-latency.png"]
    out = capsys.readouterr().out
    assert "skip cpu-lfm2-vl-450m-bfloat16-timeline:" in out
    assert main(["report", "--root", str(tmp_path / "empty"), "--out", str(tmp_path / "figs2")]) == 1


def test_subcommand_table_is_extensible():
    assert {"bench", "report"} <= set(SUBCOMMANDS)
    assert all(callable(a) and callable(r) for a, r in SUBCOMMANDS.values())


def test_run_bench_checkpoints_after_each_mode(tmp_path):
    snapshots, paths = [], []

    def on_job(partial):
        snapshots.append((partial["complete"], sorted({r["mode"] for r in partial["rows"]})))
        paths.append(save_result(partial, tmp_path, "bench", paths[-1] if paths else None))

    res = run_bench(preset="tiny", modes=("hf-eager", "lab-eager"), workloads=("1x256",), repeats=1, warmup=0,
                    device="cpu", progress=False, on_job=on_job)
    # a run killed after its first mode leaves that mode's rows, marked incomplete
    assert snapshots == [(False, ["hf-eager"]), (False, ["hf-eager", "lab-eager"])]
    assert res["complete"] is True
    assert len(set(paths)) == 1 and list((tmp_path / "cpu").glob("*.json")) == [paths[0]]
    on_disk = json.loads(paths[0].read_text())
    assert on_disk["complete"] is False and len(on_disk["rows"]) == 2  # the last checkpoint, before the end


def test_figures_pick_the_default_config_over_experiments():
    from lfm2vl_lab.report.frames import MixedRuns, pick_rows
    from lfm2vl_lab.report.plots import latency_figure

    base = {"mode": "lab-graph", "workload": "1x512", "budget_set": "auto", "cu_rule": "safe",
            "max_seqlen_mode": "tight", "attention": "varlen", "fuse_qkv": True, "fuse_elementwise": True,
            "dense_graphs": True}
    rows = [dict(base, median_ms=1.4, gpu_busy_ms=1.1),
            dict(base, median_ms=1.1, gpu_busy_ms=0.9, dense_graphs=False),  # later, profiled, faster
            dict(base, median_ms=1.2, gpu_busy_ms=1.0, fuse_qkv=False),
            dict(base, median_ms=1.3, gpu_busy_ms=1.0, attention="sdpa_blockmask")]
    assert [r["median_ms"] for r in pick_rows(rows)] == [1.4]  # the default row, though slower and first
    # no default row: the default graph settings and attention (a file from before the kernel options)
    assert [r["median_ms"] for r in pick_rows([rows[3], rows[1]])] == [1.1]
    old = {k: v for k, v in base.items() if k not in ("fuse_qkv", "fuse_elementwise", "dense_graphs")}
    assert [r["median_ms"] for r in pick_rows([dict(old, median_ms=2.0, budget_set="256,1024"),
                                               dict(old, median_ms=2.5)])] == [2.5]
    with pytest.raises(MixedRuns):  # two of those, and neither the default: which one is the figure's?
        pick_rows(rows[1:])
    # the default rows of two files for one bar: refused, never a pick across runs
    with pytest.raises(MixedRuns, match=r"\('lab-graph', '1x512'\).*more than one run"):
        latency_figure(rows + [dict(base, median_ms=0.9, gpu_busy_ms=0.8)])


def test_timeline_figure_says_what_each_colour_is():
    from lfm2vl_lab.report.plots import TIMELINE_LABELS, timeline_figure

    tl = {"cpu": [(0, 5, "cudaLaunchKernel"), (6, 2, "cudaStreamSynchronize")], "gpu": [(3, 4, "gemm")]}
    labels = [t.get_text() for t in timeline_figure({"eager": tl}).legends[0].get_texts()]
    assert labels == [TIMELINE_LABELS[k] for k in ("launch", "other", "gpu")]
    only_graph = {"cpu": [(0, 5, "cudaGraphLaunch")], "gpu": [(3, 4, "gemm")]}
    assert len(timeline_figure({"graph": only_graph}).legends[0].get_texts()) == 2  # no grey: no entry


def _git_ignored(paths: list[str]) -> set[str]:
    proc = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, input="\n".join(paths), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode in (0, 1), proc.stderr  # 1: none ignored; 128: not a git checkout / error
    return set(proc.stdout.split())


@pytest.mark.skipif(subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode != 0,
                    reason="needs the git checkout")
def test_cpu_runs_leave_the_tree_clean(tmp_path):
    """What bench / e2e / report write for a CPU run, at the names they give it, is ignored by git;
    the GPU record (the same kinds of files for a GPU) is not."""
    from lfm2vl_lab.report.report import report

    res = fixture_result()
    res["provenance"]["gpu"] = "cpu"
    e2e = {"name": "e2e", "provenance": dict(res["provenance"]),
           "rows": [{"preset": "tiny", "image": "1x512", "requests": 1, "mode": m, "ttft_ms": 9.0, "encoder_ms": 5.0}
                    for m in ("hf-eager", "lab-eager")]}
    written = [save_result(r, tmp_path / "results") for r in (res, e2e)]
    reference_set(tmp_path / "results", "cpu", {"bench-450m": res, "e2e": e2e})
    figures = report(tmp_path / "results", tmp_path / "figures", verbose=False)
    assert figures  # a latency figure at least
    cpu = [f"data/results/{p.relative_to(tmp_path / 'results')}" for p in written] + \
          [f"data/figures/{p.name}" for p in figures] + ["data/figures/last-bench-cpu.png"]  # bench's own figure
    assert _git_ignored(cpu) == set(cpu)
    gpu = [p.replace("cpu", "nvidia-h200") for p in cpu if "last-bench" not in p]
    assert _git_ignored(gpu) == set()


def test_report_defaults_are_the_repo_folders():
    from lfm2vl_lab.cli.cli import build_parser

    args = build_parser().parse_args(["report"])
    assert Path(args.root) == ROOT / "data" / "results" and Path(args.out) == ROOT / "data" / "figures"
