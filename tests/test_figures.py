"""The committed figures: each drawn from one file of the reference set, as the PNG itself names it
(``report --check`` refuses one the set does not explain), named in the title, sized for a page, and what
`report` draws today, so a fresh clone's `report` changes no file."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from lfm2vl_lab.cli.cli import main
from lfm2vl_lab.measure.results import FIGURES_ROOT, RESULTS_ROOT
from lfm2vl_lab.report import reference
from lfm2vl_lab.report.figure_source import SOURCE_KEY, png_bytes, read_sources, save_figure
from lfm2vl_lab.report.plots import MAX_WIDTH_IN, NoData
from lfm2vl_lab.report.report import figure_jobs, reference_sets, report, unexplained_figures

PNGS = sorted(FIGURES_ROOT.glob("nvidia-h200-*.png"))
MAN = reference.load_manifest()
DPI = 120  # what `python -m lfm2vl_lab report` saves at


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path.name
    return struct.unpack(">II", data[16:24])


def test_every_committed_figure_comes_from_one_file_of_the_reference_set():
    assert PNGS and unexplained_figures() == []
    committed = {png.stem: [src["role"] for src in read_sources(png)] for png in PNGS}
    for stem, roles in committed.items():
        # one run per figure; vLLM's A/B figures set the kit's pipeline file beside vLLM's, and name both
        assert roles == (["vllm", "pipeline"] if stem.startswith("nvidia-h200-vllm-") else roles[:1]), stem
        for role in roles:  # a resumable role's partial file (vLLM's) is drawn too, and says so in its title
            assert reference.load(role, partial=True)["provenance"]["gpu"] == "NVIDIA H200", stem
    by_stem = {stem: roles[0] for stem, roles in committed.items()}
    assert {by_stem[f"nvidia-h200-ttft-{k}"] for k in ("breakdown", "grid")} == {"ttft"}
    assert by_stem["nvidia-h200-roofline"] == "roofline" and by_stem["nvidia-h200-vllm-breakdown"] == "vllm"
    for preset, role in (("lfm2-vl-450m", "bench-450m"), ("lfm2-vl-1.6b", "bench-1.6b")):
        for kind in ("latency", "timeline"):
            assert by_stem[f"nvidia-h200-{preset}-bfloat16-{kind}"] == role, kind


def test_every_committed_figure_fits_a_page():
    for png in PNGS:
        width, height = png_size(png)
        assert width <= MAX_WIDTH_IN * DPI and height <= 14 * DPI, (png.name, width, height)


def test_every_figure_names_its_file_and_date_and_has_labelled_axes():
    """Each figure the report draws from the reference set, drawn again: its title names the file and
    the date of the run, each plot has a labelled y axis and the figure a legend."""
    jobs = figure_jobs(reference_sets()["nvidia-h200"], "nvidia-h200")  # what `report` draws
    assert {stem for stem, _, _ in jobs} >= {p.stem for p in PNGS}
    for stem, draw, files in jobs:
        try:
            fig = draw()
        except NoData:
            assert stem not in {p.stem for p in PNGS}, stem
            continue
        title = fig.get_suptitle()
        for res in files:  # each file a figure draws from (vLLM's A/B: the vllm and the pipeline file)
            assert Path(res["_path"]).name in title.replace("\n", " ") and res["provenance"]["date"][:10] in title, stem
        assert fig.get_figwidth() <= MAX_WIDTH_IN, stem
        plots = [ax for ax in fig.axes if ax.has_data()]
        assert plots and all(ax.get_ylabel() or ax.get_yticklabels() for ax in plots), stem
        assert fig.legends or any(ax.get_legend() for ax in fig.axes), stem


ROOFLINE_CODE = reference.role_code_hash(MAN, "roofline")  # the code that recorded the roofline role


def roofline_set(tmp_path: Path) -> tuple[Path, Path]:
    """A reference set under ``tmp_path / "results"`` holding the committed roofline figure's file and
    that figure: ``(folder, figures)``."""
    name = MAN["files"]["roofline"]["file"]
    res = {k: v for k, v in reference.load("roofline").items() if not k.startswith("_")}
    folder = tmp_path / "results" / "nvidia-h200"
    folder.mkdir(parents=True)
    (folder / name).write_text(json.dumps(res))
    code = ROOFLINE_CODE
    manifest = {"gpu": "NVIDIA H200", "code_hash": code, "files": {"roofline": {"file": name, "code_hash": code}}}
    (folder / reference.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "figures").mkdir()
    shutil.copy(FIGURES_ROOT / "nvidia-h200-roofline.png", tmp_path / "figures")
    return folder, tmp_path / "figures"


def test_a_figure_the_set_does_not_draw_is_unexplained(tmp_path):
    """The set explains its own figure; a file beside the manifest that it does not name explains none."""
    folder, figures = roofline_set(tmp_path)
    assert unexplained_figures(figures, tmp_path / "results") == []
    (folder / reference.MANIFEST).write_text(json.dumps({"gpu": "NVIDIA H200", "code_hash": "sha256:0", "files": {}}))
    assert unexplained_figures(figures, tmp_path / "results") == [
        f"nvidia-h200-roofline.png: the reference set under {tmp_path / 'results'} does not draw it"]


def test_report_check_fails_on_a_figure_the_set_does_not_explain(tmp_path, capsys, monkeypatch):
    """``report --check`` compares the figures in ``--out`` too: a copy of the committed ones passes, one
    more figure that `report` does not draw fails it, named (the pages' half: tests/test_tables.py)."""
    monkeypatch.setattr("lfm2vl_lab.cli.cli_report.run_tables", lambda args: 0)
    figures = tmp_path / "figures"
    figures.mkdir()
    for png in PNGS:
        shutil.copy(png, figures)
    assert main(["report", "--check", "--out", str(figures)]) == 0
    shutil.copy(FIGURES_ROOT / "nvidia-h200-roofline.png", figures / "nvidia-h200-made-up.png")
    assert main(["report", "--check", "--out", str(figures)]) == 1
    out = capsys.readouterr().out
    assert "figures not drawn from the reference set: nvidia-h200-made-up.png: the reference set" in out


def test_every_committed_figure_names_the_sets_file_for_its_role():
    """Each committed PNG's own ``Source`` chunk names, for each of its roles, the file the manifest
    gives that role today and the code hash that recorded it (a role beside the set, vLLM's, has its
    own): a figure drawn from an earlier run fails here. Read straight from the PNG and the manifest."""
    assert PNGS
    for png in PNGS:
        with Image.open(png) as im:
            text = dict(im.text)
        assert set(text) == {SOURCE_KEY}, (png.name, set(text))  # no Software (version) or date chunk
        sources = json.loads(text[SOURCE_KEY])
        assert sources, png.name
        for src in sources:
            entry = MAN["files"].get(src["role"]) or MAN.get("partial", {}).get(src["role"])
            assert entry is not None and src["file"] == entry["file"], (png.name, src)
            assert src["code_hash"] == entry.get("code_hash", MAN["code_hash"]), (png.name, src)


def test_report_redraws_the_committed_figures_as_they_are(tmp_path):
    """``report`` into a copy of data/figures draws exactly the committed figures and leaves each
    file's bytes as they are: a fresh clone's ``report`` leaves ``git status`` clean. A redraw that
    equals a file in content (its text chunks and decoded pixels) keeps that file, so only another
    picture or another source would change the bytes (lfm2vl_lab/report/figure_source.py says why
    content, not bytes, decides; the test below shows a changed picture is rewritten)."""
    figures = tmp_path / "figures"
    figures.mkdir()
    for png in PNGS:
        shutil.copy(png, figures)
    drawn = report(RESULTS_ROOT, figures, verbose=False)
    assert sorted(p.name for p in drawn) == [p.name for p in PNGS]
    assert sorted(p.name for p in figures.iterdir()) == [p.name for p in PNGS]
    changed = [p.name for p in PNGS if (figures / p.name).read_bytes() != p.read_bytes()]
    assert not changed, f"redrawn otherwise: {changed} (`python -m lfm2vl_lab report`, then commit data/figures)"


def _small_figure() -> Figure:
    fig = Figure(figsize=(2, 1.5))
    fig.add_subplot().plot([0, 1], [1, 0])
    return fig


def _chunks(data: bytes) -> list[str]:
    out, pos = [], 8
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8].decode()
        out.append(kind)
        pos += 12 + length
    return out


