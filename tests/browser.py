"""A real browser for page tests: Playwright driving Debian's Chromium (browsers cannot be
downloaded on these machines, so Playwright's own is never used)."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Iterator

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Why a browser test cannot run here, or None.
MISSING = ("chromium is not installed (make system-deps, or apt-get install -y chromium)" if CHROMIUM is None
           else None)
try:
    import playwright.sync_api  # noqa: F401
except ImportError:  # pragma: no cover - the test extra installs it
    MISSING = MISSING or "playwright is not installed (pip install -e '.[test]')"

# Without the networking flags Chromium keeps trying Google's hosts, which this closed
# network refuses.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium_page(width: int = 1500, height: int = 1000) -> Iterator["playwright.sync_api.Page"]:
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory(prefix="rankscope-chromium-") as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
                                                    viewport={"width": width, "height": height})
        try:
            yield ctx.pages[0] if ctx.pages else ctx.new_page()
        finally:
            ctx.close()
