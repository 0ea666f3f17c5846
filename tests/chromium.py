"""Debian's headless Chromium for the browser tests (tests/test_site.py, tests/test_jupyterlab.py),
driven by Playwright with ``executable_path``: never a browser build Playwright would download. The
``browser`` fixture itself lives in conftest.py."""

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("LAB_CHROMIUM", "/usr/bin/chromium"))
# What Chromium may do here: no sandbox as root, no GPU, nothing fetched behind the page's back.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def missing(reason: str):
    """Skip, saying why; under ``LAB_REQUIRE_SITE_TESTS=1`` (.ci/run) fail instead: CI must run these."""
    if os.environ.get("LAB_REQUIRE_SITE_TESTS") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def unavailable() -> str | None:
    """Why the browser tests cannot start a browser here (what ``missing`` says), or None."""
    try:
        from playwright import sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[docs]'"
    if not CHROMIUM.is_file():
        return f"no Chromium at {CHROMIUM}: run scripts/install_chromium.sh (Debian's chromium)"
    return None


def launch_browser():
    """Yield a headless Chromium (for the ``browser`` fixture), or skip/fail saying what is missing."""
    reason = unavailable()
    if reason is not None:
        missing(reason)
    from playwright import sync_api

    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()
