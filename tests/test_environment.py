"""pyproject.toml, environment.yml and the Makefile name the same packages."""

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def norm_name(req: str) -> str:
    """PEP 503 name of a requirement string ('Foo_Bar[x]>=1' → 'foo-bar')."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert m, f"cannot read a package name from {req!r}"
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def norm_req(req: str) -> tuple[str, str]:
    """(name, specifier without spaces, comparisons sorted) of a requirement string."""
    name = norm_name(req)
    rest = re.sub(r"^\s*[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?", "", req)
    spec = ",".join(sorted(s for s in rest.replace(" ", "").split(",") if s))
    return name, spec


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def env_yml_lines(text: str | None = None) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip entries) of environment.yml (or ``text``) by simple line parsing
    (no YAML library needed)."""
    text = (ROOT / "environment.yml").read_text() if text is None else text
    conda, pip, in_deps, pip_indent = [], [], False, None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        text = line.strip()
        if indent == 0:
            in_deps = text == "dependencies:"
            pip_indent = None
            continue
        if not in_deps or not text.startswith("- "):
            continue
        item = text[2:].strip()
        if pip_indent is not None and indent > pip_indent:
            pip.append(item)
            continue
        pip_indent = None
        if item == "pip:":
            pip_indent = indent
        else:
            conda.append(item)
    return conda, pip


def installed_extras(pip: list[str]) -> list[str]:
    """The extras environment.yml installs with the package (``-e .[test]`` → ``["test"]``)."""
    return [x.strip() for r in pip if r.startswith("-e .") for x in re.findall(r"\[([^\]]*)\]", r)[0].split(",")]


def project_reqs() -> list[str]:
    """pyproject's runtime dependencies plus the extras environment.yml installs."""
    p = pyproject()["project"]
    extras = installed_extras(env_yml_lines()[1])
    return list(p["dependencies"]) + [r for x in extras for r in p["optional-dependencies"][x]]


def env_pip_reqs(text: str | None = None) -> list[str]:
    _, pip = env_yml_lines(text)
    return [r for r in pip if not r.startswith("-")]


def disagreements(ours: list[str], env: list[str]) -> dict:
    """Where two requirement lists differ: names only in one, and specifiers that differ."""
    a, b = dict(norm_req(r) for r in ours), dict(norm_req(r) for r in env)
    return {"only_pyproject": sorted(a.keys() - b.keys()), "only_env": sorted(b.keys() - a.keys()),
            "specifier": sorted(k for k in a.keys() & b.keys() if a[k] != b[k])}


def test_pyproject_basics():
    p = pyproject()
    proj = p["project"]
    assert proj["requires-python"] == ">=3.10"
    assert p["build-system"]["build-backend"] == "setuptools.build_meta"
    # every package directory ships (a listed parent does not bring its subpackages along)
    pkgs = sorted(".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "lfm2vl_lab").rglob("__init__.py"))
    assert sorted(p["tool"]["setuptools"]["packages"]) == pkgs
    # the technique needs torch and transformers (and nothing of the instrument's); every entry is a requirement
    names = {norm_name(r) for r in proj["dependencies"]}
    assert {"torch", "transformers"} <= names
    for reqs in proj["optional-dependencies"].values():
        assert reqs and all(norm_name(r) for r in reqs)
    ini = p["tool"]["pytest"]["ini_options"]
    assert ini["testpaths"] == ["tests"]
    markers = " ".join(ini["markers"])
    assert "gpu:" in markers and "slow" in markers


def test_environment_yml_structure():
    conda, pip = env_yml_lines()
    assert "python=3.11" in conda and "pip" in conda
    extras = installed_extras(pip)
    assert "test" in extras and set(extras) <= set(pyproject()["project"]["optional-dependencies"])
    assert len(env_pip_reqs()) == len(pip) - 1


def test_same_package_set():
    ours = {norm_name(r) for r in project_reqs()}
    env = {norm_name(r) for r in env_pip_reqs()}
    assert ours == env, f"only in pyproject: {sorted(ours - env)}; only in environment.yml: {sorted(env - ours)}"


def test_same_version_constraints():
    assert disagreements(project_reqs(), env_pip_reqs()) == {"only_pyproject": [], "only_env": [], "specifier": []}


def test_a_disagreement_is_caught():
    """The comparison really fails when environment.yml drifts from pyproject.toml."""
    text = (ROOT / "environment.yml").read_text()
    torch_line = next(r for r in env_pip_reqs(text) if norm_name(r) == "torch")
    drifted = text.replace(f"- {torch_line}\n", "- torch>=1.0\n      - einops\n")
    d = disagreements(project_reqs(), env_pip_reqs(drifted))
    assert d["specifier"] == ["torch"] and d["only_env"] == ["einops"]
    d = disagreements(project_reqs(), [r for r in env_pip_reqs(text) if norm_name(r) != "numpy"])
    assert d["only_pyproject"] == ["numpy"]


def test_no_duplicates():
    for reqs in (project_reqs(), env_pip_reqs()):
        names = [norm_name(r) for r in reqs]
        assert len(names) == len(set(names)), names


def test_line_parser_agrees_with_yaml_when_available():
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in data["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in data["dependencies"] if isinstance(d, dict))
    assert (conda, pip) == env_yml_lines()


def test_makefile_pins_the_local_torch_pair():
    mk = (ROOT / "Makefile").read_text()
    pin = re.search(r"torch==(\d+(?:\.\d+)*) torchvision==\d+(?:\.\d+)*", mk)
    assert pin, "the Makefile pins torch and torchvision together"
    extras = re.search(r"-e '\.\[([^\]]*)\]'", mk)
    assert extras, "the Makefile installs the package in editable mode with its extras"
    # `make install` and environment.yml set up the same extras (test, and docs for `make docs`)
    assert sorted(extras[1].split(",")) == sorted(installed_extras(env_yml_lines()[1]))
    assert "docs" in extras[1].split(",")
    # the pinned torch satisfies pyproject's floor
    floor = next(r for r in pyproject()["project"]["dependencies"] if norm_name(r) == "torch")
    lo = tuple(int(x) for x in floor.split(">=")[1].split("."))
    assert tuple(int(x) for x in pin[1].split(".")) >= lo


def test_norm_name():
    assert norm_name("HolisticTraceAnalysis") == "holistictraceanalysis"
    assert norm_name("Foo_Bar.baz[extra]>=1,<2") == "foo-bar-baz"
    assert norm_req("transformers >=5.17, <5.21") == ("transformers", "<5.21,>=5.17")
