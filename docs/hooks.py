"""MkDocs hook of the docs site (``mkdocs.yml``: ``hooks``). Build glue, so it lives beside the docs:

* adds the repository files the site shows (``extra.lab_site`` in mkdocs.yml) at their repository
  paths, so links written for GitHub and JupyterLab resolve unchanged, and expands nav globs;
* in notebook pages: checks every relative link and image, points ``.ipynb``/``.md`` links at their
  pages, wraps cells tagged ``solution`` in a closed ``<details>`` (plain HTML: no script needed),
  drops the nbval markers (``# NBVAL_CHECK_OUTPUT``, a test's business) from the code cells, shows a
  line saying a widget is live in JupyterLab where a widget output holds no picture of itself, and builds
  the table of contents from the page's headings (mkdocs-jupyter's drops their inline code);
* notebook pages take the window's width (no navigation sidebar, no width limit: ``site.css``), and
  every figure on them is a link that opens it at full size (an output's PNG becomes a file beside the page);
* keeps the site offline: nbconvert's CDN loaders are dropped, and any page that would still fetch
  a script, stylesheet, font or image from the network is reported.

Problems are logged as warnings: ``mkdocs build --strict`` (``make docs``) fails on any of them.
"""

from __future__ import annotations

import base64
import html as html_lib
import json
import logging
import posixpath
import re
from pathlib import Path

from bs4 import BeautifulSoup
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import get_toc

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_TAG = "solution"
log = logging.getLogger("mkdocs.hooks.lab_site")

# nbconvert's lab template loads MathJax from a CDN on every page, and mermaid from a CDN when a
# page has a diagram. The notebooks use neither; a notebook that starts to is reported (vendor it then).
MATHJAX_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
MERMAID_BLOCK = re.compile(r"<script type=\"module\">(?:(?!</script>).)*?\.jp-Mermaid(?:(?!</script>).)*</script>",
                           re.S)
MATH = re.compile(r"(?<![\\$])\$[^$\s][^$\n]*\$|\\\(|\\\[|\$\$")
# What a browser fetches by itself on load: scripts, stylesheets and icons, images, frames, CSS urls.
REMOTE_FETCH = re.compile(r"<(?:script|img|iframe|source|video|audio)\b[^>]*\ssrc=[\"']?(?:https?:)?//"
                          r"|<link\b[^>]*\shref=[\"']?(?:https?:)?//"
                          r"|url\(\s*[\"']?(?:https?:)?//|@import\s+[\"'](?:https?:)?//", re.I)
# Sphinx roles in docstrings (:func:`x`): mkdocstrings renders them as text before the code span.
SPHINX_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc|obj):(<code>)~?")
# nbval's marker, the first line of a code cell: in the highlighted input and in the copy button's text.
NBVAL_MARKER = re.compile(r"(<pre><span></span>)<span class=\"c1\">#\s*NBVAL_[A-Z_]+</span>\n"
                          r"|(<div class=\"clipboard-copy-txt\"[^>]*>)#\s*NBVAL_[A-Z_]+\n")
NBVAL_LEFT = re.compile(r"<span class=\"c1\">#\s*NBVAL_[A-Z_]+")
# What a page's scripts would fetch later: a widget manager or other module from a public CDN.
REMOTE_LOADER = re.compile(r"https?://(?:unpkg\.com|cdn\.jsdelivr\.net|cdnjs\.cloudflare\.com)/[^\"'\s]*", re.I)
LOCAL_REF = re.compile(r"\s(src|href)=\"(?![a-z][a-z0-9+.-]*:|//|#)([^\"]+)\"", re.I)
# A widget output is a live view of a kernel's widget: a page cannot run it. One that carries a picture of
# itself (text/html, an image) shows that; one that carries only ipywidgets' repr ("VBox(children=...") shows
# WIDGET_NOTE instead.
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PICTURE_MIMES = ("text/html", "text/markdown", "image/png", "image/svg+xml", "image/jpeg")
# An output's embedded figure (matplotlib's PNG): docs/hooks.py writes it beside its page, to open at full size.
EMBEDDED_PNG = re.compile(r"data:image/png;base64,(?P<data>[A-Za-z0-9+/=\s]+)")
NOTEBOOK_BODY_CLASS = "lab-notebook"  # on a notebook page's <body>: docs/web/assets/site.css widens it
WIDGET_NOTE = ("An interactive widget: it runs live in JupyterLab (<code>make lab</code>), and this output holds "
               "no picture of it.")


def _settings(config) -> dict:
    return config.extra.get("lab_site") or {}


