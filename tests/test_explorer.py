"""The budget explorer (lfm2vl_lab/report/explorer.py, notebook 03): its arithmetic is the manager's
planner, its memory is what the reference set recorded (or "not recorded"), and its widget re-renders
when the item limit moves."""

from __future__ import annotations

import html
import json

import pytest

from lfm2vl_lab.core.config import EncoderGraphConfig
from lfm2vl_lab.core.dense import DenseGraphConfig
from lfm2vl_lab.core.plan import plan_config, plan_stats
from lfm2vl_lab.report import explorer as ex
from lfm2vl_lab.report import reference

# A stream checked by hand, budgets [64, 128, 256, 512], max items 4, no run budget:
#   [200, 100] -> one 300-token batch in the 512 graph (212 padded); [72] -> 128 (56 padded);
#   [600]      -> larger than every budget: eager, a miss;  [64, 64] -> 128 in two items (0 padded).
STREAM = [[200, 100], [72], [600], [64, 64]]
BUDGETS = [64, 128, 256, 512]
EMPTY = {"by_budget": {}, "label": None, "budgets": [], "run_budget": None}


def test_one_request_per_call_by_hand():
    res = ex.explore(BUDGETS, 4, STREAM, per_call=1, max_run_items=0, memory=EMPTY)
    assert (res["replays"], res["real"], res["padded"], res["misses"]) == (3, 500, 268, 1)
    assert res["replays_per_budget"] == {128: 2, 512: 1}
    assert res["waste"] == pytest.approx(268 / 500)
    assert (res["requests"], res["items"], res["tokens"], res["calls"]) == (4, 6, 1100, 4)
    config = EncoderGraphConfig.build(out_hidden_size=1, budgets=BUDGETS, max_items=4)
    assert {k: res[k] for k in ("replays", "real", "padded", "waste")} == \
        {k: v for k, v in plan_stats(STREAM, config).items() if k != "eager_items"}


def test_the_whole_stream_in_one_call_by_hand():
    # one call: 600 eager; 200, 100, 72, 64 fill the 4-item limit (436 tokens -> 512); 64 -> 64
    res = ex.explore(BUDGETS, 4, STREAM, per_call=4, max_run_items=0, memory=EMPTY)
    assert (res["calls"], res["replays"], res["padded"], res["misses"]) == (1, 2, 76, 1)
    assert res["replays_per_budget"] == {64: 1, 512: 1}
    # a smaller item limit cuts the batches elsewhere, and the waste moves
    two = ex.explore(BUDGETS, 2, STREAM, per_call=4, max_run_items=0, memory=EMPTY)
    # 600 eager; [200, 100] -> 512 (212 padded); [72, 64] -> 256 (120 padded); [64] -> 64
    assert two["replays_per_budget"] == {64: 1, 256: 1, 512: 1} and two["padded"] == 212 + 120


def test_an_item_over_the_largest_budget_is_a_miss_and_not_replayed():
    res = ex.explore([64, 128], 2, [[129], [64]], max_run_items=0, memory=EMPTY)
    assert res["misses"] == 1 and res["replays"] == 1 and res["replays_per_budget"] == {64: 1}
    assert "1 miss (items over 128 tokens, run eagerly)" in ex.explore_text(res)


def test_runs_of_full_length_items_use_the_run_budget_and_pad_nothing():
    res = ex.explore([64, 128, 256, 512, 1024], 16, [[256] * 9], memory=EMPTY)
    assert res["run_budget"] == 2048 and res["replays_per_budget"] == {256: 1, 2048: 1}
    assert res["padded"] == 0


@pytest.mark.parametrize("budgets,max_items", [([64, 2048], 2), ([64, 256, 512, 1024, 2048, 4096], 4)])
def test_every_planned_batch_has_a_graph_when_no_run_budget_exists(budgets, max_items):
    # Without a run budget, a run of tiles must still respect the item limit: no graph has more slots.
    config = DenseGraphConfig.build(out_hidden_size=1, budgets=budgets, max_items=max_items, max_run_items=8)
    tokens = [256] * 8 + [100, 72]
    batches, eager = plan_config(tokens, config)
    assert eager == [] and all(len(b) <= max_items for b in batches)
    assert all(config.budget_for(sum(tokens[i] for i in b), len(b)) is not None for b in batches)


