"""The docs site (``make docs``): strict builds fail on broken links and missing images, ``solution``
cells sit behind a toggle, the table of contents reads headings with their code, code cells show no
nbval markers, and every page of the real site loads clean in headless Chromium.

Every build here runs the command ``make docs`` runs (``mkdocs build --strict``). Small sites are
temporary projects that inherit mkdocs.yml (theme, plugins, validation, hooks) with pages of their
own. The browser tests use Debian's Chromium (``scripts/install_chromium.sh``) through Playwright,
never a browser build Playwright would download; they skip, saying so, where either is missing. One
screenshot per page, of its top as a reader first sees it, goes to ``site-screenshots/`` (git-ignored).
"""

from __future__ import annotations

import base64
import functools
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from chromium import missing

try:  # the GPU image has no Jupyter: skip there (fail under LAB_REQUIRE_SITE_TESTS=1, as for the docs extra)
    import nbformat
except ModuleNotFoundError:
    missing("nbformat is not installed: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "site-screenshots"


# the docs extra: mkdocs, Material, mkdocs-jupyter, mkdocstrings, bs4 (playwright: see `browser`)
if not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings", "bs4")):
    missing("the docs extra is not installed: pip install -e '.[docs]'")


def build_site(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``site_dir``, as ``make docs`` runs it."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def small_project(tmp: Path, pages: dict[str, str], notebook=None, assets: bool = True) -> Path:
    """A project inheriting mkdocs.yml with only ``pages`` (name → Markdown) and, if given, the
    notebook ``fixture.ipynb``, plus the image ``img/ok.png`` and (``assets``) the site's stylesheet.
    Returns its config file."""
    from PIL import Image

    docs = tmp / "docs"
    (docs / "img").mkdir(parents=True)
    if assets:
        shutil.copytree(ROOT / "docs" / "web" / "assets", docs / "assets")  # mkdocs.yml's extra_css
    Image.new("RGB", (8, 6), (200, 30, 30)).save(docs / "img" / "ok.png")
    for name, text in pages.items():
        (docs / name).write_text(text)
    if notebook is not None:
        nbformat.write(notebook, docs / "fixture.ipynb")
    config = {"INHERIT": str(ROOT / "mkdocs.yml"), "docs_dir": str(docs), "hooks": [str(ROOT / "docs" / "hooks.py")],
              "nav": list(pages) + (["fixture.ipynb"] if notebook is not None else []), "watch": [],
              "extra": {"lab_site": {"pages": [], "assets": []}}}
    path = tmp / "mkdocs.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


WIDE_FIGURE = (1600, 120)  # pixels: wider than a notebook page's column at 1280 px


def wide_png() -> bytes:
    """A PNG of :data:`WIDE_FIGURE`, the fixture notebook's figure."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", WIDE_FIGURE, (30, 90, 200)).save(buf, format="PNG")
    return buf.getvalue()


def solution_notebook(image: str = "img/ok.png", prose: str = "Add two numbers."):
    """Cells: a markdown cell with ``prose`` and ``image``, a heading with inline code, a plain cell
    with an nbval marker, two ``solution`` cells in a row, a plain cell, a lone ``solution`` cell,
    then two widget outputs: one with only ipywidgets' repr, one with a picture of itself, and a figure
    wider than any column (:data:`WIDE_FIGURE`)."""
    v4 = nbformat.v4
    tagged = {"tags": ["solution"]}
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "0", "version_major": 2, "version_minor": 0}}
    return v4.new_notebook(cells=[
        v4.new_markdown_cell(f"# Fixture: exercises\n\n{prose} ![a red box]({image})"),
        v4.new_markdown_cell("## 2.1 `torch.cuda.graph` and `x`\n\nA heading with code in it."),
        v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nx = 1", outputs=[]),
        v4.new_markdown_cell("The first answer uses `+`.", metadata=tagged),
        v4.new_code_cell("print(1 + 1)", metadata=tagged,
                         outputs=[v4.new_output("stream", name="stdout", text="2\n")]),
        v4.new_code_cell("print('visible between solutions')", outputs=[]),
        v4.new_code_cell("second_answer = 2 * 2", metadata=tagged, outputs=[]),
        v4.new_code_cell("bare", outputs=[v4.new_output("execute_result", execution_count=1, data={
            **view, "text/plain": "VBox(children=(IntSlider(value=4),))"})]),
        v4.new_code_cell("pictured", outputs=[v4.new_output("execute_result", execution_count=2, data={
            **view, "text/html": "<pre>padding waste 5.2%</pre>",
            "text/plain": "VBox(children=(IntSlider(value=5),))"})]),
        v4.new_code_cell("figure", outputs=[v4.new_output("display_data", data={
            "image/png": base64.b64encode(wide_png()).decode(), "text/plain": "<Figure size 1600x120>"})]),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


@pytest.fixture(scope="module")
def fixture_site(tmp_path_factory) -> Path:
    """A small site that builds: a page linking the notebook and the image, and the solution notebook."""
    tmp = tmp_path_factory.mktemp("fixture-site")
    index = "# Fixture\n\n[The exercises](fixture.ipynb) and ![ok](img/ok.png)\n"
    proc = build_site(small_project(tmp, {"index.md": index}, solution_notebook()), tmp / "site")
    assert proc.returncode == 0, proc.stderr
    return tmp / "site"


def test_broken_links_and_missing_images_fail_the_build(tmp_path, fixture_site):
    """The same small site as ``fixture_site`` (which builds), plus one fault of each kind: broken
    links and images in Markdown and in a notebook, a missing stylesheet, math (no MathJax offline)
    a script from the network, and a notebook's widget state (its manager would load from a CDN)."""
    index = ("# Fixture\n\n[gone](no-such-page.md), [no anchor](#nowhere) and ![missing](img/missing.png)\n\n"
             '<script src="https://cdn.example.org/lib.js"></script>\n')
    notebook = solution_notebook("img/missing-in-notebook.png", prose="Add $a$ and $b$.")
    # saved ipywidgets state: nbconvert answers it with a widget manager loaded from a CDN
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {}, "version_major": 2, "version_minor": 0}}
    proc = build_site(small_project(tmp_path, {"index.md": index}, notebook, assets=False), tmp_path / "site")
    assert proc.returncode != 0
    faults = ("no-such-page.md", "#nowhere", "img/missing.png", "img/missing-in-notebook.png", "assets/site.css",
              "fixture.ipynb: has math", "would fetch from the network: '<script src=\"https://cdn.example.org",
              "fixture.ipynb: a script would load 'https://unpkg.com/@jupyter-widgets/html-manager")
    for fault in faults:
        assert fault in proc.stderr, f"the build did not report {fault}:\n{proc.stderr}"
    assert "strict mode" in proc.stdout  # "Aborted with 4 warnings in strict mode!"