def test_saved_figures_are_deterministic_and_an_equal_picture_is_kept(tmp_path):
    fig, src = _small_figure(), [{"file": "x-20260101-000000.json", "role": "x", "code_hash": "sha256:0"}]
    first = png_bytes(fig, src)
    assert png_bytes(_small_figure(), src) == first  # drawn twice: the same bytes
    assert set(_chunks(first)) <= {"IHDR", "pHYs", "tEXt", "iTXt", "IDAT", "IEND"}  # no tIME
    path = tmp_path / "f.png"
    assert save_figure(fig, path, src) and path.read_bytes() == first
    with Image.open(path) as im:  # the same picture compressed otherwise (another zlib or Pillow)
        info = PngInfo()
        info.add_text(SOURCE_KEY, im.text[SOURCE_KEY])
        im.save(path, pnginfo=info, compress_level=1)
    other_bytes = path.read_bytes()
    assert other_bytes != first
    assert not save_figure(fig, path, src) and path.read_bytes() == other_bytes  # kept: same content
    assert save_figure(fig, path, [dict(src[0], file="x-20260202-000000.json")])  # another source
    fig.axes[0].plot([0, 1], [0, 1])
    assert save_figure(fig, path, [dict(src[0], file="x-20260202-000000.json")])  # another picture
    assert path.read_bytes() == png_bytes(fig, [dict(src[0], file="x-20260202-000000.json")])


def test_a_figure_names_the_sets_file_its_code_and_its_role(tmp_path):
    """A figure's sources are read from its PNG: one that names another file than the set's for its role,
    other code, a role the set lacks, one source too many, or nothing, is unexplained, naming the figure."""
    _folder, figures = roofline_set(tmp_path)
    png, name, fig = figures / "nvidia-h200-roofline.png", MAN["files"]["roofline"]["file"], _small_figure()
    ok = {"file": name, "role": "roofline", "code_hash": ROOFLINE_CODE}
    save_figure(fig, png, [ok])
    assert unexplained_figures(figures, tmp_path / "results") == []
    for named in ([dict(ok, file="roofline-20260101-000000.json")], [dict(ok, code_hash="sha256:" + "1" * 64)],
                  [dict(ok, role="e2e")], [ok, ok]):
        save_figure(fig, png, named)
        assert unexplained_figures(figures, tmp_path / "results") == [
            f"nvidia-h200-roofline.png names {named} as its sources, the set's are {[ok]}"]
    fig.savefig(png)  # matplotlib's own PNG: no source
    (got,) = unexplained_figures(figures, tmp_path / "results")
    assert got.startswith("nvidia-h200-roofline.png names no source file"), got
