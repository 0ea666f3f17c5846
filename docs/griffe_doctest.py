"""Griffe extension for the API page (mkdocs.yml, mkdocstrings ``extensions``): a docstring's ``>>>``
examples become ``pycon`` code blocks. As Markdown they would render as nested block quotes, with
their line breaks lost.
"""

from __future__ import annotations

import re

import griffe

# A prompt line, then every line up to the next blank one (more prompts, continuations, output).
DOCTEST = re.compile(r"^>>> .*(?:\n(?!\s*$).*)*", re.M)


def fence_doctests(text: str) -> str:
    """Wrap each ``>>>`` example of a (dedented) docstring in a fenced ``pycon`` block."""
    return DOCTEST.sub(lambda m: f"```pycon\n{m.group(0)}\n```", text)


class DoctestBlocks(griffe.Extension):
    """Fence the ``>>>`` examples of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
