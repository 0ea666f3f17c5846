"""The notebooks in real JupyterLab, opened the way ``make lab`` opens them.

``make lab`` copies ``notebooks/`` into a git-ignored folder of working copies
(``scripts/lab_copies.py``, whose rules tests/test_lab_copies.py checks) and starts JupyterLab there.
These tests run ``make lab`` itself (the copies in a temporary folder, JupyterLab
headless on a free port with a random token), open every notebook in Debian's Chromium through
Playwright (never a browser Playwright downloads), click Run > Run All Cells and wait until every cell
ran. A notebook passes when every code cell ran in order, no output is an error or a stderr box (what C++
code writes to file descriptor 2 included: the server starts without pytest's variables, as a learner's
does), the first cell printed its environment check, and the saved run's cells marked
``NBVAL_CHECK_OUTPUT`` show what the committed notebook shows, compared as ``pytest --nbval-lax``
compares them (tests/nbcheck.py). That is nbval's check, so ``make test`` leaves nbval's own run of
these notebooks out (conftest.py): each notebook executes once. One screenshot per notebook lands in
``lab-screenshots/`` (git-ignored). Then: tqdm's progress bar renders as a widget, and ``git status``
of the repository is what it was before, although every notebook ran and was saved. Without Chromium
or Playwright they skip, saying so; under ``LAB_REQUIRE_SITE_TESTS=1`` (.ci/run) they fail instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import missing
from nbcheck import output_mismatches

try:  # the GPU image has no Jupyter: skip there (fail under LAB_REQUIRE_SITE_TESTS=1, as without Chromium)
    import nbformat
    import nbval  # noqa: F401  (nbcheck's comparison is nbval's)
except ModuleNotFoundError as e:
    missing(f"{e.name} is not installed: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
SHOTS = ROOT / "lab-screenshots"
NOTEBOOK_TIMEOUT_S = 240  # one notebook, Run All to idle; about 15-30 s each on 2 cores
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'  # stderr and tracebacks

spec = importlib.util.spec_from_file_location("lab_copies", ROOT / "scripts" / "lab_copies.py")
lab_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab_copies)


# ------------------------------------------------------------------------------------------------
# JupyterLab, started by `make lab`, and the browser
# ------------------------------------------------------------------------------------------------


def git_status() -> str | None:
    """``git status --porcelain`` of the repository, untracked files listed one by one; None outside git."""
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, text=True,
                          capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server that ``make lab`` started on working copies in ``folder``."""

    def __init__(self, tmp: Path):
        self.folder, self.token, port = tmp / "lab-notebooks", secrets.token_hex(16), _free_port()
        self.base, self.log = f"http://127.0.0.1:{port}", tmp / "jupyterlab.log"
        self.results: dict[str, dict] = {}  # notebook name -> what running it found
        self.ending: list[threading.Thread] = []  # sessions being deleted (end_session)
        self.end_errors: list[Exception] = []
        settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)  # no news and update checks: nothing from the network, no toast over cells
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
        # The environment a learner's `make lab` gets: none of pytest's variables. With PYTEST_CURRENT_TEST
        # set, ipykernel stops forwarding what C++ writes to file descriptor 2, and those stderr lines,
        # which a learner sees, would never reach the page.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
        venv = Path(sys.executable).parent.parent  # the venv running the tests, wherever it is
        args = f"--no-browser --port {port} --IdentityProvider.token={self.token}"
        self.proc = subprocess.Popen(["make", "lab", f"VENV={venv}", f"LAB_DIR={self.folder}", f"LAB_ARGS={args}"],
                                     cwd=ROOT, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.base}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def wait_until_up(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"make lab exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"JupyterLab did not answer in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def end_session(self, session_id: str) -> None:
        """Delete a notebook's session, so that its kernel leaves the CPU to the next notebook. The
        server answers once the kernel has shut down (about 2 s for a kernel that imported torch,
        nearly all of it waiting), so the request runs in a thread while the next notebook opens;
        ``stop`` waits for it and raises what it raised."""
        def end():
            try:
                self.api(f"sessions/{session_id}", method="DELETE")
            except Exception as e:  # raised again by stop
                self.end_errors.append(e)

        thread = threading.Thread(target=end, daemon=True)
        thread.start()
        self.ending.append(thread)

    def stop(self) -> None:
        for thread in self.ending:
            thread.join(timeout=60)
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", method="DELETE")
        os.killpg(self.proc.pid, signal.SIGTERM)  # make and the jupyter it started: one process group
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.end_errors:
            raise self.end_errors[0]


@pytest.fixture(scope="module")
def status_before() -> str:
    return git_status()


@pytest.fixture(scope="module")
def lab(browser, status_before, tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("make-lab"))
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()



# ------------------------------------------------------------------------------------------------
# One notebook in the browser: open, Run All Cells, wait, save, look
# ------------------------------------------------------------------------------------------------

# a queued or running cell shows [*]: in its prompt
QUEUED = "[...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].some(e => e.textContent.includes('*'))"
NONE_RUNNING_JS = f"() => !{QUEUED}"
PROMPTS_JS = "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
# Run All has started once a cell is queued, or once a prompt has changed: a one-cell notebook whose
# kernel has its imports cached can go from [ ]: to [1]: between two polls, never showing [*]:
STARTED_JS = f"before => {QUEUED} || JSON.stringify(({PROMPTS_JS})()) !== JSON.stringify(before)"
TO_TOP_JS = "() => document.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => { e.scrollTop = 0; })"
CELLS_JS = """sel => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(c => ({
  prompt: (c.querySelector('.jp-InputPrompt') || {textContent: ''}).textContent.trim(),
  stderr: [...c.querySelectorAll(sel)].map(e => e.textContent.slice(0, 800)),
  text: (c.querySelector('.jp-OutputArea') || {textContent: ''}).textContent.slice(0, 2000)}))"""


def wait_for_idle_kernel(lab: Lab, name: str, timeout_s: float) -> dict:
    """The notebook's session, once its kernel is idle (the page can say idle before the kernel is there)."""
    deadline, sessions = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        sessions = [s for s in lab.api("sessions") if s["path"].endswith(name)]
        if sessions and sessions[0]["kernel"]["execution_state"] == "idle":
            return sessions[0]
        time.sleep(0.5)
    raise AssertionError(f"{name}: no idle kernel after {timeout_s} s (sessions: {sessions})")


def menu(page, top: str, item: str) -> None:
    page.click(f".lm-MenuBar-itemLabel:text-is('{top}')")
    page.click(f".lm-Menu-itemLabel:text-is('{item}')")


def run_in_lab(lab: Lab, browser, name: str, shot: Path | None, then=None) -> dict:
    """Open ``name`` in JupyterLab, Run > Run All Cells, wait until no cell is queued and the kernel
    is idle, save it, screenshot its top; ``then(page)`` may look further. Returns every code cell
    (prompt, stderr boxes, output text), the seconds it took and what ``then`` returned."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    elsewhere, page_errors = [], []  # requests to any other host than the server; uncaught exceptions
    page.on("request", lambda r: None if r.url.startswith((lab.base, "data:", "blob:")) else elsewhere.append(r.url))
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    t0 = time.monotonic()
    try:
        page.goto(f"{lab.base}/lab/tree/{name}?reset&token={lab.token}", wait_until="load")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
        session = wait_for_idle_kernel(lab, name, 90)
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        prompts = page.evaluate(PROMPTS_JS)
        for attempt in (1, 2):  # a menu click can land before the notebook takes it: one more try
            menu(page, "Run", "Run All Cells")
            try:
                page.wait_for_function(STARTED_JS, arg=prompts, timeout=30_000)
                break
            except PlaywrightTimeout:
                if attempt == 2:
                    raise AssertionError(f"{name}: Run All Cells started nothing (prompts {prompts})") from None
        page.wait_for_function(NONE_RUNNING_JS, timeout=NOTEBOOK_TIMEOUT_S * 1000, polling=500)
        wait_for_idle_kernel(lab, name, 60)
        seconds = time.monotonic() - t0
        menu(page, "File", "Save Notebook")  # what autosave does a little later
        page.wait_for_selector(".lm-TabBar-tab.jp-mod-current:not(.jp-mod-dirty)", timeout=30_000)
        cells = page.evaluate(CELLS_JS, STDERR)
        extra = then(page) if then is not None else None
        if shot is not None:
            page.evaluate(TO_TOP_JS)
            page.wait_for_timeout(1000)  # off-screen cells are painted only once in view (content-visibility)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot))
            if any(c["stderr"] for c in cells):  # and where it went wrong
                page.locator(STDERR).first.scroll_into_view_if_needed()
                page.wait_for_timeout(1000)
                page.screenshot(path=str(shot.with_name(f"{shot.stem}-first-stderr.png")))
        lab.end_session(session["id"])  # the next notebook gets the CPU
        return {"cells": cells, "seconds": seconds, "extra": extra, "elsewhere": elsewhere, "page_errors": page_errors}
    finally:
        page.close()


def saved_run(lab: Lab, name: str):
    """The notebook as JupyterLab saved it after Run All (``run_in_lab`` waits for the save)."""
    return nbformat.read(lab.folder / name, as_version=4)


def ran(lab: Lab, browser, name: str) -> dict:
    """``run_in_lab`` once per notebook and module (the git status test needs them all)."""
    if name not in lab.results:
        stem = Path(name).stem
        t0 = time.monotonic()
        lab.results[name] = run_in_lab(lab, browser, name, SHOTS / f"{stem}.png")
        print(f"\n{name}: Run All took {lab.results[name]['seconds']:.1f} s, {time.monotonic() - t0:.1f} s in all")
    return lab.results[name]


# ------------------------------------------------------------------------------------------------
# The tests
# ------------------------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_clean_in_jupyterlab(lab, browser, name):
    result = ran(lab, browser, name)
    cells = result["cells"]
    code = [c for c in nbformat.read(ROOT / "notebooks" / name, as_version=4).cells if c.cell_type == "code"]
    assert len(cells) == len(code), f"{name}: JupyterLab shows {len(cells)} code cells, the notebook has {len(code)}"
    boxes = {i: c["stderr"] for i, c in enumerate(cells) if c["stderr"]}
    assert not boxes, f"{name}: stderr or error outputs in code cells (0-based) " + json.dumps(boxes, indent=1)
    prompts = [c["prompt"] for c in cells]
    assert prompts == [f"[{i}]:" for i in range(1, len(cells) + 1)], f"{name}: not every cell ran in order: {prompts}"
    assert not result["elsewhere"], f"{name}: JupyterLab fetched from elsewhere: {result['elsewhere']}"
    assert not result["page_errors"], f"{name}: errors in the page: {result['page_errors']}"
    assert "DEVICE=" in cells[0]["text"], f"{name}: the first cell printed no environment check: {cells[0]['text']!r}"
    committed = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    problems = output_mismatches(saved_run(lab, name), committed)
    assert not problems, f"{name}: outputs differ from the committed notebook's:\n" + "\n".join(problems)


def one_cell_notebook(folder: Path, name: str, source: str) -> str:
    """A throwaway notebook of one code cell ``source`` in ``folder`` (the lab's working copies)."""
    meta = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)], metadata=meta), folder / name)
    return name


