"""The reference set as pandas DataFrames: each role's rows, one table to explore.

    >>> from lfm2vl_lab import frames
    >>> df = frames.load("bench-450m")
    >>> df.pivot_table(index="workload", columns="mode", values="median_ms", sort=False)
    >>> df.attrs["file"], df.attrs["provenance"]["gpu"]

:func:`load` reads one role's file (:func:`lfm2vl_lab.report.reference.load`) and returns its ``rows``
as a DataFrame: nested dicts become dotted columns (``phases_ms.encoder``, ``ttft_spread.p90``), lists
of samples stay lists in their cells, and the file's provenance travels in ``df.attrs`` (``provenance``,
``file``, ``role``, ``code_hash``), so a number shown from the frame can name where it came from.

Named ``frames``, not ``results``: :mod:`lfm2vl_lab.measure.results` is the module that *writes* result
files with their provenance. :func:`md` is the one Markdown writer of the generated pages
(:mod:`lfm2vl_lab.report.tables`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tabulate import DataRow, TableFormat

from ..measure.results import REPO_ROOT, RESULTS_ROOT
from . import reference
from .reference import REFERENCE_GPU, ReferenceError

DASH = "–"  # a missing cell in the pages' tables
# The pages' Markdown: no padding, a bare "|---|" rule; tabulate pads columns in every built-in format.
PAGE_TABLE = TableFormat(lineabove=None, linebelowheader=lambda widths, _aligns: "|" + "---|" * len(widths),
                         linebetweenrows=None, linebelow=None, headerrow=DataRow("|", "|", "|"),
                         datarow=DataRow("|", "|", "|"), padding=1, with_header_hide=None)


def shown_path(path) -> str:
    """A result file's path from the repo root where it lies in the repo, else as given."""
    path = Path(path).resolve()
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _table_of(res: dict, table: str):
    """``res[table]``, a dotted ``table`` reaching into sections (``reduce_overhead.rows``)."""
    part = res
    for key in table.split("."):
        if not isinstance(part, dict) or key not in part:
            lists = ", ".join(k for k, v in res.items() if isinstance(v, list) and not k.startswith("_")) or "none"
            raise ReferenceError(f"{Path(res.get('_path', '?')).name} has no table {table!r} (lists at its top: "
                                 f"{lists})")
        part = part[key]
    return part


def frame(res: dict, table: str = "rows") -> pd.DataFrame:
    """A loaded result file's ``table`` (a list of dicts; default its ``rows``) as a DataFrame, nested
    dicts flattened to dotted columns, provenance in ``attrs``. A file with no ``rows`` at all (``check``,
    ``graph-apis``: sections, not rows) gives one row of its sections, flattened the same way."""
    if table == "rows" and "rows" not in res:
        data = [{k: v for k, v in res.items() if k != "provenance" and not k.startswith("_")}]
    else:
        data = _table_of(res, table)
        if not isinstance(data, list):
            raise ReferenceError(f"{Path(res.get('_path', '?')).name}: {table!r} is a {type(data).__name__}, "
                                 "not a list of rows")
    df = pd.json_normalize(data) if data else pd.DataFrame()
    df.attrs.update(provenance=res.get("provenance", {}), file=shown_path(res["_path"]) if "_path" in res else None,
                    role=res.get("_role"), code_hash=res.get("_code_hash"), partial=bool(res.get("_partial")))
    return df


def load(role: str, table: str = "rows", gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> pd.DataFrame:
    """``role``'s file of the reference set as a DataFrame (:func:`frame`). A role the set lacks raises
    :class:`~lfm2vl_lab.report.reference.ReferenceError`, naming the roles there are."""
    return frame(reference.load(role, gpu, root), table)


def roles(gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> list[str]:
    """The roles of the reference set, in the order they were recorded."""
    return reference.roles(gpu, root)


def load_all(gpu: str = REFERENCE_GPU, root=RESULTS_ROOT) -> dict[str, pd.DataFrame]:
    """Every role's rows, by role (:func:`load`)."""
    return {role: load(role, gpu=gpu, root=root) for role in roles(gpu, root)}


def md(df: pd.DataFrame) -> str:
    """``df`` as one of the pages' Markdown tables (``to_markdown``): cells as they are, no padding,
    a missing cell (None, NaN) as a dash, the index left out."""
    cells = df.astype(object).where(df.notna(), DASH)
    return cells.to_markdown(index=False, tablefmt=PAGE_TABLE, stralign=None, numalign=None, disable_numparse=True)
