"""The library's own shape as goals (``goals-code``), measured from this tree, not the set: the report
layer's lines, and core's protocol's members against vLLM's eleven."""

from __future__ import annotations

import ast
from pathlib import Path

from .frames import Refs, facts

REPORT_DIR = Path(__file__).resolve().parent
REPORT_LIMIT_LINES = 1750  # half the ~3,500 lines that turned result files into pages when the goal was set
PROTOCOL_LIMIT = 12  # vLLM's SupportsEncoderCudaGraph has 11 methods; the kit's protocol adds its config
REPORT_GOAL = "the report layer (`lfm2vl_lab/report/`), lines"


def _modules() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(REPORT_DIR.glob("*.py"))}


def code_goals(refs: Refs | None = None) -> list[dict]:
    """The two goals, judged on this tree (``refs`` is not read: the shape of the code is not a GPU result)."""
    from ..core.protocol import protocol_members

    mods = _modules()
    lines, members = sum(t.count("\n") for t in mods.values()), len(protocol_members())
    return [{"target": REPORT_GOAL, "limit": REPORT_LIMIT_LINES, "value": lines, "ok": lines <= REPORT_LIMIT_LINES,
             "detail": f"{len(mods)} modules"},
            {"target": "core's protocol (`EncoderGraphModel`), members", "limit": PROTOCOL_LIMIT, "value": members,
             "ok": members <= PROTOCOL_LIMIT, "detail": "vLLM's `SupportsEncoderCudaGraph`: 11 methods"}]


def _is_phrase(node) -> bool:
    """An f-string, or a plain string with a space in it: words a page prints, not a key or a format."""
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)
                                                and " " in node.value.strip())


def line_kinds(text: str) -> dict[str, int]:
    """A module's lines by what they hold: ``docs`` (docstrings, comment lines, blank lines), ``wording``
    (a line with a phrase in a string literal: what the pages print) and ``code`` (the rest)."""
    tree = ast.parse(text)
    doc, words = set(), set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    for node in ast.walk(tree):
        if _is_phrase(node) and node.lineno not in doc:
            words.update(range(node.lineno, node.end_lineno + 1))
    kinds = {"docs": 0, "wording": 0, "code": 0}
    for i, line in enumerate(text.splitlines(), 1):
        bare = line.strip()
        kind = "docs" if i in doc or not bare or bare.startswith("#") else "wording" if i in words else "code"
        kinds[kind] += 1
    return kinds


def explain_report_layer(refs: Refs | None = None) -> str:
    """Where the report layer's lines are: its largest modules, and its lines by kind."""
    mods = _modules()
    sizes = sorted(((t.count("\n"), name) for name, t in mods.items()), reverse=True)
    kinds = {"docs": 0, "wording": 0, "code": 0}
    for text in mods.values():
        for k, v in line_kinds(text).items():
            kinds[k] += v
    return facts([["the five largest modules", ", ".join(f"`{name}` {n}" for n, name in sizes[:5])],
                  ["docstrings, comment and blank lines", f"{kinds['docs']:,}"],
                  ["lines with the pages' wording (a phrase in a string literal)", f"{kinds['wording']:,}"],
                  ["the rest (code)", f"{kinds['code']:,}"]])