def _fake_reference_set(root, regular, capture):
    folder = root / "nvidia-h200"
    folder.mkdir(parents=True)
    rows = [{"mode": "lab-eager", "workload": "1x512"},
            {"mode": "lab-graph", "workload": "1x512", "budgets": regular, "max_items": 2, "capture_info": capture}]
    (folder / "bench-450m-x.json").write_text(json.dumps(
        {"provenance": {"gpu": "NVIDIA H200", "date": "2030-01-02T03:04:05+00:00"}, "rows": rows}))
    (folder / reference.MANIFEST).write_text(json.dumps({"files": {"bench-450m": {"file": "bench-450m-x.json"}}}))


def _row(budget, pool, buffers):
    return {"budget": budget, "pool_mb": pool, "buffers_mb": buffers, "total_mb": pool + buffers}


def test_memory_comes_from_the_reference_set_and_unknown_budgets_are_not_recorded(tmp_path):
    _fake_reference_set(tmp_path, [64, 128], [_row(512, 30.0, 2.0), _row(128, 5.0, 1.0), _row(64, 0.0, 0.5)])
    mem = ex.recorded_memory(root=tmp_path)
    assert mem["budgets"] == [64, 128] and mem["run_budget"] == 512 and mem["total_mb"] == 38.5
    assert "bench-450m-x.json" in mem["label"] and "2030-01-02" in mem["label"]
    res = ex.explore([64, 128, 256], 2, [[100]], max_run_items=0, root=tmp_path)
    assert res["memory"][64]["total_mb"] == 0.5 and res["memory"][128]["total_mb"] == 6.0
    assert res["memory"][256] == ex.NOT_RECORDED
    text = ex.explore_text(res)
    assert "256" in text and ex.NOT_RECORDED in text and "a different configuration" in text
    # 512 was recorded as the run budget: as a regular budget it is another set of graphs
    assert ex.explore([64, 512], 2, [[100]], max_run_items=0, root=tmp_path)["memory"][512] == ex.NOT_RECORDED


def test_the_recorded_set_itself_adds_up_to_its_total(tmp_path):
    _fake_reference_set(tmp_path, [64, 128], [_row(128, 5.0, 1.0), _row(64, 0.0, 1.0)])
    res = ex.explore([64, 128], 2, [[100]], max_run_items=0, root=tmp_path)
    text = ex.explore_text(res)
    assert "7 MiB in all" in text and "a different configuration" not in text


def test_no_reference_set_says_not_recorded(tmp_path):
    res = ex.explore([64, 128], 2, [[100]], root=tmp_path)
    assert set(res["memory"].values()) == {ex.NOT_RECORDED}
    assert "graph memory: not recorded" in ex.explore_text(res)


@pytest.mark.parametrize("text,expected", [("64, 128 256", [64, 128, 256]), ("[1024]", [1024]),
                                           ("512;64", [64, 512])])
def test_parse_budgets(text, expected):
    assert ex.parse_budgets(text) == expected


@pytest.mark.parametrize("text,match", [("64, x", "'x' in '64, x' is not a budget"), ("", "no budgets"),
                                        ("64, 64", "duplicates"), ("0, 64", "positive"), ("-64", "'-64'")])
def test_bad_budgets_are_one_clear_error(text, match):
    with pytest.raises(ValueError, match=match):
        ex.parse_budgets(text)


def test_bad_per_call_and_max_items_are_clear_errors():
    with pytest.raises(ValueError, match="per_call must be a positive int"):
        ex.explore(BUDGETS, 4, STREAM, per_call=0, memory=EMPTY)
    with pytest.raises(ValueError, match="max_items=100 breaks the invariant"):
        ex.explore(BUDGETS, 100, STREAM, memory=EMPTY)