def test_solution_cells_sit_behind_a_closed_toggle(fixture_site):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((fixture_site / "fixture.html").read_text(), "html.parser")
    toggles = soup.select("details.solution")
    assert [d.summary.get_text() for d in toggles] == ["Solution", "Solution"]
    assert all(not d.has_attr("open") for d in toggles)
    # the two solutions in a row share the first toggle; the plain cell between stays outside
    assert "The first answer uses" in toggles[0].get_text() and "print(1 + 1)" in toggles[0].get_text()
    assert "second_answer" in toggles[1].get_text()
    plain = [c for c in soup.select(".jp-Cell") if c.find_parent("details") is None]
    assert any("visible between solutions" in c.get_text() for c in plain)
    assert not any("print(1 + 1)" in c.get_text() for c in plain)


def test_a_widget_shows_its_picture_or_says_where_it_is_live(fixture_site):
    """A page cannot run a widget: one that carries a picture (its first state, as a notebook may save it) shows
    it, one that carries only ipywidgets' repr says it is live in JupyterLab instead of "VBox(...)"."""
    from bs4 import BeautifulSoup

    page = (fixture_site / "fixture.html").read_text()
    soup = BeautifulSoup(page, "html.parser")
    assert "VBox(children" not in soup.get_text()
    notes = soup.select(".jp-OutputArea-output p.lab-widget-note")
    assert len(notes) == 1 and "live in JupyterLab (make lab)" in notes[0].get_text()
    assert "padding waste 5.2%" in soup.get_text()


def test_figures_are_files_beside_the_page_and_links_to_themselves(fixture_site):
    """An output's PNG is a file beside its page, shown from there and linked to itself; so is a
    markdown cell's image. A notebook page's body carries the class that widens it (site.css)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((fixture_site / "fixture.html").read_text(), "html.parser")
    assert "lab-notebook" in soup.body["class"]
    links = {a["href"]: a.img["src"] for a in soup.select(".jupyter-wrapper a.lab-figure") if a.img}
    assert links == {"fixture/figure-1.png": "fixture/figure-1.png", "img/ok.png": "img/ok.png"}, links
    assert (fixture_site / "fixture" / "figure-1.png").read_bytes() == wide_png()
    assert "data:image/png" not in str(soup.select_one(".jupyter-wrapper"))


def test_toc_keeps_inline_code_and_code_cells_lose_nbval_markers(fixture_site):
    """The table of contents reads a heading as the page shows it (code included) and links to its
    anchor; a code cell shows its code, not the marker nbval reads."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((fixture_site / "fixture.html").read_text(), "html.parser")
    toc = {" ".join(a.get_text().split()): a["href"] for a in soup.select("nav.md-nav--secondary a.md-nav__link")}
    assert "2.1 torch.cuda.graph and x" in toc, toc
    heading = soup.find(id=toc["2.1 torch.cuda.graph and x"].lstrip("#"))
    assert heading is not None and heading.name == "h2" and heading.code.get_text() == "torch.cuda.graph"
    code = [c.get_text() for c in soup.select(".jp-CodeCell")]
    assert any("x = 1" in c for c in code) and not any("NBVAL" in c for c in code)


