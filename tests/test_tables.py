"""The generated tables of README.md and docs/*.md: the committed pages are what the generator writes
from the committed reference set, and the generator's pieces (markers, tables, computed sentences,
the CLI) do what a reader of those pages relies on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lfm2vl_lab.cli import cli_report
from lfm2vl_lab.cli.cli import main
from lfm2vl_lab.report import (
    tables,
    tables_encoder,
    tables_goals,
)
from lfm2vl_lab.report.frames import Refs, TableError, render
from lfm2vl_lab.report.tables import render_text, write_tables

ROOT = Path(__file__).resolve().parents[1]


def quiet(*_a, **_k):
    pass


# --------------------------------------------------------------------------------------------
# The committed pages
# --------------------------------------------------------------------------------------------

def test_committed_pages_equal_what_the_reference_set_gives():
    stale = write_tables(check=True, say=quiet)
    assert not stale, (f"stale generated tables in {[str(p) for p in stale]}: "
                       "run `python -m lfm2vl_lab report --tables-only`")


def test_every_table_the_docs_promise_is_marked_on_its_page():
    wanted = {"README.md": {"encoder-450m", "ttft-modes", "vllm-ttft"}, "docs/results.md": {"reference-set"},
              "docs/goals.md": {*tables_goals.GOALS, "misses", "pr-verdict"}, "docs/design.md": {"model-changes"},
              "docs/vllm.md": {"vllm-engines"}}
    for page, names in wanted.items():
        text = (tables.REPO_ROOT / page).read_text(encoding="utf-8")
        assert names <= {n for n, _, _ in tables.marked(text, page)}, page


def test_each_part_is_drawn_on_one_page_and_the_readme_keeps_three():
    """A fact lives once: no part is drawn twice, and the README keeps a small headline."""
    where = [(name, page.name) for page in tables.pages()
             for name, _, _ in tables.marked(page.read_text(encoding="utf-8"), str(page))]
    names = [name for name, _ in where]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert sum(page == "README.md" for _, page in where) <= 3


def test_the_pr_claim_is_judged_on_one_page_only():
    judging = {"pr-verdict"}
    where = {name: [] for name in judging}
    for page in tables.pages():
        for name, _, _ in tables.marked(page.read_text(encoding="utf-8"), str(page)):
            if name in judging:
                where[name].append(page.relative_to(tables.REPO_ROOT).as_posix())
    assert where == {name: ["docs/goals.md"] for name in judging}, where


def test_the_readme_speaks_of_itself_without_issue_numbers_or_verdicts():
    text = (tables.REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for word in ("issue #", "Issue #", "target (", "met |", "MISSED", "session"):
        assert word not in text, word


# --------------------------------------------------------------------------------------------
# Markers
# --------------------------------------------------------------------------------------------

KNOWN = {"x": lambda refs: "| a |\n|---|\n| 1 |", "y": lambda refs: "second"}


def test_render_replaces_only_what_lies_between_the_markers():
    text = "intro\n<!-- table:x -->\nold\n<!-- /table:x -->\nmiddle\n<!-- table:y -->\n<!-- /table:y -->\nend\n"
    out = render_text(text, None, known=KNOWN)
    assert out == ("intro\n<!-- table:x -->\n\n| a |\n|---|\n| 1 |\n\n<!-- /table:x -->\nmiddle\n"
                   "<!-- table:y -->\n\nsecond\n\n<!-- /table:y -->\nend\n")
    assert render_text(out, None, known=KNOWN) == out  # drawing again changes nothing


@pytest.mark.parametrize("text, says", [
    ("<!-- table:x -->\nno end", "never closed"),
    ("<!-- table:x -->\n<!-- table:y -->\n<!-- /table:y -->\n<!-- /table:x -->", "opens inside table 'x'"),
    ("text\n<!-- /table:x -->\n", "never opened"),
    ("<!-- table:nope -->\n<!-- /table:nope -->", "unknown table 'nope'"),
])
def test_broken_markers_name_the_offending_table(text, says):
    with pytest.raises(TableError, match=says):
        render_text(text, None, where="page.md", known=KNOWN)


def test_a_row_table_is_declared_by_its_columns():
    """A column is a key (dotted into nested dicts, or a DataFrame record's dotted key itself), (key, format),
    or a function of the row; a missing value stays a dash whatever the format."""
    from lfm2vl_lab.report.frames import md, ms, records

    rows = [{"a": 1.234, "side": {"b": 2.0}, "c.d": 3.0}, {"a": None, "side": {}}]
    out = md(records(rows, {"a": ("a", ms), "b": "side.b", "d": ("c.d", ms), "sum": lambda r: (r["a"] or 0) + 1}))
    assert out.splitlines()[2:] == ["| 1.23 | 2.0 | 3.00 | 2.234 |", "| – | – | – | 1 |"]


# --------------------------------------------------------------------------------------------
# Tables from a small made-up reference set
# --------------------------------------------------------------------------------------------

def bench_row(mode, workload, median, busy=None, **kw):
    return {"preset": "lfm2-vl-450m", "mode": mode, "workload": workload, "median_ms": median, "gpu_busy_ms": busy,
            "n_items": 1 if workload != "stream" else 9, "p99_ms": median * 2, "max_ms": median * 3, **kw}


PROV = {"gpu": "NVIDIA H200", "torch": "2.x", "transformers": "5.x", "date": "2030-01-02T03:04:05+00:00",
        "preset": "lfm2-vl-450m", "dtype": "bf16", "repeats": 30, "warmup": 10, "stream_n": 5}


def make_set(root, results: dict) -> Refs:
    """A reference set under ``root``: each role's result written as ``<role>-1.json`` plus the manifest."""
    folder = root / "nvidia-h200"
    folder.mkdir(parents=True)
    files = {}
    for role, res in results.items():
        (folder / f"{role}-1.json").write_text(json.dumps({"provenance": PROV, **res}))
        files[role] = {"file": f"{role}-1.json", "command": f"python -m lfm2vl_lab {role}", "part": "encoder",
                       "rc": 0, "seconds": 1.0}
    man = {"gpu": "NVIDIA H200", "code_hash": "sha256:" + "0" * 64, "command": "python -m lfm2vl_lab record",
           "started": "2030-01-02T03:00:00+00:00", "finished": "2030-01-02T03:10:00+00:00", "complete": True,
           "files": files, "failed": {}}
    (folder / "reference.json").write_text(json.dumps(man))
    return Refs(root=root)


BENCH = {"rows": [bench_row("hf-eager", "1x512", 4.0, 1.0), bench_row("compile", "1x512", 2.0, 1.1),
                  bench_row("lab-eager", "1x512", 3.0, 0.9), bench_row("lab-graph", "1x512", 1.0, 0.8,
                                                                      capture_s=0.5, graph_total_mb=100.0),
                  bench_row("hf-eager", "stream", 5.0), bench_row("compile", "stream", 4.5),
                  bench_row("lab-graph", "stream", 1.25)]}


def test_the_encoder_table_is_drawn_from_the_file(tmp_path):
    refs = make_set(tmp_path, {"bench-450m": BENCH})
    out = tables_encoder.BLOCKS["encoder-450m"](refs)
    assert "| one 512 px image | 1 | 4.00 (1.00) | 2.00 (1.10) | 3.00 (0.90) | **1.00** (0.80) | 4.0× |" in out
    # the stream is timed request by request and not profiled: its p99 stands where GPU-busy would
    assert ("| stream of 5 mixed requests (median) | 9 | 5.00 (p99 10.00) | 4.50 (p99 9.00) | – | **1.25** (p99 2.50) "
            "| 4.0× |") in out
    assert "nvidia-h200/bench-450m-1.json` (role `bench-450m`)" in out and "recorded 2030-01-02" in out


def test_a_page_goes_stale_when_its_file_changes_and_is_redrawn(tmp_path):
    refs = make_set(tmp_path / "res", {"bench-450m": BENCH})
    page = tmp_path / "page.md"
    page.write_text("# p\n\n<!-- table:encoder-450m -->\n<!-- /table:encoder-450m -->\n")
    assert write_tables([page], refs, say=quiet) == [page]
    assert write_tables([page], refs, check=True, say=quiet) == []
    path = tmp_path / "res" / "nvidia-h200" / "bench-450m-1.json"
    res = json.loads(path.read_text())
    res["rows"][3]["median_ms"] = 0.5  # a new run: lab-graph twice as fast
    path.write_text(json.dumps(res))
    before = page.read_text()
    assert write_tables([page], Refs(root=tmp_path / "res"), check=True, say=quiet) == [page]
    assert page.read_text() == before, "--check must not write"
    write_tables([page], Refs(root=tmp_path / "res"), say=quiet)
    assert "**0.50** (0.80) | 8.0×" in page.read_text()


# --------------------------------------------------------------------------------------------
# Goals
# --------------------------------------------------------------------------------------------

def test_goal_values_read_with_their_units_and_direction():
    aim = tables_goals._aim_and_value
    assert aim({"target": "450M 1x512 median ms", "value": 0.8, "limit": 0.95}) == ("≤ 0.95 ms", "0.80 ms")
    assert aim({"target": "encoder graphs' TTFT cut, text graphed", "value": 0.5, "limit": 0.35}) == ("≥ 35%", "50.0%")
    assert aim({"target": "fastest mode at tiled", "value": 1.0, "limit": 2.0, "detail": "next: compile"}) == \
        ("< the next mode's 2.00 ms (compile)", "1.00 ms")
    assert aim({"target": "450M graph MiB", "value": 377.2, "limit": 1024.0}) == ("≤ 1024 MiB", "377 MiB")
    assert aim({"target": "every mode's first tokens equal eager's", "value": False, "limit": True}) == ("all", "no")


def test_misses_list_only_missed_goals_and_say_when_none_explains_one(monkeypatch):
    goals = [{"target": "450M 1x512 median ms", "value": 0.8, "limit": 0.95, "ok": True, "detail": ""},
             {"target": "a goal nobody explains ms", "value": 2.0, "limit": 1.0, "ok": False, "detail": ""}]
    monkeypatch.setattr(tables_goals, "GOALS", {"goals-x": (lambda refs: goals, ())})
    out = tables_goals.misses_block(None)
    assert out.startswith("### a goal nobody explains ms\n") and "No explanation" in out
    assert "450M 1x512" not in out
    goals.pop()
    assert tables_goals.misses_block(None) == "Every goal is reached in this reference set."


def test_the_record_goal_sums_the_kit_s_own_steps_and_can_be_missed(tmp_path):
    """A full record's seconds are the manifest's steps of the kit's own roles (vLLM's, beside the set,
    left out): under the limit it is reached, over it it is a miss with the longest steps named."""
    # the ttft file records its engine's compile and capture, and two encoder captures, one repeated by a
    # second row; a bench-style capture_info (the per-budget split of a row's capture_s) is not counted again
    ttft = {"setup": [{"engine_capture": {"compile_s": 40.0, "capture_s": 0.5},
                       "encoder_capture": [{"capture_s": 2.0}, {"capture_s": 1.5}]}],
            "rows": [{"capture_s": 2.0, "capture_info": [{"capture_s": 1.0}]}, {"capture_s": 2.0}]}
    refs = make_set(tmp_path, {"check": {}, "ttft": ttft, "vllm": {}})
    man_path = tmp_path / "nvidia-h200" / "reference.json"
    man = json.loads(man_path.read_text())
    for role, secs in (("check", 100.0), ("ttft", 450.0), ("vllm", 5000.0)):
        man["files"][role]["seconds"] = secs
    man_path.write_text(json.dumps(man))
    (goal,) = tables_goals.record_goals(Refs(root=tmp_path))
    assert (goal["value"], goal["ok"], goal["detail"]) == (550.0, True, "2 roles")
    man["files"]["ttft"]["seconds"] = 600.0
    man_path.write_text(json.dumps(man))
    refs = Refs(root=tmp_path)
    (goal,) = tables_goals.record_goals(refs)
    assert (goal["value"], goal["ok"]) == (700.0, False)
    assert "| a full record of the kit's own roles, steps in s | ≤ 600 s | 700.00 s | **no** |" in (
        tables_goals.BLOCKS["goals-record"](refs))
    why = render(tables_goals.explain_record(refs))
    assert ("| `ttft` | 600 | 40.0 | 4.0 | 556 |\n| `check` | 100 | – | – | 100 |\n"
            "| **all** | 700 | 40 | 4 | 656 |") in why


def test_a_record_call_on_several_gpus_costs_its_span_and_the_others_their_seconds(tmp_path):
    """Two calls: one in turn (its steps' seconds summed, as before), one on two GPUs at once, which costs
    the time from its first step's start (date less seconds) to its last step's end, not its steps' sum."""
    make_set(tmp_path, {r: {} for r in ("check", "kernels", "ttft", "e2e", "engine")})
    man_path = tmp_path / "nvidia-h200" / "reference.json"
    man = json.loads(man_path.read_text())
    serial = {"call": "2030-01-01T00:00:00+00:00"}
    man["files"]["check"].update(serial, seconds=100.0, date="2030-01-01T00:01:40+00:00")
    man["files"]["kernels"].update(serial, seconds=50.0, date="2030-01-01T00:02:30+00:00")
    at_once = {"call": "2030-01-02T00:00:00+00:00", "gpus": 2}  # ttft 0-300 s on GPU 0, then engine 300-400 s
    man["files"]["ttft"].update(at_once, gpu=0, seconds=300.0, date="2030-01-02T00:05:00+00:00")
    man["files"]["e2e"].update(at_once, gpu=1, seconds=200.0, date="2030-01-02T00:04:10+00:00")  # 50-250 s
    man["files"]["engine"].update(at_once, gpu=0, seconds=100.0, date="2030-01-02T00:06:40+00:00")
    man_path.write_text(json.dumps(man))
    refs = Refs(root=tmp_path)
    (goal,) = tables_goals.record_goals(refs)
    assert (goal["value"], goal["ok"]) == (100.0 + 50.0 + 400.0, True)
    assert goal["detail"] == "5 roles; on 2 GPUs at once, 600 s of steps in 400 s"
    block = tables_goals.BLOCKS["goals-record"](refs)
    assert "| ≤ 600 s | 550.00 s | yes | 5 roles; on 2 GPUs at once, 600 s of steps in 400 s |" in block
    why = render(tables_goals.explain_record(refs))
    assert "| **all** | 750 |" in why
    for entry in man["files"].values():  # the same steps in turn: each costs its seconds
        entry.pop("gpus", None)
    man_path.write_text(json.dumps(man))
    assert tables_goals.record_goals(Refs(root=tmp_path))[0]["value"] == 750.0


class _CheckRefs:
    """A reference set that holds only a ``check`` file with the given model-change entries."""

    def __init__(self, *changes):
        self.res = {"presets": [{"preset": "lfm2-vl-450m", "model_changes": c} for c in changes]}

    def __call__(self, role):
        assert role == "check"
        return self.res


def test_the_pointer_check_goal_is_judged_by_its_run():
    assert tables_goals._aim_and_value({"target": "450M pointer check per encode µs", "value": None, "limit": 2.0}) \
        == ("≤ 2 µs", "not measured")
    target = {"target": "450M pointer check per encode µs", "limit": 2.0, "value": 6.1, "ok": False, "detail": ""}
    new = {"stamp_check": "every pointer", "encode_stamp_us": 6.1, "stamped_tensors": 203, "serial_us": 0.3,
           "targets": [target]}
    assert tables_goals.GOALS["goals-guard"][0](_CheckRefs(new)) == [target]
    assert tables_goals._aim_and_value(target) == ("≤ 2 µs", "6.10 µs")


def test_model_changes_say_which_pointer_check_they_timed():
    row = {"change": "to(float16)", "recaptures": 1, "rel_err": 1e-3, "hf_rel_err": 1e-3, "pass": True}
    moved = {"changes": [row], "stamp_check": "every pointer", "pointer_check": "torch", "encode_stamp_us": 14.3,
             "engine_stamp_us": 15.0, "stamped_tensors": 203, "serial_us": 0.3,
             "fused_qkv": {"freed_mib": 0.0, "kept_mib": 40.0, "qkv_mib": 40.0}}
    changes, costs = tables_encoder.model_changes(_CheckRefs(moved))
    assert list(changes.iloc[0]) == ["LFM2-VL-450M", "`to(float16)`", 1, "1.00e-03 (1.00e-03)", "pass"]
    assert list(costs.iloc[0])[:5] == ["LFM2-VL-450M", "every pointer, torch's function", 203, "14.30", None]
    fast = {**moved, "pointer_check": "extension", "encode_stamp_us": 1.2,
            "pointer_checks": {"torch": {"encode_us": 14.3}, "extension": {"encode_us": 1.2}}}
    (_, costs) = tables_encoder.model_changes(_CheckRefs(fast))
    assert list(costs.iloc[0])[1:5] == ["every pointer, the kit's C++ check", 203, "1.20", "14.30"]


def test_every_goal_a_judge_can_miss_has_an_explanation_or_is_named():
    assert tables_goals.explainer("encode() CPU input / GPU input, 4x512") is tables_goals.explain_cpu_input
    one_image = tables_goals.graphed_call("bench-450m", "1x512")  # one section for the goals of one call
    assert tables_goals.explainer("1x512 wall / GPU-busy") is one_image
    assert tables_goals.explainer("450M 1x512 median ms") is one_image
    assert tables_goals.explainer(f"{tables_goals.KERNELS}450M 1x512 GPU-busy ms") is one_image
    for engine_goal in ("decode ms per token, lfm2-vl-450m engine-fused", "prefill+sample ms, lfm2-vl-450m engine",
                        "TTFT ms, both graphed"):
        assert tables_goals.explainer(engine_goal) is tables_goals.explain_text_engine
    assert tables_goals.explainer("the PR's budget set captures in s, lfm2-vl-3b") is tables_goals.explain_pr_capture
    assert tables_goals.explainer("something new") is None
    assert tables_goals.explainer("450M 1x256 median ms") is not None


def test_a_capture_goal_shows_the_compile_before_the_capture():
    """The engine's goals, as the goals page shows them, name the first compile before a capture."""
    from lfm2vl_lab.measure.engine_measure import judge_engine

    rows = [{"preset": "lfm2-vl-450m", "mode": m, "requests": 1, "prefill_sample_ms": 1.0, "decode_ms_per_token": 0.3,
             "first_call": {"compile_s": c, "capture_s": 0.1}} for m, c in (("engine", 0.0), ("engine-fused", 27.46))]
    assert [t["detail"] for t in judge_engine(rows) if t["target"].startswith("capture s")] == \
        ["", "after a 27.5 s first compile"]


def test_the_pr_budget_set_is_held_to_the_kit_s_one_capture_limit():
    from lfm2vl_lab.measure import floor, request

    assert request.TARGETS["pr_capture_s"] == floor.TARGETS["capture_s"]
    older = {"targets": [{"target": "the PR's budget set captures in s, lfm2-vl-3b", "value": 3.7, "limit": 5.0,
                          "ok": True, "detail": ""}]}
    (t,) = request.goals_of(older)
    assert (t["limit"], t["ok"], t["recorded_limit"]) == (floor.TARGETS["capture_s"], False, 5.0)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------

def test_check_without_a_reference_set_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", "--check", "--root", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m lfm2vl_lab report: error:") and "reference.json" in err


