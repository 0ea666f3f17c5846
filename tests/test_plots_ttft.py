"""The TTFT grid's figures (report/plots_ttft.py), its DataFrames (report/ttft_summary.py) and the report's
ttft figures: from the reference set's TTFT file and from synthetic rows of the full grid's shape, with
missing modes, cases and sections."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from lfm2vl_lab.measure.results import gpu_slug, save_result
from lfm2vl_lab.measure.ttft import mode_name
from lfm2vl_lab.report import reference
from lfm2vl_lab.report.frames import MixedRuns
from lfm2vl_lab.report.plots import NoData
from lfm2vl_lab.report.plots_ttft import (
    TTFT_MODES,
    ttft_breakdown_figure,
    ttft_case,
    ttft_grid_figure,
    ttft_rows,
)
from lfm2vl_lab.report.ttft_summary import decode_frame, parity_frame

ROOT = Path(__file__).resolve().parents[1]
PHASES = {"processor": 1.6, "h2d": 0.4, "encoder": 1.0, "merge": 0.05, "prefill": 2.0, "sample": 0.1}
PRESETS, IMAGES, REQUESTS = ("lfm2-vl-450m", "lfm2-vl-1.6b"), ("1x512", "tiled"), (1, 2, 4, 8)


@pytest.fixture(scope="module")
def recorded() -> dict:
    """The reference set's TTFT file (both presets, 1x512 and tiled, 1 to 8 requests)."""
    return reference.load("ttft")


def cases_of(res: dict, preset: str = "lfm2-vl-450m") -> list[tuple]:
    return list(dict.fromkeys((r["image"], r["requests"]) for r in res["rows"] if r["preset"] == preset))


def synthetic_rows(presets=PRESETS, images=IMAGES, requests=REQUESTS, modes=TTFT_MODES) -> list[dict]:
    rows = []
    for p in presets:
        for im in images:
            for n in requests:
                for k, m in enumerate(modes):
                    text, enc = m.removeprefix("text-").split("+encoder-")
                    row = {"preset": p, "image": im, "requests": n, "mode": m, "text_mode": text, "encoder_mode": enc,
                           "ttft_ms": 20.0 - 4 * k + n, "phases_ms": dict(PHASES), "decode_ms_per_token": 10.0 - 2 * k,
                           "same_first_tokens": True}
                    if enc == "graphed":
                        row.update(encoder_graph_cut=0.3 + 0.1 * (text == "graphed"), decode_drift=0.0)
                    rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# figures


def test_breakdown_from_the_recorded_file(recorded):
    fig = ttft_breakdown_figure(recorded["rows"])
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["lfm2-vl-450m, 1x512 x1", "lfm2-vl-1.6b, 1x512 x1"]
    ax = fig.axes[0]
    # four modes, six phases each (the processor included, hatched)
    assert len(ax.patches) == 4 * 6
    assert sum(1 for p in ax.patches if p.get_hatch()) == 4
    texts = [t.get_text() for t in ax.texts]
    both = ttft_case(recorded["rows"], "lfm2-vl-450m", "1x512", 1)[mode_name("graphed", "graphed")]
    assert any(f"TTFT {both['ttft_ms']:.2f} ms" in t and "ms/token" in t for t in texts)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(TTFT_MODES)
    assert len(ttft_breakdown_figure(recorded["rows"], requests=4).axes) == 2


def test_grid_from_the_recorded_file(recorded):
    panels = list(dict.fromkeys((r["preset"], r["image"]) for r in recorded["rows"]))
    fig = ttft_grid_figure(recorded["rows"])
    assert [ax.get_title(loc="left") for ax in fig.axes] == [f"{p}, {im}" for p, im in panels]
    for ax, (p, im) in zip(fig.axes, panels, strict=True):
        ns = sorted({r["requests"] for r in recorded["rows"] if (r["preset"], r["image"]) == (p, im)})
        assert len(ax.lines) == 4 and all(list(line.get_xdata()) == ns for line in ax.lines)


def _first_bar(rows) -> list[float]:
    (ax,) = ttft_breakdown_figure(rows).axes
    first = sorted((p for p in ax.patches if abs(p.get_y() + p.get_height() / 2) < 1e-9), key=lambda p: p.get_x())
    return [round(p.get_width(), 3) for p in first]


def test_the_segments_are_the_phases_in_order():
    # h2d, encoder, merge, prefill, sample, then the processor (outside TTFT)
    assert _first_bar(synthetic_rows(presets=PRESETS[:1])) == [0.4, 1.0, 0.05, 2.0, 0.1, 1.6]
    rows = synthetic_rows(presets=PRESETS[:1], images=IMAGES[:1], requests=(1,))
    for r in rows:
        r["phases_ms"] = {"decode": 5.0, "extra": 3.0, "prefill": 2.0}
    assert _first_bar(rows) == [2.0, 3.0]  # an unknown phase after TTFT's own; decode is not drawn


def test_full_grid_synthetic():
    rows = synthetic_rows()
    fig = ttft_grid_figure(rows)
    assert len(fig.axes) == 4  # (preset, image) panels
    assert all(len(ax.lines) == 4 and len(ax.lines[0].get_xdata()) == 4 for ax in fig.axes)
    assert len(ttft_grid_figure([r for r in rows if r["image"] == "tiled"]).axes) == 2
    bd = ttft_breakdown_figure(rows, image="tiled", requests=8)
    assert len(bd.axes) == 2 and all(len(ax.patches) == 24 for ax in bd.axes)
    assert len(ttft_breakdown_figure([r for r in rows if r["preset"] == "lfm2-vl-1.6b"]).axes) == 1


