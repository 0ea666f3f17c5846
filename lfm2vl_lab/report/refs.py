"""The reference set as the generated pages read it (:class:`Refs`: each role's file read once, and
the line that names a part's source files) and the formats of their cells. Every part module
(``tables_*``) builds on this; :mod:`.tables` finds the parts and writes the pages."""

from __future__ import annotations

from functools import wraps
from pathlib import Path

import pandas as pd

from ..measure.results import REPO_ROOT, RESULTS_ROOT
from .frames import frame, md
from .reference import REFERENCE_GPU, load, load_archived, load_manifest, manifest_path


class TableError(ValueError):
    """A page's markers are broken (unclosed, nested, unknown name), or a part cannot be drawn."""


class Refs:
    """The reference set of ``gpu`` under ``root``, each role's file read once."""

    def __init__(self, gpu: str = REFERENCE_GPU, root=RESULTS_ROOT):
        self.gpu, self.root = gpu, Path(root)
        self._cache: dict[str, dict] = {}

    @property
    def manifest(self) -> dict:
        man = load_manifest(self.gpu, self.root)
        if man is None:
            raise TableError(f"no reference set: {manifest_path(self.gpu, self.root)} is missing "
                             "(`python -m lfm2vl_lab record` on the GPU writes it)")
        return man

    def __call__(self, role: str, partial: bool = False) -> dict:
        """``role``'s file; ``partial``: a resumable role's partial file where it is not recorded whole."""
        if role not in self._cache:
            self._cache[role] = load(role, self.gpu, self.root, partial=partial)
        return self._cache[role]

    def frame(self, role: str, *cols: str, table: str = "rows") -> pd.DataFrame:
        """``role``'s ``table`` as a DataFrame (:func:`~lfm2vl_lab.report.frames.frame`), with ``cols``."""
        return need(frame(self(role), table), *cols)

    def has(self, role: str, partial: bool = False) -> bool:
        """Whether the set holds ``role`` (``partial``: or a partial file of it)."""
        man = self.manifest
        return role in man.get("files", {}) or (partial and role in man.get("partial", {}))

    def archived(self, name: str) -> dict:
        key = "archive/" + name
        if key not in self._cache:
            self._cache[key] = load_archived(name, self.gpu, self.root)
        return self._cache[key]

    def shown(self, res) -> str:
        """A result file's path (or the file itself) as a reader finds it: from the repo root where it
        lies in the repo, else from the results root's parent."""
        path = Path(res["_path"] if isinstance(res, dict) else res).resolve()
        try:
            return path.relative_to(REPO_ROOT).as_posix()
        except ValueError:
            return path.relative_to(self.root.resolve().parent).as_posix()

    def source(self, *roles: str) -> str:
        """``File: `…` (role …)`` for the roles a part reads, with the GPU and library versions."""
        parts = []
        for role in roles:
            res = self._cache.get(role) or self(role)
            parts.append(f"`{self.shown(res)}` (role `{role}`{', partial' if res.get('_partial') else ''})")
        prov = self(roles[0])["provenance"]
        return (("Files: " if len(roles) > 1 else "File: ") + ", ".join(parts)
                + f"; {prov.get('gpu')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
                f"recorded {str(prov.get('date'))[:10]}.")


def needs(role: str, missing: str, partial: bool = False):
    """A part drawn from ``role``'s file (``draw(refs, res)``; ``partial``: or a resumable role's partial
    file); where the set holds neither, the part is the line ``missing`` (which says what records it)."""
    def wrap(draw):
        @wraps(draw)
        def block(refs: Refs) -> str:
            return draw(refs, refs(role, partial=partial)) if refs.has(role, partial) else missing
        return block
    return wrap


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------

def missing(v) -> bool:
    """Whether a cell holds no value: None, or NaN (what a DataFrame puts where a row lacks a field)."""
    return v is None or (isinstance(v, float) and v != v)


def ms(v, digits: int = 2) -> str | None:
    return None if missing(v) else f"{v:.{digits}f}"


def times(v, digits: int = 1) -> str | None:
    return None if missing(v) else f"{v:.{digits}f}×"


def pct(v, digits: int = 1, sign: bool = False) -> str | None:
    return None if missing(v) else f"{100 * v:{'+' if sign else ''}.{digits}f}%"


def span(values, fmt=ms, unit: str = "") -> str:
    """``a–b`` (or one value where all are equal) of the formatted min and max."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def table(head: list[str], rows: list[list]) -> str:
    """Rows of cells under ``head`` as one of the pages' tables (:func:`~lfm2vl_lab.report.frames.md`)."""
    return md(pd.DataFrame(rows, columns=head, dtype=object))


def need(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """``df`` with every column of ``cols``, empty where its rows lack the field."""
    return df.reindex(columns=[*df.columns, *(c for c in cols if c not in df.columns)])


def preset_label(preset: str) -> str:
    """``lfm2-vl-450m`` → ``LFM2-VL-450M``."""
    return preset.upper()