@pytest.mark.browser
def test_the_stderr_check_sees_what_cpp_writes_to_fd_2(lab, browser):
    """C++ libraries (torch's profiler among them) log to file descriptor 2, not to ``sys.stderr``: a
    learner sees those lines as stderr boxes, so the notebook check must see them too. ipykernel stops
    forwarding fd 2 when it finds ``PYTEST_CURRENT_TEST`` in its environment, so the lab must start without it."""
    source = 'import os\nos.write(2, b"written to fd 2\\n")'
    name = one_cell_notebook(lab.folder, "zz-fd-stderr.ipynb", source)
    cells = run_in_lab(lab, browser, name, SHOTS / "zz-fd-stderr.png")["cells"]
    assert any("written to fd 2" in box for box in cells[0]["stderr"]), cells[0]


@pytest.mark.browser
def test_the_output_check_sees_a_changed_output(lab, browser):
    """The comparison with the committed outputs reads what JupyterLab saved after Run All, not the copy
    as it was before: a checked cell whose stored output is not what it prints fails, the others pass."""
    meta = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    stored = [nbformat.v4.new_output("stream", name="stdout", text=text) for text in ("kept\n", "stored\n")]
    # the sleep: its stored prompts are the ones a fresh run gives, so run_in_lab sees the run start
    # only while a cell shows [*]:, which a cell done within one poll never does
    cells = [nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nimport time\ntime.sleep(2)\nprint('kept')",
                                       outputs=stored[:1], execution_count=1),
             nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint('printed')", outputs=stored[1:], execution_count=2)]
    committed = nbformat.v4.new_notebook(cells=cells, metadata=meta)
    nbformat.write(committed, lab.folder / "zz-changed-output.ipynb")
    result = run_in_lab(lab, browser, "zz-changed-output.ipynb", None)
    assert [c["prompt"] for c in result["cells"]] == ["[1]:", "[2]:"], result["cells"]
    problems = output_mismatches(saved_run(lab, "zz-changed-output.ipynb"), committed)
    assert len(problems) == 1 and problems[0].startswith("code cell 1 (NBVAL_CHECK_OUTPUT): 'stdout' differs"), problems
    assert "-stored" in problems[0] and "+printed" in problems[0], problems[0]


