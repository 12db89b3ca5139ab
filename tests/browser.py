"""A real headless Chromium for the viewer's tests: Debian's ``chromium`` package driven by
Playwright for Python (the browsers Playwright would download cannot be fetched here).

These tests never skip: without Chromium or Playwright they fail and say what to install.
Import the fixtures into a test module with ``from tests.browser import browser, page``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ATTNKIT_CHROMIUM", "/usr/bin/chromium")
# Headless, and quiet on a closed network: without the background-networking flags
# Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY = "body[data-state=ready]"


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: the viewer's browser tests need Debian's chromium "
            "(apt-get install -y chromium fonts-dejavu-core), or ATTNKIT_CHROMIUM=/path/to/chromium",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install -e '.[dev]'", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh page that records every request (``page.requests``) and fails the test on a
    script error or a console error, except those a test expects by adding a substring of
    the message to ``page.expected_errors``."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(f"uncaught: {err}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.requests = []
    page.expected_errors = []
    page.on("request", lambda request: page.requests.append(request.url))
    yield page
    context.close()
    unexpected = [e for e in errors if not any(part in e for part in page.expected_errors)]
    assert not unexpected, f"the page reported errors: {unexpected}"


@dataclass(frozen=True)
class Tip:
    """What the matrix view's tooltip says."""

    query: str
    query_index: int
    key: str
    key_index: int
    weight: float


def _inside(start: float, size: float) -> float:
    """A point of the span ``[start, start + size)`` that a mouse event reports as in it:
    events carry whole pixels, so a cell of a pixel or two (a fitted map of a long text) is
    pointed at by the first whole pixel inside it, a larger one by its centre."""
    if size >= 4:
        return start + size / 2
    whole = math.ceil(start)
    return whole if whole < start + size else start + size / 2


class Viewer:
    """Drives the viewer page as a person would: tabs, selects, mouse and keys."""

    def __init__(self, page) -> None:
        self.page = page

    def wait(self) -> None:
        self.page.wait_for_selector(READY)

    def data(self) -> dict:
        """The data the page shows, parsed from the embedded JSON."""
        return json.loads(self.page.text_content("#attnkit-data"))

    def view(self, name: str) -> None:
        self.page.click(f"#ak-tab-{name}")
        self.wait()

    def select(self, control: str, label: str) -> None:
        """Choose an option of a labelled select by its visible text."""
        self.page.get_by_label(control, exact=True).select_option(label=label)
        self.wait()

    def hover_cell(self, i: int, j: int) -> Tip:
        """Point at cell (query i, key j) of the matrix view and read the tooltip."""
        canvas = self.page.locator("#ak-matrix")
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        geometry = {k: float(canvas.get_attribute(f"data-{k}")) for k in ("cell", "left", "top")}
        x = _inside(box["x"] + geometry["left"] + j * geometry["cell"], geometry["cell"])
        y = _inside(box["y"] + geometry["top"] + i * geometry["cell"], geometry["cell"])
        self.page.mouse.move(x, y)
        self.page.wait_for_selector("#ak-tooltip:not([hidden])")
        return self.tip()

    def tip(self) -> Tip:
        text = {k: self.page.text_content(f"#ak-tooltip .ak-tt-{k}").strip() for k in ("query", "key", "weight")}
        query, qi = text["query"].rsplit("#", 1)
        key, ki = text["key"].rsplit("#", 1)
        return Tip(query.strip(), int(qi), key.strip(), int(ki), float(text["weight"]))
