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


def env_yml_lines() -> tuple[list[str], list[str]]:
    """(conda dependencies, pip entries) by simple line parsing (no YAML library needed)."""
    conda, pip, in_deps, pip_indent = [], [], False, None
    for raw in (ROOT / "environment.yml").read_text().splitlines():
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


def project_reqs() -> list[str]:
    p = pyproject()["project"]
    return list(p["dependencies"]) + list(p["optional-dependencies"]["test"])


def env_pip_reqs() -> list[str]:
    _, pip = env_yml_lines()
    return [r for r in pip if not r.startswith("-")]


def test_pyproject_basics():
    p = pyproject()
    proj = p["project"]
    assert proj["requires-python"] == ">=3.10"
    assert p["build-system"]["build-backend"] == "setuptools.build_meta"
    assert p["tool"]["setuptools"]["packages"] == ["lfm2vl_lab"]
    names = {norm_name(r) for r in proj["dependencies"]}
    assert names == {"torch", "torchvision", "transformers", "matplotlib", "tqdm", "numpy", "pillow",
                     "jupyterlab", "ipykernel"}
    extras = proj["optional-dependencies"]
    assert {norm_name(r) for r in extras["test"]} == {"pytest", "nbval"}
    assert extras["vllm"] == ["vllm==0.33.0"]
    assert [norm_name(r) for r in extras["hta"]] == ["holistictraceanalysis"]
    ini = p["tool"]["pytest"]["ini_options"]
    assert ini["testpaths"] == ["tests"]
    markers = " ".join(ini["markers"])
    assert "gpu:" in markers and "slow" in markers


def test_environment_yml_structure():
    conda, pip = env_yml_lines()
    assert "python=3.11" in conda and "pip" in conda
    assert "-e .[test]" in pip
    assert len(env_pip_reqs()) == len(pip) - 1


def test_same_package_set():
    ours = {norm_name(r) for r in project_reqs()}
    env = {norm_name(r) for r in env_pip_reqs()}
    assert ours == env, f"only in pyproject: {sorted(ours - env)}; only in environment.yml: {sorted(env - ours)}"


def test_same_version_constraints():
    ours = dict(norm_req(r) for r in project_reqs())
    env = dict(norm_req(r) for r in env_pip_reqs())
    assert ours == env


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
    assert "torch==2.14.1 torchvision==0.29.1" in mk
    assert "-e '.[test]'" in mk
    # the pinned torch satisfies pyproject's floor
    floor = next(r for r in pyproject()["project"]["dependencies"] if norm_name(r) == "torch")
    lo = tuple(int(x) for x in floor.split(">=")[1].split("."))
    assert (2, 14, 1) >= lo


def test_norm_name():
    assert norm_name("HolisticTraceAnalysis") == "holistictraceanalysis"
    assert norm_name("Foo_Bar.baz[extra]>=1,<2") == "foo-bar-baz"
    assert norm_req("transformers >=5.17, <5.21") == ("transformers", "<5.21,>=5.17")