@pytest.mark.browser
def test_progress_bars_render_as_widgets(lab, browser):
    """tqdm.auto in JupyterLab draws an ipywidgets bar, not the "IProgress not found" warning."""
    one_cell_notebook(lab.folder, "zz-progress-bar.ipynb", "from tqdm.auto import tqdm\n"
                      "for _ in tqdm(range(3), desc='steps'):\n    pass")
    bars = []
    result = run_in_lab(lab, browser, "zz-progress-bar.ipynb", SHOTS / "zz-progress-bar.png",
                        then=lambda page: bars.append(page.locator(".jp-OutputArea .widget-hprogress").count()))
    assert not result["cells"][0]["stderr"], result["cells"][0]["stderr"]
    assert bars == [1] and "3/3" in result["cells"][0]["text"], (bars, result["cells"][0]["text"])


@pytest.mark.browser
@pytest.mark.slow
def test_running_every_notebook_leaves_git_status_as_it_was(lab, browser, status_before):
    if status_before is None:
        pytest.skip(f"{ROOT} is not a git checkout")
    for name in NOTEBOOKS:
        ran(lab, browser, name)
    after = git_status()
    changed = sorted(set(after.splitlines()) ^ set(status_before.splitlines()))
    assert after == status_before, f"running the notebooks through `make lab` changed the repository: {changed}"
    # the runs were saved into the working copies, and `make lab` keeps them from now on
    source = ROOT / "notebooks"
    assert [n for n in NOTEBOOKS if lab_copies.digest(lab.folder / n) == lab_copies.digest(source / n)] == []
    assert set(lab_copies.prepare(source, lab.folder, say=lambda _: None).values()) == {"yours"}
