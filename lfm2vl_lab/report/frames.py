"""The reference set as pandas DataFrames (``load("bench-450m")``), and what the generated pages share:
:class:`Refs`, :func:`part` (a part declared as data, drawn by one renderer), the cell formats, and
:func:`pick_rows` (rows of two runs for one bar are refused as :class:`MixedRuns`, never silently picked)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
from tabulate import DataRow, TableFormat

from ..measure.modes import row_labels
from ..measure.results import REPO_ROOT, RESULTS_ROOT
from . import reference
from .reference import REFERENCE_GPU, load_manifest, manifest_path

# The pages' Markdown: no padding, a bare "|---|" rule; tabulate pads columns in every built-in format.
PAGE_TABLE = TableFormat(lineabove=None, linebelowheader=lambda widths, _aligns: "|" + "---|" * len(widths),
                         linebetweenrows=None, linebelow=None, headerrow=DataRow("|", "|", "|"),
                         datarow=DataRow("|", "|", "|"), padding=1, with_header_hide=None)


def shown_path(path, base=None) -> str:
    """A result file's path from the repo root where it lies in the repo, else from ``base`` (else as given)."""
    path = Path(path).resolve()
    for root in (REPO_ROOT, base):
        if root is not None and path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return str(path)


def frame(res: dict) -> pd.DataFrame:
    """A loaded file's ``rows`` as a DataFrame, nested dicts as dotted columns, provenance in ``attrs``; a
    file without rows (``check``) gives one row of its sections."""
    sections = {k: v for k, v in res.items() if k != "provenance" and not k.startswith("_")}
    data = res["rows"] if "rows" in res else [sections]
    df = pd.json_normalize(data) if data else pd.DataFrame()
    df.attrs.update(provenance=res.get("provenance", {}), file=shown_path(res["_path"]) if "_path" in res else None,
                    role=res.get("_role"), code_hash=res.get("_code_hash"))
    return df