def test_a_missing_mode_is_said_not_drawn():
    missing = mode_name("eager", "eager")
    rows = synthetic_rows(presets=PRESETS[:1], images=IMAGES[:1], modes=[m for m in TTFT_MODES if m != missing])
    (ax,) = ttft_breakdown_figure(rows).axes
    assert len(ax.patches) == 3 * 6
    assert "not recorded" in [t.get_text().strip() for t in ax.texts]
    assert ax.get_ylim() == (3.5, -0.5)  # the missing mode keeps its row
    (ax,) = ttft_grid_figure(rows).axes
    assert len(ax.lines) == 3
    assert any(t.get_text() == f"not recorded: {missing}" for t in ax.texts)


def test_missing_cases_and_rows_raise_nodata_that_says_what_is_there(recorded):
    (im, n), (im2, n2) = cases_of(recorded)[:2]
    with pytest.raises(NoData, match=rf"no rows for 2x512 x1; recorded: lfm2-vl-450m {im} x{n}, "
                                     rf"lfm2-vl-450m {im2} x{n2}"):
        ttft_breakdown_figure(recorded["rows"], image="2x512")
    e2e_rows = [{"preset": "p", "image": "1x512", "requests": 1, "mode": "hf-eager", "ttft_ms": 3.0}]
    for make in (ttft_breakdown_figure, ttft_grid_figure):
        with pytest.raises(NoData, match="python -m lfm2vl_lab ttft"):
            make(e2e_rows)
        with pytest.raises(NoData):
            make([])


def test_rows_of_two_runs_are_refused():
    rows = synthetic_rows(presets=PRESETS[:1], images=IMAGES[:1], requests=(1,))
    assert ttft_rows(rows) == rows
    later = dict(rows[0], ttft_ms=99.0)  # the same case and mode again: another run's row
    with pytest.raises(MixedRuns, match="text-eager\\+encoder-eager"):
        ttft_rows(rows + [later])
    with pytest.raises(MixedRuns):
        ttft_grid_figure(rows + [later])
    with pytest.raises(NoData, match="no rows for 1x512 x4; recorded: lfm2-vl-450m 1x512 x1$"):
        ttft_breakdown_figure(rows, requests=4)  # the message names the cases there are


# ------------------------------------------------------------------------------------------------
# tables notebook 07 shows


def test_tables_from_the_recorded_file(recorded):
    rows = recorded["rows"]
    dec = decode_frame(rows)
    assert [c[1:] for c in dec.index if c[0] == "lfm2-vl-450m"] == cases_of(recorded)  # a row per case
    one = ttft_case(rows, "lfm2-vl-450m", "1x512", 1)
    assert dec.loc[("lfm2-vl-450m", "1x512", 1), "T:graphed E:eager"] == \
        round(one[mode_name("graphed", "eager")]["decode_ms_per_token"], 2)
    per_mode = len(TTFT_MODES)  # a row per mode of each checked or profiled case
    assert (parity_frame(recorded)["preset"] == "lfm2-vl-450m").sum() == \
        per_mode * sum(p["preset"] == "lfm2-vl-450m" for p in recorded["parity"])


def test_missing_sections_say_not_recorded(recorded):
    bare = {k: v for k, v in recorded.items() if k not in ("targets", "parity", "profile")}
    assert parity_frame(bare).startswith("not recorded")
    assert decode_frame([]).startswith("not recorded")


def test_the_decode_control():
    rows = synthetic_rows(presets=PRESETS[:1], images=IMAGES[:1], requests=(1,))
    assert decode_frame(rows)["decode control"].tolist() == ["holds"]
    rows[1]["decode_drift"] = -0.2  # text eager, encoder graphed
    dec = decode_frame(rows)
    assert dec["decode control"].tolist() == ["fails"] and dec["drift %, text eager"].tolist() == [-20.0]


# ------------------------------------------------------------------------------------------------
# report


def _reference_set(root: Path, results: dict[str, dict]) -> None:
    """A reference set of the H200 under ``root``: the results saved by role, and a manifest naming them."""
    paths = {role: save_result(res, root, name=role) for role, res in results.items()}
    manifest = {"gpu": "NVIDIA H200", "code_hash": "sha256:" + "0" * 64,
                "files": {role: {"file": p.name} for role, p in paths.items()}}
    (root / gpu_slug("NVIDIA H200") / "reference.json").write_text(json.dumps(manifest))


def test_report_draws_the_ttft_figures(recorded, tmp_path, capsys):
    from lfm2vl_lab.report.report import report

    res = {k: copy.deepcopy(v) for k, v in recorded.items() if not k.startswith("_")}
    _reference_set(tmp_path / "results", {"ttft": res})
    written = report(tmp_path / "results", tmp_path / "figures")
    assert sorted(p.name for p in written) == [f"nvidia-h200-ttft-{k}.png" for k in ("breakdown", "grid")]
    # a file without a 1x512 x1 row: the breakdown is skipped with the reason, the others are drawn
    res["rows"] = [r for r in res["rows"] if r["requests"] != 1]
    _reference_set(tmp_path / "results2", {"ttft": res})
    written = report(tmp_path / "results2", tmp_path / "figures2")
    assert sorted(p.name for p in written) == ["nvidia-h200-ttft-grid.png"]
    assert "skip nvidia-h200-ttft-breakdown: ttft_breakdown_figure: no rows for 1x512 x1" in \
        capsys.readouterr().out
