"""Figures of the text model's peers (``python -m lfm2vl_lab engine``, :mod:`lfm2vl_lab.measure.engine_peers`).

* :func:`decode_vs_floor` — decode ms per token of every mode as bars (whisker: p90), one panel per
  preset, with the memory-bandwidth floor of that preset as a line: how far each way of running the
  same weights is from the least a decode step can take.

Like the other figure modules it takes one result file (one run) and returns a
``matplotlib.figure.Figure`` built without ``pyplot``; a file without the data raises
:class:`~lfm2vl_lab.report.plots_common.NoData`.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..measure.engine_peers import MODES
from .plots_common import NoData, page_width, set_title

MODE_COLORS = dict(zip(MODES, ("#7f7f7f", "#9467bd", "#8c564b", "#2ca02c", "#d62728")))


def run_title(result: dict) -> str:
    """Which run a figure draws: GPU, date and file (where the file was loaded from one)."""
    p = result.get("provenance", {})
    where = f" ({Path(result['_path']).name})" if result.get("_path") else ""
    return f"{p.get('gpu', '?')}, {str(p.get('date', ''))[:10]}{where}"


def _decode_rows(result: dict, preset: str) -> list[dict]:
    return [r for r in result.get("rows", []) if r.get("preset") == preset and r.get("requests") == 1]


def decode_vs_floor(result: dict, title: str | None = None) -> Figure:
    """Decode ms per token per mode (one request) against the bandwidth floor, a panel per preset.
    A mode recorded with an error has no bar; its label says "error"."""
    presets = [s["preset"] for s in result.get("setup", []) if _decode_rows(result, s["preset"])]
    if not presets:
        raise NoData("no decode rows in this file (python -m lfm2vl_lab engine records them)")
    fig = Figure(figsize=(page_width(4.2 * len(presets) + 1), 4.2), layout="constrained")
    axes = fig.subplots(1, len(presets), squeeze=False)[0]
    floors = {s["preset"]: s["floor"] for s in result["setup"]}
    for ax, preset in zip(axes, presets):
        rows = _decode_rows(result, preset)
        labels = [r["mode"] + ("\n(error)" if "error" in r else "") for r in rows]
        vals = [r.get("decode_ms_per_token") or 0.0 for r in rows]
        err = [max(0.0, (r.get("decode_p90_ms_per_token") or v) - v) for r, v in zip(rows, vals)]
        x = range(len(rows))
        ax.bar(x, vals, yerr=[[0.0] * len(err), err], capsize=3, label="decode, median (whisker: p90)",
               color=[MODE_COLORS.get(r["mode"], "#1f77b4") for r in rows])
        fl = floors[preset]
        ax.axhline(fl["floor_ms"], color="black", linestyle="--", linewidth=1,
                   label=f"bandwidth floor {fl['floor_ms']:.3f} ms ({fl['param_bytes'] / 1e9:.2f} GB at "
                         f"{fl['bandwidth_B_per_s'] / 1e12:.1f} TB/s)")
        for i, v in zip(x, vals):  # each bar's value, and how far above the floor it is
            if v > 0:
                ax.annotate(f"{v:.2f} ms\n{v / fl['floor_ms']:.1f}× floor", (i, v), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=7)
        ax.set_yscale("log")  # generate's eager step is ~100x the floor, the engines' a few times it
        ax.set_ylim(fl["floor_ms"] / 2, max(vals + [fl["floor_ms"]]) * 4)
        ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per decode token (one request, log scale)")
        ax.set_title(preset, fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
    set_title(fig, title or f"Decode per token against the bandwidth floor: {run_title(result)}")
    return fig
