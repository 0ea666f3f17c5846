"""The README's code runs as written: the API tour on the CPU, and the GPU snippet defines every name it uses."""

from __future__ import annotations

import ast
import builtins
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(heading: str) -> str:
    """The first ```python block after the README line ``heading``, before the next heading."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert heading in lines, f"README.md has no heading {heading!r}"
    block, inside = None, False
    for line in lines[lines.index(heading) + 1:]:
        if inside:
            if line.startswith("```"):
                return "\n".join(block) + "\n"
            block.append(line)
        elif line.startswith("```python"):
            block, inside = [], True
        elif line.startswith("#"):  # a heading (comments only occur inside code blocks)
            break
    raise AssertionError(f"README.md: no complete ```python block under {heading!r}")


def free_names(code: str) -> set[str]:
    """Names the code reads but neither binds (assignment, import, def, argument) nor gets from builtins."""
    tree = ast.parse(code)
    bound, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return used - bound - set(dir(builtins))


def test_api_tour_runs_on_cpu(capsys):
    code = python_block("## A short API tour")
    assert '"tiny"' in code and "cuda" not in code, "the tour must stay on the tiny preset, runnable on a CPU"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # GraphedEncoder's "no CUDA device" notice
        exec(compile(code, "README.md: A short API tour", "exec"), {"__name__": "readme_tour"})
    printed = capsys.readouterr().out
    # The tour prints the token count of each sample photo: the processor's and both encoders' contract.
    assert "[247, 247, 238]" in printed, printed


@pytest.mark.parametrize("heading", ["## A short API tour", "### On a GPU", "## Real weights"])
def test_readme_snippets_define_every_name_they_use(heading):
    code = python_block(heading)
    assert not free_names(code), f"README {heading!r} uses undefined names: {sorted(free_names(code))}"


def test_free_names_catches_an_undefined_name():
    # The check above must be able to fail: this is the README's old GPU snippet, which used
    # `images`, `prompt_and_pixels` and `lab` without defining them.
    old = "feats = genc.encode(lab.process_images(images, 'x'))\nout = model.generate(**prompt_and_pixels)"
    assert free_names(old) == {"genc", "lab", "images", "model", "prompt_and_pixels"}


@pytest.mark.gpu
def test_gpu_snippet_runs_on_a_gpu():
    """The README's GPU snippet, as written, on a GPU: its engine tokens are generate's."""
    import torch

    scope = {"__name__": "readme_gpu"}
    exec(compile(python_block("### On a GPU"), "README.md: On a GPU", "exec"), scope)
    prompt_len = scope["prompt"]["input_ids"].shape[1]
    assert torch.equal(scope["tokens"][:, :1].cpu(), scope["out"][:, prompt_len:prompt_len + 1].cpu())
    assert not scope["engine"].stats.eager and scope["genc"].stats.hits > 0


FETCHED = "~/models/LFM2-VL-450M"  # where the README's "Real weights" section fetches the checkpoint to


def test_real_weights_example_runs_on_a_checkpoint_folder(tiny_checkpoint, capsys):
    """The "Real weights" block as written, on a tiny checkpoint folder (tests/conftest.py) instead of
    the fetched one and on the CPU: load_model, chat, and the reply printed with its timings."""
    from importlib.metadata import entry_points

    text = README.read_text(encoding="utf-8")
    assert f"hf download LiquidAI/LFM2-VL-450M --local-dir {FETCHED}" in text
    assert "hf" in {e.name for e in entry_points(group="console_scripts")}  # the fetch command exists
    code = python_block("## Real weights")
    assert f'"{FETCHED}"' in code and 'device="cuda"' in code
    code = code.replace(f'"{FETCHED}"', repr(str(tiny_checkpoint))).replace('device="cuda"', 'device="cpu"')
    exec(compile(code, "README.md: Real weights", "exec"), {"__name__": "readme_real_weights"})
    printed = capsys.readouterr().out
    assert "-- ms: process" in printed and "graphs: encoder" in printed, printed
    assert "means nothing" in printed  # the tiny folder's weights are random, and the reply says so