def test_plain_report_of_other_results_leaves_the_pages_alone(tmp_path, capsys):
    """The pages describe the repo's reference set: a report of other results draws figures only."""
    args = argparse.Namespace(root=str(tmp_path), check=False, tables_only=False)
    assert cli_report.run_tables(args) == 0
    assert "not the repo's data/results; the pages' tables are left as they are" in capsys.readouterr().out


def test_the_code_goals_are_measured_from_this_tree_and_can_be_missed(monkeypatch):
    from lfm2vl_lab.core.protocol import protocol_members

    files = sorted((ROOT / "lfm2vl_lab" / "report").glob("*.py"))
    lines = sum(p.read_text(encoding="utf-8").count("\n") for p in files)
    layer, protocol = tables_goals.code_goals()
    assert (layer["value"], layer["ok"], layer["detail"]) == (lines, lines <= 1750, f"{len(files)} modules")
    assert (protocol["value"], protocol["ok"]) == (len(protocol_members()), len(protocol_members()) <= 12)
    monkeypatch.setattr(tables_goals, "REPORT_LIMIT_LINES", lines - 1)
    assert not tables_goals.code_goals()[0]["ok"]
    monkeypatch.setattr(tables_goals, "REPORT_LIMIT_LINES", lines)
    assert tables_goals.code_goals()[0]["ok"]
    assert tables_goals._aim_and_value(dict(layer, value=4296, limit=1750)) == ("≤ 1,750", "4,296")
    assert tables_goals.explainer(layer["target"]) is tables_goals.explain_report_layer



