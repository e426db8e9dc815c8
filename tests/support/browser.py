"""A real browser for the page tests: Debian's chromium, headless, driven by Playwright
(``executable_path``: no browser is ever downloaded).

``require_browser()`` skips the calling test, naming what is missing (the chromium
binary, the playwright package); a test calls it first, before it starts any server.
``open_page(width, height)`` launches chromium (skipping likewise), yields a new page of
that viewport and the list of the page's uncaught script errors (filled as they
happen: a test asserts it empty where the page must run cleanly), and closes the browser
when the block ends, however it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def require_browser() -> Callable[[], Any]:
    """Playwright's ``sync_playwright``, or the test skipped naming what is missing."""
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} (Debian's chromium: scripts/setup.sh with"
                    " DATABUS_SETUP_SERVERS=1)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("no playwright Python package (the dev extra: pip install -e '.[dev]')")
    return sync_playwright


@contextmanager
def open_page(width: int, height: int) -> Iterator[tuple[Any, list[str]]]:
    """See the module docstring."""
    sync_playwright = require_browser()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            script_errors: list[str] = []
            page.on("pageerror", lambda e: script_errors.append(str(e)))
            yield page, script_errors
        finally:
            browser.close()
