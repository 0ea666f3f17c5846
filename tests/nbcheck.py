"""nbval's output check (``pytest --nbval-lax``) on a notebook that something else executed.

tests/test_jupyterlab.py runs every notebook in JupyterLab and saves it; ``output_mismatches`` then
compares the saved copy with the committed notebook as nbval 0.11 would have compared a run of its
own, so each notebook executes once per ``make test``. The rules are nbval's (``nbval/plugin.py``),
and its own helpers are used where it has them:

- a code cell is checked when its source has the comment ``# NBVAL_CHECK_OUTPUT`` or its metadata the
  tag ``nbval-check-output`` (lax mode: every other cell only has to run); markers in comments win
  over tags, and the last marker of a kind wins (``NBVAL_IGNORE_OUTPUT`` after it turns it off);
- a committed cell that never ran (no ``execution_count``) is not compared, and fails when it has
  outputs;
- stream outputs of one name are merged and their ``\\r`` and ``\\b`` applied (``coalesce_streams``);
- outputs are flattened to lists of values per key (``stdout``, ``stderr``, each MIME type of
  ``data``, ``ename``, ``evalue``), leaving out ``SKIP_COMPARE``; both sides need the same keys and,
  per key, the same values in the same order;
- no sanitising: nbval applies regexes only from ``--nbval-sanitize-with``, which ``make test`` does
  not pass (the repository has no such file).

``NBVAL_SKIP`` and ``NBVAL_RAISES_EXCEPTION`` have no meaning in JupyterLab, where Run All runs every
cell and stops at the first error: ``checked_cells`` refuses notebooks that use them.
"""

from __future__ import annotations

import copy
import difflib
from collections import defaultdict


def _nbval():
    """nbval's plugin module, imported on first use: this helper loads where nbval is missing (the GPU
    image has no Jupyter), and only a comparison needs it."""
    from nbval import plugin

    return plugin


# nbval's IPyNbFile.skip_compare without --nbdime: keys it never compares (a widget's model id is random,
# images differ by renderer and machine).
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")


def _options(cell) -> dict:
    """nbval's options for one code cell: metadata tags first, comment markers over them."""
    nbval = _nbval()
    options = defaultdict(bool, nbval.find_metadata_tags(cell.get("metadata", {})))
    options.update(dict(nbval.find_comment_markers(cell.source)))
    return options


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def checked_cells(nb) -> list[int]:
    """0-based indices, among the code cells, of the cells whose outputs ``--nbval-lax`` compares."""
    checked = []
    for i, cell in enumerate(code_cells(nb)):
        options = _options(cell)
        unsupported = [k for k in ("skip", "check_exception") if options[k]]
        if unsupported:
            raise ValueError(f"code cell {i}: nbval option {unsupported} has no equivalent in a Run All in JupyterLab")
        if options["check"]:
            checked.append(i)
    return checked


def _by_key(outputs) -> dict[str, list]:
    """Outputs as nbval compares them: every value of every compared key, in output order."""
    nbval, flat = _nbval(), defaultdict(list)
    for out in nbval.transform_streams_for_comparison(nbval.coalesce_streams(copy.deepcopy(list(outputs)))):
        for key, value in out.items():
            if key in SKIP_COMPARE:
                continue
            if key == "data":
                for mime, shown in value.items():
                    if mime not in SKIP_COMPARE:
                        flat[mime].append(shown)
            else:
                flat[key].append(value)
    return flat


def _diff(expected, got) -> str:
    if not (isinstance(expected, str) and isinstance(got, str)):
        return f"  committed: {expected!r}\n  this run:  {got!r}"
    lines = difflib.unified_diff(expected.splitlines(keepends=True), got.splitlines(keepends=True),
                                 "committed", "this run", lineterm="")
    return "".join(f"  {line}" if line.endswith("\n") else f"  {line}\n" for line in lines)


def compare_outputs(ran_outputs, committed_outputs) -> str | None:
    """Why nbval would find one cell's outputs different (``None`` when it would not)."""
    got, expected = _by_key(ran_outputs), _by_key(committed_outputs)
    if set(expected) - set(got):
        return f"missing output fields: {sorted(set(expected) - set(got))}"
    if set(got) - set(expected):
        return f"unexpected output fields: {sorted(set(got) - set(expected))}"
    for key, values in expected.items():
        if len(got[key]) != len(values):
            return f"{len(got[key])} outputs for {key!r}, the committed notebook has {len(values)}"
        for want, have in zip(values, got[key]):
            if want != have:
                return f"{key!r} differs:\n{_diff(want, have)}"
    return None


def output_mismatches(ran, committed) -> list[str]:
    """What ``pytest --nbval-lax`` would fail on in ``committed`` if its run had produced the outputs of
    ``ran`` (the same notebook, executed and saved): one line (and a diff) per failing cell."""
    ran_cells, committed_cells = code_cells(ran), code_cells(committed)
    if len(ran_cells) != len(committed_cells):
        return [f"the run has {len(ran_cells)} code cells, the committed notebook {len(committed_cells)}"]
    problems = []
    for i, cell in enumerate(committed_cells):
        if cell.get("execution_count") is None and cell.get("outputs"):
            problems.append(f"code cell {i}: never ran in the committed notebook, yet has outputs")
    for i in checked_cells(committed):
        if committed_cells[i].get("execution_count") is None:
            continue
        why = compare_outputs(ran_cells[i].get("outputs", []), committed_cells[i].get("outputs", []))
        if why is not None:
            problems.append(f"code cell {i} (NBVAL_CHECK_OUTPUT): {why}")
    return problems