def test_the_report_layer_s_miss_does_its_arithmetic_on_the_modules_it_reads(monkeypatch):
    mods = {f"m{i}.py": "x = 1\n" * i for i in range(1, 11)}  # m10.py has 10 lines, m1.py 1
    monkeypatch.setattr(tables_goals, "_modules", lambda: mods)
    why = render(tables_goals.explain_report_layer())
    assert why.splitlines()[2:4] == ["| `m10.py` | 10 |", "| `m9.py` | 9 |"]
    assert why.splitlines()[-1] == "| the other 2 | 3 |"  # m2.py and m1.py


def test_every_miss_of_the_reference_set_is_explained():
    """A missed goal stays on docs/goals.md with what explains it: no miss of the committed set falls
    back to "no explanation"."""
    out = tables_goals.misses_block(Refs())
    assert out.count("### ") >= 1 and "No explanation is generated" not in out


def test_the_kernel_goals_are_judged_from_the_set_s_rows_and_explained(monkeypatch):
    from lfm2vl_lab.report.tables_encoder import by_mode

    refs = Refs()
    judged = {t["target"]: t for t in tables_goals.kernel_goals(refs)}
    for name, role, workload, field, limit in tables_goals.KERNEL_GOALS:
        row = by_mode(refs(role)["rows"])[("lab-graph", workload)]
        assert (judged[name]["value"], judged[name]["ok"]) == (row[field], row[field] <= limit)
    grid = next(r["decode_ms_per_token"] for r in refs("ttft")["rows"] if (r["preset"], r["image"], r["requests"],
                r["mode"]) == ("lfm2-vl-450m", "1x512", 1, "text-graphed+encoder-graphed"))
    eng = next(r["decode_ms_per_token"] for r in refs("engine")["rows"]
               if (r["preset"], r["mode"], r.get("requests")) == ("lfm2-vl-450m", "engine-fused", 1))
    decode = judged[f"{tables_goals.KERNELS}450M decode per token in the TTFT grid / the engine's"]
    assert decode["value"] == grid / eng and decode["ok"] == (grid / eng <= tables_goals.DECODE_MATCH)
    why = render(tables_goals.graphed_call("bench-450m", "1x512")(refs))
    one = by_mode(refs("bench-450m")["rows"])[("lab-graph", "1x512")]
    assert (f"| its {one['kernels']:.0f} kernels in {one['graph_launches']:.0f} graph launches (GPU-busy of one "
            f"profiled call) | {1000 * one['gpu_busy_ms']:.0f} µs |") in why
    loose = tuple((n, r, w, f, 1e9) for n, r, w, f, _ in tables_goals.KERNEL_GOALS)
    monkeypatch.setattr(tables_goals, "KERNEL_GOALS", loose)
    assert all(t["ok"] for t in tables_goals.kernel_goals(refs)[:-1])  # the same rows under a loose limit: reached
    assert tables_goals.explainer(f"{tables_goals.KERNELS}450M 16x512 median ms") is tables_goals.graphed_call(
        "bench-450m", "16x512")
