"""Shared test setup: offline hub, no user checkpoint, the `gpu` marker's auto-skip, one "no CUDA
device" notice per run, nbval left out for the notebooks JupyterLab runs, and the expensive fixtures.

Everything here runs at import, before any test module imports transformers, so no test can
reach a model hub.
"""

import os
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# The suite and the notebooks it runs (nbval's kernels inherit this environment) check the presets'
# committed outputs: a user's own checkpoint (README, "Real weights") must not change them. The
# tests that need a checkpoint make one (the tiny_checkpoint fixture) and set the variable themselves.
os.environ.pop("LFM2VL_CHECKPOINT", None)
# Nor may a user's choice of pointer check (core/ptrcheck.py): with LFM2VL_PTRCHECK=build the suite would
# compile into their extension cache. The tests that need the C++ check build their own (built_pointer_check).
os.environ.pop("LFM2VL_PTRCHECK", None)
# pytest-xdist workers share the machine's cores (``make test`` runs two on two cores). torch gives each
# process one OpenMP thread per core, so two workers would run twice as many busy threads as there are
# cores, and OpenMP threads that wait for a busy core spin: on two cores the CPU-heavy files took more
# than twice the CPU time. Each worker gets its share of the cores instead, and so does what it starts
# (CLI subprocesses, mkdocs, the notebooks' kernels), which inherit the variable. One set by the user stays.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _WORKERS))

import pytest  # noqa: E402
import torch  # noqa: E402

if _WORKERS > 1:  # torch may have been imported already (by a plugin), before the variable was set
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

GPU_SKIP_REASON = "needs a CUDA GPU; run on the device (see docs/gpu.md)"


# GraphedEncoder's notice, said once per encoder; on a CPU most tests build their own encoder.
NO_CUDA_NOTICE = "GraphedEncoder: no CUDA device"
_notice_seen = False


