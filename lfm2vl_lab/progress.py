"""Progress bars: tqdm's widget bar where a notebook can draw it, its text bar everywhere else.

``tqdm.auto`` picks the widget bar whenever it runs inside a Jupyter kernel. Without ipywidgets
(which the kit does not require) it cannot draw one, warns ``TqdmWarning: IProgress not found``
into the cell that first imports it, and then falls back to the text bar anyway. Choosing the
text bar ourselves when ipywidgets is missing gives the same bar without the warning.

Use ``from lfm2vl_lab.progress import tqdm`` instead of ``from tqdm.auto import tqdm``.
"""

from __future__ import annotations

import importlib.util


def widgets_available() -> bool:
    """Whether ipywidgets can be imported, i.e. whether tqdm's notebook bar can be drawn."""
    return importlib.util.find_spec("ipywidgets") is not None


if widgets_available():
    from tqdm.auto import tqdm  # widget bar in a kernel, text bar in a terminal
else:
    from tqdm.std import tqdm  # what tqdm.auto would fall back to, minus its warning

__all__ = ["tqdm", "widgets_available"]