def _repo_files(patterns) -> list[str]:
    """Repository files matching the globs, as sorted POSIX paths from the repo root."""
    return sorted({p.relative_to(ROOT).as_posix() for pat in patterns for p in ROOT.glob(pat) if p.is_file()})


def _expand_nav(items):
    """Nav entries whose value is a glob become one entry per matching repository file."""
    if isinstance(items, list):
        out = []
        for item in items:
            expanded = _expand_nav(item)
            out.extend(expanded if isinstance(item, str) and isinstance(expanded, list) else [expanded])
        return out
    if isinstance(items, dict):
        return {k: _expand_nav(v) for k, v in items.items()}
    if isinstance(items, str) and "*" in items:
        found = _repo_files([items])
        if not found:
            log.warning(f"nav: no file matches {items!r}")
        return found
    return items


def on_config(config):
    if config.nav:
        config.nav = _expand_nav(config.nav)
    return config


def _add(files, rel: str, config) -> None:
    if files.get_file_from_path(rel) is not None:
        log.warning(f"{rel} is both in {config.docs_dir} and in extra.lab_site; keep one")
        return
    files.append(File(rel, src_dir=str(ROOT), dest_dir=config.site_dir, use_directory_urls=config.use_directory_urls))


# Before mkdocs-jupyter's on_files (priority 0), which turns the .ipynb files it sees into pages.
@event_priority(100)
def on_files(files, config):
    settings = _settings(config)
    for rel in _repo_files(settings.get("pages", []) + settings.get("assets", [])):
        _add(files, rel, config)
    return files


def _notebook_refs(html: str, page, files) -> str:
    """Check each relative src/href of a notebook page against the site's files; a link to a
    notebook or Markdown file is pointed at its page."""
    dest_uris = {f.dest_uri for f in files}
    base = posixpath.dirname(page.file.src_uri)

    def fix(m: re.Match) -> str:
        attr, url = m.group(1), m.group(2)
        path, frag = (url.split("#", 1) + [""])[:2]
        target = posixpath.normpath(posixpath.join(base, path))
        if target.endswith((".ipynb", ".md")):
            linked = files.get_file_from_path(target)
            if linked is not None and linked.is_documentation_page():
                return f' {attr}="{linked.url_relative_to(page.file)}{"#" + frag if frag else ""}"'
        elif target in dest_uris:
            return m.group(0)
        log.warning(f"{page.file.src_uri}: {attr}={url!r} points at {target}, which is not in the site")
        return m.group(0)

    return LOCAL_REF.sub(fix, html)


def _hide_solutions(html: str) -> str:
    """Each run of consecutive ``solution``-tagged cells goes inside one closed ``<details>``."""
    if f"celltag_{SOLUTION_TAG}" not in html:
        return html
    soup = BeautifulSoup(html, "html.parser")
    for tagged in soup.select(f".celltag_{SOLUTION_TAG}"):
        cell = tagged if "jp-Cell" in tagged.get("class", []) else tagged.find_parent(class_="jp-Cell")
        if cell is None or cell.find_parent("details", class_="solution") is not None:
            continue
        prev = cell.find_previous_sibling()
        if prev is not None and prev.name == "details" and "solution" in prev.get("class", []):
            prev.append(cell.extract())  # the previous cell was a solution too: one toggle for both
            continue
        details = soup.new_tag("details", attrs={"class": "solution"})
        summary = soup.new_tag("summary")
        summary.string = "Solution"
        cell.wrap(details)
        details.insert(0, summary)
    return str(soup)


def _bare_widget_reprs(path: str) -> set[str]:
    """The text/plain reprs of a notebook's widget outputs that carry no picture of themselves."""
    reprs = set()
    for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data and not any(m in data for m in PICTURE_MIMES):
                text = data.get("text/plain", "")
                reprs.add(("".join(text) if isinstance(text, list) else text).strip())
    return reprs - {""}


def _widget_notes(html: str, page) -> str:
    """Each widget output with no picture of itself shows :data:`WIDGET_NOTE`, not the widget's repr."""
    reprs = _bare_widget_reprs(page.file.abs_src_path)
    if not reprs:
        return html
    soup = BeautifulSoup(html, "html.parser")
    for out in soup.select('.jp-OutputArea-output[data-mime-type="text/plain"]'):
        if out.get_text().strip() in reprs:
            out.clear()
            note = soup.new_tag("p", attrs={"class": "lab-widget-note"})
            note.append(BeautifulSoup(WIDGET_NOTE, "html.parser"))
            out.append(note)
    return str(soup)