def test_stream_tokens_are_the_bench_stream_through_the_processor():
    from lfm2vl_lab import process_images, synthetic_workload
    from lfm2vl_lab.core.packing import tokens_for

    got = ex.stream_tokens(3)
    want = [[tokens_for(tuple(s)) for s in process_images([r.image()], ex.STREAM_PRESET)["spatial_shapes"].tolist()]
            for r in synthetic_workload(3, 0)]
    assert got == want and len(got) == 3
    got[0].append(1)  # a caller's edits never reach the cache
    assert ex.stream_tokens(3) == want


def test_one_request_per_call_predicts_the_recorded_bench_stream():
    # The reference set's 450M bench served this stream one request per call through the captured
    # graphs; the host-side plan must say what its counters said.
    bench = reference.load("bench-450m", required=False)
    row = next((r for r in (bench or {}).get("rows", []) if r["mode"] == "lab-graph" and r["workload"] == "stream"),
               None)
    if row is None:
        pytest.skip("the reference set has no bench-450m stream row")
    res = ex.explore(row["budgets"], row["max_items"], ex.stream_tokens(row["n_images"]), per_call=1)
    assert res["items"] == row["n_items"] and res["tokens"] == row["tokens"]
    assert res["waste"] == pytest.approx(row["padding_waste"])
    assert {str(b): n for b, n in res["replays_per_budget"].items()} == row["replays"]


def test_widget_rerenders_when_max_items_moves():
    pytest.importorskip("ipywidgets")
    stream = [[256] * 6, [240], [121], [72], [238], [256] * 3, [100]]
    w = ex.budget_explorer(stream=stream, budgets=[64, 128, 256, 512, 1024], max_items=4, per_call=7, memory=EMPTY)
    assert w.max_items.description == "max items" and w.max_items.max == 16
    first = w.text
    assert "padding waste" in first and first in w.output.value.replace("&#x27;", "'")
    w.max_items.value = 1
    assert w.text != first and "max items 1" in w.text
    assert w.text.split("padding waste ")[1].split("%")[0] != first.split("padding waste ")[1].split("%")[0]
    w.budgets.value = "64, 128"          # a smaller set narrows the slider to what a replay can hold
    assert w.max_items.max == 2 and "budgets [64, 128]" in w.text
    w.budgets.value = "64, lots"
    assert w.text.startswith("budgets: 'lots'") and "lots" in w.output.value


def test_widget_default_moves_with_every_other_item_limit():
    # The notebook's widget starts at DEFAULT_MAX_ITEMS on the bench stream: any other position of
    # the slider shows another padding waste (the browser test moves it and reads the change).
    pytest.importorskip("ipywidgets")
    w = ex.budget_explorer(memory=EMPTY)
    waste = {}
    for v in range(w.max_items.min, w.max_items.max + 1):
        w.max_items.value = v
        waste[v] = w.text.split("padding waste ")[1].split(" ")[0]
    default = waste.pop(ex.DEFAULT_MAX_ITEMS)
    assert default.endswith("%") and default not in waste.values()


def test_where_widgets_cannot_run_the_explorer_is_a_picture_of_its_first_state():
    """The displayed bundle keeps the widget (JupyterLab ranks it first) and adds the first state as
    HTML and text, under a line saying it is live in JupyterLab: nbconvert and the docs site show
    that instead of ipywidgets' ``VBox(children=...)``."""
    pytest.importorskip("ipywidgets")
    w = ex.budget_explorer(stream=STREAM, budgets=BUDGETS, max_items=4, per_call=1, memory=EMPTY)
    bundle = w._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    first = ex.explore_text(ex.explore(BUDGETS, 4, STREAM, per_call=1, memory=EMPTY))
    assert data["text/plain"] == f"{ex.LIVE_NOTE}\n{first}" and "VBox" not in data["text/plain"]
    assert "live in JupyterLab (make lab)" in ex.LIVE_NOTE
    assert f"<pre>{html.escape(first)}</pre>" in data["text/html"] and html.escape(ex.LIVE_NOTE) in data["text/html"]
    w.max_items.value = 1  # a later display shows the state it is displayed in
    later = w._repr_mimebundle_()
    assert "max items 1" in (later[0] if isinstance(later, tuple) else later)["text/plain"]
