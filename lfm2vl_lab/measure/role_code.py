"""Which code a role of the reference set measures, and whether the working tree still holds it.

A role's numbers depend on the modules its command runs, not on the whole package: a new table or
figure changes no timing, and a change to ``check`` moves no benchmark. So each role names its code:
the import closure of the modules its command runs (:data:`COMMAND_MODULES`), found by reading their
``import`` statements (function-level ones included), the C++ sources its modules build
(:data:`BUILT_SOURCES`), plus the files every command runs (:data:`ALWAYS`: the dispatcher) and the
presets. Three rules keep the closure to what makes numbers:

* a package's ``__init__.py`` is part of it (importing a module runs it), but the names it re-exports
  are not followed: ``lfm2vl_lab/__init__.py`` re-exports the whole public API, and a benchmark of the
  encoder does not run the text engine because the package *could* import it;
* the report layer (:data:`REPORT`) is left out: a command may print its summary through it, but it
  reads files and makes no number;
* a dispatcher (:data:`ALWAYS`) is hashed as a file, its imports not followed, also where a command's
  module imports it: ``cli/cli.py`` and ``cli/cli_options.py`` hold each command's options and
  defaults, and reach every command.

A file whose bytes changed still makes the same numbers when only its comments, blank lines or
docstrings changed: :func:`code_id` (its syntax tree without docstrings) is then the same, and
:func:`changed_files` does not count it. The two dispatchers that hold every command's options
(:data:`DISPATCHERS`) are compared per command: a role counts one as changed only where what its own
command reaches in it changed (:func:`command_part`), so a new option of ``record`` moves no role.
Both comparisons need the recorded version's bytes, which the entry names by blob id: git has them in
a clone; a device call, which gets the working tree without its history, reads them from
:data:`BLOBS` (``scripts/carry_blobs.py`` writes that folder, carried with the call). Where neither
has them, the file counts as changed.

The role's *hash* is the kit's code hash (:func:`~lfm2vl_lab.measure.results.hash_code_entries`: path and
git blob id of each file) over just those files. ``record`` stores it with the file list in each
role's manifest entry with each file's blob id, and ``record --changed`` re-runs the roles whose hash
the working tree no longer gives (:func:`changed_files` says which files moved it).
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path

from .results import REPO_ROOT, blob_sha1, hash_code_entries

PACKAGE = "lfm2vl_lab"
# The modules each command runs (the argv[0] of a record step): its measuring code and, where the
# command has one, its own CLI module.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "bench": ("lfm2vl_lab.measure.bench",),
    "check": ("lfm2vl_lab.measure.check",),
    "attention": ("lfm2vl_lab.measure.attention_probe",),
    "graph-apis": ("lfm2vl_lab.cli.cli_graph_apis",),
    "ttft": ("lfm2vl_lab.cli.cli_serving",),
    "e2e": ("lfm2vl_lab.cli.cli_serving",),
    "engine": ("lfm2vl_lab.cli.cli_engine",),
    "vllm": ("lfm2vl_lab.cli.cli_vllm",),
    "pipeline": ("lfm2vl_lab.cli.cli_pipeline",),
    "roofline": ("lfm2vl_lab.cli.cli_roofline",),
}
# Run by every command, hashed as files: the entry point and the dispatcher with every command's options.
ALWAYS = ("lfm2vl_lab/__init__.py", "lfm2vl_lab/__main__.py", "lfm2vl_lab/cli/__init__.py",
          "lfm2vl_lab/measure/__init__.py", "lfm2vl_lab/cli/cli.py", "lfm2vl_lab/cli/cli_options.py")
# The dispatchers among them, compared per command (:func:`command_part`): the root names of a command
# in each. cli.py runs main → build_parser, which calls every command's add_args, then the command's own
# SUBCOMMANDS entry; cli_options.py holds each command's add_<command>_args (tests/test_role_code.py
# checks the names against cli.SUBCOMMANDS).
DISPATCHERS: dict[str, object] = {
    "lfm2vl_lab/cli/cli.py": lambda command: ("main", "build_parser", "_help", ("SUBCOMMANDS", command)),
    "lfm2vl_lab/cli/cli_options.py": lambda command: (f"add_{command.replace('-', '_')}_args",),
}
PRESETS = "data/presets"
# The C++ sources a module compiles and runs (no import statement names them): a role whose closure holds
# the module measures them too. Every *.cpp of the package is named here (tests/test_role_code.py).
BUILT_SOURCES: dict[str, tuple[str, ...]] = {
    "lfm2vl_lab/core/ptrcheck.py": ("lfm2vl_lab/core/ptrcheck.cpp",),  # the weight stamp's per-call check
}
# The report layer reads result files and makes no number (measure/ never imports it: tests/test_layers.py);
# a command may print its summary through it after the run, which moves nothing it recorded.
REPORT = "lfm2vl_lab.report"


# Recorded versions of measured files, by blob id, for a tree without git history (a device call's):
# scripts/carry_blobs.py writes them, git ignores the folder.
BLOBS = ".blobs"


def module_path(name: str, root: Path = REPO_ROOT) -> str | None:
    """The repo-relative file of module ``name`` (a package's ``__init__.py``), or None where the name
    is no module of the kit (a function or class imported ``from`` a module)."""
    if name.split(".")[0] != PACKAGE:
        return None
    base = name.replace(".", "/")
    for rel in (f"{base}/__init__.py", f"{base}.py"):
        if (Path(root) / rel).is_file():
            return rel
    return None


def imported_modules(name: str, root: Path = REPO_ROOT) -> set[str]:
    """The kit's modules that module ``name`` imports anywhere in its body (``import a.b``, ``from .x
    import y`` with ``y`` itself a module or not)."""
    rel = module_path(name, root)
    tree = ast.parse((Path(root) / rel).read_text(), rel)
    package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if module_path(m, root) is not None}


def command_modules(command: str) -> tuple[str, ...]:
    """The modules ``python -m lfm2vl_lab <command>`` runs (:data:`COMMAND_MODULES`)."""
    if command not in COMMAND_MODULES:
        raise KeyError(f"no modules are named for the command {command!r}: add it to COMMAND_MODULES "
                       f"(known: {', '.join(COMMAND_MODULES)})")
    return COMMAND_MODULES[command]


def measured_files(modules, root: Path = REPO_ROOT) -> list[str]:
    """Every file (repo-relative) whose content can move the numbers of code that runs ``modules``:
    their closure (see the module), the C++ sources it builds (:data:`BUILT_SOURCES`), :data:`ALWAYS`
    and the presets, sorted."""
    seen: set[str] = set()
    todo = list(modules)
    files = set(ALWAYS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.startswith(REPORT):  # what a command prints of its file after the run: no number moves
            continue
        files.add(module_path(name, root))
        if module_path(name, root) in ALWAYS:  # a dispatcher a command module imports: hashed, not followed
            continue
        parts = name.split(".")
        files |= {p for p in (module_path(".".join(parts[:i]), root) for i in range(1, len(parts))) if p}
        todo += sorted(imported_modules(name, root))
    files |= {src for f in files for src in BUILT_SOURCES.get(f, ())}
    files |= {p.relative_to(root).as_posix() for p in (Path(root) / PRESETS).glob("*.json")}
    return sorted(files)


def blob_ids(files, root: Path = REPO_ROOT) -> dict[str, str]:
    """Each file's git blob id as it is under ``root`` ("missing" for a file that is not there)."""
    return {f: blob_sha1((Path(root) / f).read_bytes()) if (Path(root) / f).is_file() else "missing"
            for f in files}