def _figure_links(html: str, page, config) -> str:
    """Every figure of a notebook page opens at full size: each output's embedded PNG is written beside the
    page (``notebooks/<name>/figure-<n>.png``) and shown from there, and each figure, a markdown cell's
    too, is a link to its file (browsers refuse to open a data: URL from a link)."""
    soup = BeautifulSoup(html, "html.parser")
    stem = posixpath.splitext(posixpath.basename(page.file.dest_uri))[0]
    folder = Path(config.site_dir) / posixpath.dirname(page.file.dest_uri) / stem
    count = 0
    for img in soup.select("img"):
        m = EMBEDDED_PNG.fullmatch(img.get("src", ""))
        if m is not None:
            count += 1
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"figure-{count}.png").write_bytes(base64.b64decode(m["data"]))
            img["src"] = f"{stem}/figure-{count}.png"
        if img.find_parent("a") is None and not img["src"].startswith("data:"):
            img.wrap(soup.new_tag("a", attrs={"href": img["src"], "class": "lab-figure",
                                              "title": "the figure at full size"}))
    return str(soup)


def _notebook_title(path: str) -> str | None:
    """A notebook's first ``# `` heading as plain text (mkdocs-jupyter drops its code spans)."""
    for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
        for line in source.splitlines():
            if line.startswith("# "):
                return line[2:].replace("`", "").strip()
    return None


def _strip_nbval_markers(html: str, page) -> str:
    """The code cells without their first-line nbval marker (the notebooks keep theirs)."""
    html = NBVAL_MARKER.sub(lambda m: m.group(1) or m.group(2), html)
    if NBVAL_LEFT.search(html):
        log.warning(f"{page.file.src_uri}: an nbval marker is left in a code cell (docs/hooks.py NBVAL_MARKER)")
    return html


def _headings_toc(html: str) -> list[dict]:
    """The markdown cells' headings (h1-h6 with an id) as mkdocs TOC tokens, nested by level. Their
    text keeps inline code, and each anchor is the heading's own id. (mkdocs-jupyter builds its TOC
    from a Markdown copy of the notebook with every code span cut out, so "5.2 `torch.cuda.graph`"
    read "5.2" and linked to an anchor the page does not have.)"""
    soup = BeautifulSoup(html, "html.parser")
    root: dict = {"level": 0, "children": []}
    stack = [root]
    for h in soup.select(", ".join(f".jp-MarkdownCell h{n}[id]" for n in range(1, 7))):
        for anchor in h.select("a.anchor-link"):
            anchor.decompose()
        text = " ".join(h.get_text().split())
        token = {"level": int(h.name[1]), "id": h["id"], "name": html_lib.escape(text, quote=False), "children": []}
        while stack[-1]["level"] >= token["level"]:
            stack.pop()
        stack[-1]["children"].append(token)
        stack.append(token)
    return root["children"]


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return SPHINX_ROLE.sub(r"\1", html)
    page.title = _notebook_title(page.file.abs_src_path) or page.title  # before any page's nav is drawn
    prose = " ".join(md.get_text() for md in BeautifulSoup(html, "html.parser").select(".jp-RenderedMarkdown"))
    if MATH.search(prose):
        log.warning(f"{page.file.src_uri}: has math, and the site vendors no MathJax (nbconvert loads it from a CDN)")
    html = MATHJAX_BLOCK.sub("", html)
    if '<div class="jp-Mermaid">' in html:
        log.warning(f"{page.file.src_uri}: has a mermaid diagram, and the site vendors no mermaid.js")
    html = MERMAID_BLOCK.sub("", html)
    page.toc = get_toc(_headings_toc(html))
    html = _strip_nbval_markers(_widget_notes(html, page), page)
    # the page's whole width for wide outputs: no navigation sidebar (the table of contents stays), and
    # site.css lifts the width limit under the body class on_post_page adds
    page.meta["hide"] = sorted({*page.meta.get("hide", []), "navigation"})
    return _figure_links(_hide_solutions(_notebook_refs(html, page, files)), page, config)


def on_post_page(output, page, config):
    if page.file.src_uri.endswith(".ipynb"):
        output = output.replace("<body ", f'<body class="{NOTEBOOK_BODY_CLASS}" ', 1)
    for m in REMOTE_FETCH.finditer(output):
        log.warning(f"{page.file.src_uri}: would fetch from the network: {output[m.start():m.start() + 120]!r}")
    for m in REMOTE_LOADER.finditer(output):
        log.warning(f"{page.file.src_uri}: a script would load {m.group(0)!r} from a CDN")
    return output


def on_post_build(config):
    # mkdocs does not check these (plugins may add theirs late): a missing one is a 404 on every page
    for asset in list(config.extra_css) + [str(js) for js in config.extra_javascript]:
        if "//" not in asset and not (Path(config.site_dir) / asset).is_file():
            log.warning(f"{asset} (extra_css / extra_javascript) is not in the site")