# ------------------------------------------------------------------------------------------------
# The real site, and the browser
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_site(tmp_path_factory) -> Path:
    """The repository's site, built as ``make docs`` builds it (into a temporary folder)."""
    site = tmp_path_factory.mktemp("real-site") / "site"
    proc = build_site(ROOT / "mkdocs.yml", site)
    assert proc.returncode == 0, f"make docs would fail:\n{proc.stderr[-4000:]}"
    return site


@pytest.mark.slow
def test_real_site_has_every_notebook_figure_and_the_quick_start(real_site):
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (real_site / "notebooks" / f"{nb.stem}.html").is_file(), nb.name
    for png in sorted((ROOT / "data" / "figures").glob("nvidia-h200-*.png")):
        assert (real_site / "data" / "figures" / png.name).is_file(), png.name
    vllm = (real_site / "docs" / "vllm.html").read_text()
    assert 'src="../data/figures/nvidia-h200-vllm-breakdown.png"' in vllm
    readme = (ROOT / "README.md").read_text()
    quick = next(line for line in readme.splitlines() if line.startswith("make bench"))
    assert quick.split("#")[1].strip() in (real_site / "index.html").read_text()
    api = (real_site / "api.html").read_text()
    assert 'id="lfm2vl_lab.GraphedEncoder"' in api and 'id="lfm2vl_lab.TextEngine"' in api
    # Sphinx roles are stripped, and >>> examples are code, not nested block quotes
    assert ":func:" not in api and ":class:" not in api and "<blockquote>" not in api


def test_doctest_examples_become_code_blocks():
    spec = importlib.util.spec_from_file_location("griffe_doctest", ROOT / "docs" / "griffe_doctest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = "Doubles.\n\n>>> f(1)\n2\n>>> f(2)\n4\n\nMore prose.\n"
    assert mod.fence_doctests(text) == "Doubles.\n\n```pycon\n>>> f(1)\n2\n>>> f(2)\n4\n```\n\nMore prose.\n"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would drown the test output
        pass


def serve(folder: Path):
    """A static HTTP server for ``folder`` on 127.0.0.1 at a free port, in a thread: (server, base URL)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/"


# Every <img> finished (loaded or failed), then the ones without pixels.
BROKEN_IMAGES_JS = """async () => {
  const imgs = [...document.images];
  imgs.forEach(img => { img.loading = "eager"; });
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(r => { img.onload = img.onerror = r; })));
  return imgs.filter(img => img.naturalWidth === 0).map(img => img.currentSrc || img.src);
}"""


def visit(browser, url: str, shot: Path | None = None) -> tuple[list[str], object]:
    """Load ``url``; return (every problem seen, the open page): console errors, page errors, failed
    requests and images without pixels. Saves a screenshot of the window to ``shot`` (a whole page's
    took about 20 s more on two cores for the real site's pages, and the checks above see every image
    without it)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    problems += [f"image without pixels: {src}" for src in page.evaluate(BROKEN_IMAGES_JS)]
    if shot is not None:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
    return problems, page


def read_notebook_page(page, name: str) -> dict:
    """What a notebook page of the real site shows: the first line of each code cell that carries an
    nbval marker and, on notebook 02, its "5.2" table-of-contents entry and the heading it jumps to."""
    code = page.locator(".jp-CodeCell .jp-InputArea").all_inner_texts()
    seen = {"code_cells": len(code), "markers": [c.splitlines()[0] for c in code if "NBVAL_" in c]}
    if name.startswith("02_"):
        link = page.locator(".md-sidebar--secondary a.md-nav__link", has_text="5.2")
        seen["toc_visible"] = link.is_visible()
        seen["toc_text"] = " ".join(link.inner_text().split()) if seen["toc_visible"] else None
        target = page.locator(f"[id='{link.get_attribute('href').lstrip('#')}']") if seen["toc_visible"] else None
        seen["targets"] = [target.nth(i).inner_text() for i in range(target.count())] if target else []
    return seen