def role_code(modules, root: Path = REPO_ROOT) -> dict:
    """What a role whose command runs ``modules`` stores of its code: ``measures`` (each file it
    measures, with its blob id) and ``role_hash``, the code hash of just those files."""
    measures = blob_ids(measured_files(modules, root), root)
    return {"role_hash": hash_code_entries(measures.items()), "measures": measures}


def code_id(data: bytes, path: str) -> str:
    """What of a file can move a number. A Python module: its syntax tree without docstrings (no
    comments, blank lines or positions are in it), so an edit of those alone keeps the id. Any other
    file (C++, a preset): its bytes. A module that does not parse: its bytes too."""
    if path.endswith(".py"):
        try:
            tree = ast.parse(data)
        except SyntaxError:
            return blob_sha1(data)
        return "ast:" + hashlib.sha1(ast.dump(_strip_docstrings(tree)).encode()).hexdigest()
    return blob_sha1(data)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _bindings(tree: ast.Module) -> tuple[dict[str, list[ast.AST]], list[ast.AST]]:
    """A module's top-level names, each with the statements that bind it (an import binds each of its
    names apart: an ``ast.alias`` of its own), and the top-level statements that bind none."""
    names: dict[str, list[ast.AST]] = {}
    rest: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                one = ast.ImportFrom(node.module, [a], node.level) if isinstance(node, ast.ImportFrom) else \
                    ast.Import([a])
                names.setdefault(a.asname or a.name.split(".")[0], []).append(one)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.setdefault(n.id, []).append(node)
        else:
            rest.append(node)
    return names, rest


