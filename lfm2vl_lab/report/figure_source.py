"""A figure's source in its own PNG: a ``Source`` text chunk listing the result file(s), role(s) and
code hash it was drawn from, which ``report --check`` holds against the set. Nothing else in the PNG
changes between runs (no ``Software`` chunk, no date), and a redraw with the same text chunks and decoded
pixels leaves the file untouched (zlib builds compress differently), so ``report`` keeps ``git status`` clean."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

SOURCE_KEY = "Source"  # the PNG text chunk that names the figure's files
DPI = 120  # what `python -m lfm2vl_lab report` saves at (MAX_WIDTH_IN inches is 1440 px)


class NoSource(ValueError):
    """A PNG that names no source file (drawn before figures carried their source, or not by the kit)."""


def source_of(res: dict) -> dict:
    """The ``Source`` entry of one loaded result file: its name, role (None outside a set) and the code
    hash that recorded it (the manifest's, else the file's own)."""
    code = res.get("_code_hash") or res.get("provenance", {}).get("code_hash")
    return {"file": Path(res["_path"]).name, "role": res.get("_role"), "code_hash": code}


def png_bytes(fig, sources: list[dict], dpi: int = DPI) -> bytes:
    """``fig`` as PNG bytes with its ``Source`` chunk and no ``Software`` chunk."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None, SOURCE_KEY: json.dumps(sources)})
    return buf.getvalue()


def _content(data: bytes) -> tuple:
    """What a PNG shows and says: its text chunks and decoded pixels, not its compressed bytes."""
    with Image.open(io.BytesIO(data)) as im:
        return dict(im.text), im.mode, im.size, im.tobytes()


def save_figure(fig, path: Path, sources: list[dict], dpi: int = DPI) -> bool:
    """Save ``fig`` at ``path`` with its sources (:func:`source_of` entries), unless a file with the same
    content is there already. Returns whether the file was written."""
    data, path = png_bytes(fig, sources, dpi), Path(path)
    if path.is_file() and _content(path.read_bytes()) == _content(data):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def read_sources(path: Path) -> list[dict]:
    """The ``Source`` entries a PNG carries; :class:`NoSource` naming the file where it has none."""
    with Image.open(path) as im:
        text = im.text.get(SOURCE_KEY) or "null"
    try:
        sources = json.loads(text)
    except ValueError:
        sources = None
    if not (isinstance(sources, list) and sources and all(isinstance(s, dict) and s.get("file") for s in sources)):
        raise NoSource(f"{Path(path).name} names no source file (no PNG text chunk {SOURCE_KEY!r})")
    return sources