def load(role: str, gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> pd.DataFrame:
    """``role``'s file of the reference set as a DataFrame (:func:`frame`); a role the set lacks raises."""
    return frame(reference.load(role, gpu, root))


def md(df: pd.DataFrame) -> str:
    """``df`` as one of the pages' Markdown tables: no padding, a missing cell as a dash, no index."""
    cells = df.astype(object).where(df.notna(), "–")
    return cells.to_markdown(index=False, tablefmt=PAGE_TABLE, stralign=None, numalign=None, disable_numparse=True)


class TableError(ValueError):
    """A page's markers are broken (unclosed, nested, unknown name), or a part cannot be drawn."""


class Refs:
    """The reference set of ``gpu`` under ``root``, each role's file read once."""

    def __init__(self, gpu: str = REFERENCE_GPU, root=RESULTS_ROOT):
        self.gpu, self.root, self._cache = gpu, Path(root), {}

    @property
    def manifest(self) -> dict:
        if (man := load_manifest(self.gpu, self.root)) is None:
            raise TableError(f"no reference set: {manifest_path(self.gpu, self.root)} is missing "
                             "(`python -m lfm2vl_lab record` on the GPU writes it)")
        return man

    def __call__(self, role: str) -> dict:
        if role not in self._cache:
            self._cache[role] = reference.load(role, self.gpu, self.root)
        return self._cache[role]

    def has(self, role: str) -> bool:
        return role in self.manifest.get("files", {})

    def source(self, *roles: str) -> str:
        """``File: `…` (role …)`` for the roles a part reads, with the GPU and versions; none: the manifest."""
        base = self.root.resolve().parent
        if not roles:
            return f"Manifest: `{shown_path(manifest_path(self.gpu, self.root), base)}`."
        parts = ", ".join(f"`{shown_path(self(r)['_path'], base)}` (role `{r}`)" for r in roles)
        prov = self(roles[0])["provenance"]
        return (("Files: " if len(roles) > 1 else "File: ") + parts
                + f"; {prov.get('gpu')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
                f"recorded {str(prov.get('date'))[:10]}.")


def part(roles: tuple[str, ...], body: Callable, missing: str = "") -> Callable[[Refs], str]:
    """A generated part as data, drawn by one renderer so that a page's tables all read and cite alike: what
    it shows (``body(refs)``: a DataFrame, a line, or a list of them), then the files of the ``roles`` it
    reads; where the set lacks the first role, the line ``missing`` instead, which says what records it."""
    def draw(refs: Refs) -> str:
        if roles and not refs.has(roles[0]):
            return missing or f"_Not in this reference set: `python -m lfm2vl_lab record` records role `{roles[0]}`._"
        return render(body(refs), roles and refs.source(roles[0], *[r for r in roles[1:] if refs.has(r)]))
    return draw


def render(*pieces) -> str:
    """Pieces of a page (or lists of them): a DataFrame as one of its tables, a line as it is, none if empty."""
    flat = [q for p in pieces for q in (p if isinstance(p, list) else [p])]
    return "\n\n".join(md(p) if isinstance(p, pd.DataFrame) else p for p in flat if isinstance(p, pd.DataFrame) or p)


def records(rows: Iterable[dict], cols: dict) -> pd.DataFrame:
    """``rows`` as a table, declared per column: ``cols`` maps each header to a key of the row (dotted: into
    nested dicts), to ``(key, format)``, or to a function of the row. A missing value is never formatted."""
    def cell(r: dict, col):
        if callable(col):
            return col(r)
        key, fmt = (col, None) if isinstance(col, str) else col
        v = r.get(key, r)  # a DataFrame's records hold the dotted key itself
        for k in key.split(".") if v is r else ():
            v = v.get(k) if isinstance(v, dict) else None
        return v if fmt is None or missing(v) else fmt(v)
    return pd.DataFrame([[cell(r, c) for c in cols.values()] for r in rows], columns=list(cols), dtype=object)


def missing(v) -> bool:
    """Whether a cell holds no value: None, or NaN (what a DataFrame puts where a row lacks a field)."""
    return v is None or (isinstance(v, float) and v != v)


def ms(v, digits: int = 2) -> str | None:  # the formats of the pages' cells
    return None if missing(v) else f"{v:.{digits}f}"


def times(v, digits: int = 1) -> str | None:
    return None if missing(v) else f"{v:.{digits}f}×"


def pct(v, digits: int = 1) -> str | None:
    return None if missing(v) else f"{100 * v:.{digits}f}%"


def verdict(ok, yes: str = "yes", no: str = "no") -> str:
    """A check's cell: ``yes``, or ``no`` in bold, so that a failure stands out."""
    return yes if ok else f"**{no}**"


def table(head: list[str], rows: list[list]) -> pd.DataFrame:
    """Rows of cells under ``head``, one of the pages' tables once drawn (:func:`render`)."""
    return pd.DataFrame(rows, columns=head, dtype=object)


def need(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """``df`` with every column of ``cols``, empty where its rows lack the field."""
    return df.reindex(columns=[*df.columns, *(c for c in cols if c not in df.columns)])


def preset_label(preset: str) -> str:
    """``lfm2-vl-450m`` → ``LFM2-VL-450M``."""
    return preset.upper()


# Which row of a run a figure or table shows: the defaults' (as a row of the default settings names them)
_DEFAULT_ROW = row_labels("lab-graph")
GRAPH_SETTINGS = ("budget_set", "cu_rule", "max_seqlen_mode")
# The kit's kernel options and their defaults; a row without the key ran before the option existed (off)
KERNEL_OPTIONS = {k: _DEFAULT_ROW[k] for k in ("fuse_qkv", "fuse_elementwise", "dense_graphs")}


class MixedRuns(ValueError):
    """Rows of more than one run for one bar or point, which a figure must not mix."""


def is_default_config(row: dict, ignore=()) -> bool:
    """Whether a result row ran the kit's defaults: graph settings, attention backend and, for the lab
    modes, :data:`KERNEL_OPTIONS` but those in ``ignore`` (files recorded across a change of default)."""
    graph_ok = row.get("budget_set") is None or all(row.get(k) == _DEFAULT_ROW[k] for k in GRAPH_SETTINGS)
    lab = row.get("mode") in ("lab-eager", "lab-graph", "lab-graph-fused")
    opts_ok = not lab or all(bool(row.get(k, False)) == v for k, v in KERNEL_OPTIONS.items()
                             if k not in ignore and (k != "dense_graphs" or row.get("mode") == "lab-graph"))
    return graph_ok and opts_ok and row.get("attention") in (None, "auto", "varlen")  # the default backends


def one_per(rows: Iterable[dict], key: Callable[[dict], tuple], what: str, rank=None) -> list[dict]:
    """One row per ``key(row)`` in first-seen order, the one of highest ``rank``; a tie at the top is rows
    of several runs, refused as :class:`MixedRuns`."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append((rank(r) if rank else (), r))
    for k, scored in groups.items():
        if [s for s, _ in scored].count(max(s for s, _ in scored)) > 1:
            raise MixedRuns(f"{what}: several rows of equal standing for {k}: rows of more than one run, or "
                            "several configurations and none the default? draw one run's rows")
    return [max(scored, key=lambda sr: sr[0])[1] for scored in groups.values()]


def pick_rows(rows: list[dict]) -> list[dict]:
    """One row per (mode, workload) of one run's timed rows: the default configuration's, else the default
    graph settings' (rows recorded before a kernel option existed carry none), then a profiled one."""
    def rank(r: dict) -> tuple:
        return is_default_config(r), is_default_config(r, tuple(KERNEL_OPTIONS)), r.get("gpu_busy_ms") is not None
    return one_per((r for r in rows if r.get("median_ms") is not None), lambda r: (r.get("mode"), r.get("workload")),
                   "pick_rows", rank=rank)