def _entry(node: ast.AST, key: str) -> ast.AST:
    """Of a dict assigned at module level (``SUBCOMMANDS = {...}``), the item ``key`` alone."""
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    if not isinstance(value, ast.Dict):
        return node
    items = [(k, v) for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant) and k.value == key]
    return ast.Dict([k for k, _ in items], [v for _, v in items])


def command_part(data: bytes, path: str, command: str) -> str | None:
    """What of dispatcher ``path`` (:data:`DISPATCHERS`) can move the numbers of ``command``: the
    top-level statements its roots reach by name, each dict root reduced to the command's own item,
    and every statement that binds no name; docstrings left out, as in :func:`code_id`. None where the
    file does not parse."""
    try:
        tree = _strip_docstrings(ast.parse(data))
    except SyntaxError:
        return None
    names, rest = _bindings(tree)
    todo, seen, parts = list(DISPATCHERS[path](command)), set(), []
    keyed = dict(r for r in todo if isinstance(r, tuple))  # a dict root is its command's item wherever named
    while todo:
        root = todo.pop()
        name, key = root if isinstance(root, tuple) else (root, keyed.get(root))
        if (name, key) in seen:
            continue
        seen.add((name, key))
        for node in names.get(name, []):
            node = _entry(node, key) if key is not None else node
            parts.append(f"{name}[{key}]: {ast.dump(node)}")
            todo += sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {name})
    parts += [ast.dump(node) for node in rest]
    return "part:" + hashlib.sha1("\n".join(sorted(parts)).encode()).hexdigest()


def recorded_bytes(blob: str, root: Path = REPO_ROOT) -> bytes | None:
    """The bytes of blob ``blob`` (a recorded version of a file): from git where ``root`` is a clone,
    else from :data:`BLOBS`; None where neither has it."""
    try:
        out = subprocess.run(["git", "-C", str(root), "cat-file", "blob", blob], capture_output=True, timeout=30)
        if out.returncode == 0 and blob_sha1(out.stdout) == blob:
            return out.stdout
    except (OSError, subprocess.SubprocessError):
        pass
    kept = Path(root) / BLOBS / blob
    return kept.read_bytes() if kept.is_file() and blob_sha1(kept.read_bytes()) == blob else None


def same_code(path: str, blob: str, root: Path = REPO_ROOT, command: str | None = None) -> bool:
    """Whether ``path`` under ``root`` makes the numbers its recorded version (``blob``) made: the
    same :func:`code_id`, or for a dispatcher and a role's ``command``, the same :func:`command_part`.
    False where that version's bytes cannot be read."""
    then, now = recorded_bytes(blob, root), Path(root) / path
    if then is None or not now.is_file():
        return False
    if command and path in DISPATCHERS:
        part = command_part(then, path, command)
        return part is not None and part == command_part(now.read_bytes(), path, command)
    return code_id(then, path) == code_id(now.read_bytes(), path)


def entry_command(entry: dict) -> str | None:
    """The command (``bench``, ``ttft``, ...) a manifest entry's role ran: its ``command``'s word after
    ``python -m lfm2vl_lab``; None where it names none."""
    words = str(entry.get("command", "")).split()
    return words[3] if words[:3] == ["python", "-m", PACKAGE] and len(words) > 3 else None


def changed_files(entry: dict, modules, root: Path = REPO_ROOT) -> list[str] | None:
    """The files that make a manifest entry's role stale in the tree under ``root``: changed (beyond
    comments and docstrings: :func:`same_code`), new in the role's closure, or gone from it. Empty: the
    role is current. None: the entry names no code of its own (a set recorded before roles did), so
    every role of it counts as changed."""
    if "role_hash" not in entry:
        return None
    now = role_code(modules, root)
    if now["role_hash"] == entry["role_hash"]:
        return []
    then = entry.get("measures", {})
    moved = [f for f in set(then) | set(now["measures"]) if then.get(f) != now["measures"].get(f)]
    command = entry_command(entry)
    return sorted(f for f in moved if f not in then or f not in now["measures"]
                  or not same_code(f, then[f], root, command))