@pytest.fixture(scope="module")
def site_in_chromium(real_site, browser) -> dict:
    """Every HTML page of the real site loaded once over HTTP (one screenshot each): the problems each
    showed and, for the notebook pages, what :func:`read_notebook_page` read off them."""
    pages = sorted(p.relative_to(real_site).as_posix() for p in real_site.rglob("*.html"))
    httpd, base = serve(real_site)
    problems, notebooks = {}, {}
    try:
        for rel in pages:
            seen, page = visit(browser, base + rel, SHOTS / (rel.removesuffix(".html").replace("/", "__") + ".png"))
            problems[rel] = seen
            if rel.startswith("notebooks/"):
                notebooks[rel.removeprefix("notebooks/")] = read_notebook_page(page, rel.removeprefix("notebooks/"))
            page.close()
    finally:
        httpd.shutdown()
    print(f"\n{len(pages)} pages checked; screenshots in {SHOTS}")
    return {"pages": pages, "problems": problems, "notebooks": notebooks}


@pytest.mark.browser
@pytest.mark.slow
def test_every_page_loads_clean_in_chromium(site_in_chromium):
    """Each HTML page of the site, over HTTP: images have pixels, no console error, no failed request."""
    pages = site_in_chromium["pages"]
    assert "index.html" in pages and "docs/vllm.html" in pages and "api.html" in pages
    failures = {rel: seen for rel, seen in site_in_chromium["problems"].items() if seen}
    assert not failures, json.dumps(failures, indent=1)


@pytest.mark.browser
def test_solution_toggle_opens_on_click(fixture_site, browser):
    httpd, base = serve(fixture_site)
    try:
        problems, page = visit(browser, base + "fixture.html")
        SHOTS.mkdir(exist_ok=True)
        answer = page.locator("details.solution").first.locator("pre", has_text="print(1 + 1)")
        assert not answer.is_visible()
        page.locator("details.solution > summary").first.click()
        assert answer.is_visible()
        page.screenshot(path=str(SHOTS / "fixture-solution-toggle.png"), full_page=True)  # first open, second closed
        assert not page.locator("details.solution").nth(1).locator("pre", has_text="second_answer").is_visible()
        page.close()
    finally:
        httpd.shutdown()
    assert not problems, problems


NOTEBOOK_WIDTH_JS = """() => ({
  content: document.querySelector('.md-content').getBoundingClientRect().width,
  nav: document.querySelector('.md-sidebar--primary').getBoundingClientRect().width,
  toc: document.querySelector('.md-sidebar--secondary').getBoundingClientRect().width})"""


@pytest.mark.browser
def test_notebook_pages_use_the_window_and_figures_open_at_full_size(fixture_site, browser):
    """A notebook page has no navigation sidebar and no width limit: at 1920 px its content column is
    the window less the table of contents (Material's own limit leaves 61rem for all three). A click
    on a figure opens its PNG at full size."""
    httpd, base = serve(fixture_site)
    try:
        problems, page = visit(browser, base + "fixture.html")
        problems = list(problems)  # the page's own (the PNG's tab asks for a favicon the site has not got)
        page.set_viewport_size({"width": 1920, "height": 900})
        size = page.evaluate(NOTEBOOK_WIDTH_JS)
        assert size["nav"] == 0 and size["toc"] > 0 and size["content"] >= 1920 - size["toc"] - 64, size
        page.set_viewport_size({"width": 1280, "height": 900})
        figure = page.locator("a.lab-figure img[src='fixture/figure-1.png']")
        shown = figure.bounding_box()["width"]
        assert shown < WIDE_FIGURE[0], "the figure should fit the column"
        with page.expect_navigation():
            figure.click()
        assert page.url == base + "fixture/figure-1.png"
        full = page.evaluate("() => [document.images[0].naturalWidth, document.images[0].naturalHeight]")
        assert tuple(full) == WIDE_FIGURE
        page.close()
    finally:
        httpd.shutdown()
    assert not problems, problems


@pytest.mark.browser
@pytest.mark.slow
def test_notebook_pages_read_as_written_in_chromium(real_site, site_in_chromium):
    """In the browser: notebook 02's table of contents shows "5.2 `torch.cuda.make_graphed_callables`"
    with its code and jumps to that heading; no notebook page shows an nbval marker in a code cell."""
    seen = site_in_chromium["notebooks"]
    assert sorted(seen) == sorted(p.name for p in (real_site / "notebooks").glob("*.html"))
    assert any(name.startswith("02_") for name in seen), sorted(seen)
    for name, page in seen.items():
        assert page["code_cells"], f"{name}: no code cell found"
        if name.startswith("02_"):
            assert page["toc_visible"] and page["toc_text"] == "5.2 torch.cuda.make_graphed_callables", page
            assert len(page["targets"]) == 1 and "make_graphed_callables" in page["targets"][0], page
    markers = {name: page["markers"] for name, page in seen.items()}
    assert not any(markers.values()), markers