def pytest_warning_recorded(warning_message, when, nodeid, location):
    global _notice_seen
    _notice_seen = _notice_seen or str(warning_message.message).startswith(NO_CUDA_NOTICE)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Once the warnings summary holds the notice, later tests leave it out (the filter lives in
    pytest's per-test warning capture and ends with the test). pytest.warns and
    catch_warnings(record=True) with simplefilter("always") still see every one."""
    if _notice_seen:
        warnings.filterwarnings("ignore", message=NO_CUDA_NOTICE, category=UserWarning)


# The JupyterLab test of one notebook (tests/test_jupyterlab.py), parametrised by the notebook's file name.
LAB_NOTEBOOK_TEST = "test_notebook_runs_clean_in_jupyterlab"
TESTS = Path(__file__).resolve().parent
NOTEBOOKS = TESTS.parent / "notebooks"


@pytest.hookimpl(trylast=True)  # after -k and -m: only a JupyterLab test that will run counts
def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _run_each_notebook_once(config, items)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (``make test`` runs two)
        _longest_files_first(items)


# The files whose tests take longest in all (JupyterLab runs every notebook; the site test builds and
# opens the docs site), in that order. ``make test`` hands out whole files to its workers in the order
# they were collected (``--dist loadfile --no-loadscope-reorder``): these start first, one per worker,
# and the rest fill in around them, so no worker is left with a minutes-long file at the end.
LONGEST_FILES = ("test_jupyterlab.py", "test_site.py")


def _longest_files_first(items):
    """Move the tests of ``LONGEST_FILES`` to the front, each file's own order kept (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)) if item.path.parent == TESTS else len(rank))


def _run_each_notebook_once(config, items):
    """Leave out nbval's cells of every notebook that JupyterLab runs in this session.

    ``make test`` passes ``--nbval-lax notebooks/`` and collects tests/test_jupyterlab.py, which runs
    every notebook in JupyterLab and compares the cells marked ``NBVAL_CHECK_OUTPUT`` as nbval does
    (tests/nbcheck.py): nbval's own run of the notebook would execute it a second time and check
    nothing more. Where the browser tests cannot start (no Chromium or Playwright: they skip, or under
    ``LAB_REQUIRE_SITE_TESTS=1`` fail) nbval's run stays, so the notebooks are still executed and compared.
    """
    in_lab = {item.callspec.params["name"] for item in items
              if getattr(item, "originalname", None) == LAB_NOTEBOOK_TEST and item.path.name == "test_jupyterlab.py"}
    if not in_lab:
        return
    from chromium import unavailable

    if unavailable() is not None:
        return
    twice = [item for item in items
             if item.path.suffix == ".ipynb" and item.path.resolve().parent == NOTEBOOKS and item.path.name in in_lab]
    if twice:
        config.hook.pytest_deselected(items=twice)
        left_out = set(twice)
        items[:] = [item for item in items if item not in left_out]
        config.stash[_LEFT_TO_LAB] = sorted({item.path.name for item in twice})
        if hasattr(config, "workerinput"):  # an xdist worker's collection report never shows: tell the controller
            config.workeroutput[_LEFT_TO_LAB_KEY] = config.stash[_LEFT_TO_LAB]


_LEFT_TO_LAB = pytest.StashKey[list]()
_LEFT_TO_LAB_KEY = "nbval_left_to_jupyterlab"


def _left_out_notice(names: list[str]) -> str:
    return (f"nbval: {len(names)} notebooks left out, tests/test_jupyterlab.py runs them in JupyterLab and "
            f"compares their NBVAL_CHECK_OUTPUT cells: {' '.join(names)}")


def pytest_report_collectionfinish(config, start_path, items):
    names = config.stash.get(_LEFT_TO_LAB, [])
    return _left_out_notice(names) if names else None


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it installed, never called
def pytest_testnodedown(node, error):
    """Under pytest-xdist (the controller collects nothing): what the workers left out of nbval's run."""
    names = getattr(node, "workeroutput", {}).get(_LEFT_TO_LAB_KEY)
    if names:
        node.config.stash[_LEFT_TO_LAB] = names


def pytest_terminal_summary(terminalreporter, config):
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("dsession"):
        names = config.stash.get(_LEFT_TO_LAB, [])
        if names:
            terminalreporter.write_line(_left_out_notice(names))


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny preset, fp32 on the CPU (cheap: build it once per session anyway)."""
    from lfm2vl_lab import build_model

    return build_model("tiny")


@pytest.fixture(scope="session")
def model_450m():
    """The 450M preset (vision 85.8M + projector 10.5M, 1-layer text stub), fp32 on the CPU.

    ~4 s to build and ~1.2 s per vision forward on two cores: built once per session, used sparingly.
    """
    from lfm2vl_lab import build_model

    return build_model("lfm2-vl-450m")


@pytest.fixture(scope="session")
def built_pointer_check(tmp_path_factory):
    """The C++ pointer check (core/ptrcheck.py), built once per test run into a folder of its own
    (the user's torch extension cache is left alone): ``(module, folder)``; skipped where it cannot
    be built. About 18 s of compiling, the first time in a run: under pytest-xdist the workers share
    the run's folder, the first one builds (holding a file lock) and the others load its build."""
    from filelock import FileLock  # a dependency of torch's

    from lfm2vl_lab.core import ptrcheck

    reason = ptrcheck.cannot_build()
    if reason is not None:
        pytest.skip(f"the C++ pointer check cannot be built here: {reason}")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # a worker's basetemp is a folder of the run's, which its other workers share
    folder = root / "torch_extensions"
    saved, chosen = os.environ.get("TORCH_EXTENSIONS_DIR"), dict(ptrcheck._CHOSEN)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    try:
        with FileLock(str(root / "torch_extensions.lock")):
            folder.mkdir(exist_ok=True)
            return ptrcheck.build_pointer_check(), str(folder)
    finally:  # what the build changed, back: each test picks its check itself
        if saved is None:
            del os.environ["TORCH_EXTENSIONS_DIR"]
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = saved
        ptrcheck._CHOSEN.clear()
        ptrcheck._CHOSEN.update(chosen)


@pytest.fixture(scope="session")
def browser():
    """Headless Debian Chromium driven by Playwright, one for every browser test (tests/chromium.py)."""
    from chromium import launch_browser

    yield from launch_browser()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A checkpoint folder in a real one's layout, made here: the tiny preset's shapes with random
    weights (full text depth), a toy word-level tokenizer with LFM2's special tokens and an LFM2-VL
    chat template (lfm2vl_lab.model.toy_processor). No file of it comes from a hub."""
    from lfm2vl_lab.model.folder import save_toy_checkpoint

    return save_toy_checkpoint(tmp_path_factory.mktemp("checkpoint") / "LFM2-VL-tiny")
