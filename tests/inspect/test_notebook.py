"""Notebook display: an attention map shows as the interactive viewer inline, without a
server — checked in a real headless Chromium, inside the frame a notebook would render."""

from __future__ import annotations

import html
import json
import re

import torch

from attnkit.inspect.maps import AttentionMap
from attnkit.viz.notebook import notebook_html_of
from tests.browser import READY, browser, page  # noqa: F401 (pytest fixtures)

WORDS = ["어제", "밤에", "배가", "고파서", "피자를", "먹었다"]


def word_map() -> AttentionMap:
    weights = torch.ones(6, 6).tril()
    weights = torch.stack([weights / weights.sum(-1, keepdim=True), torch.eye(6)])  # [2, 6, 6]
    return AttentionMap(
        model_name="smollm2",
        text=" ".join(WORDS),
        tokens=["x"] * 44,
        labels=WORDS,
        layer=11,
        num_layers=30,
        heads=[2, 5],
        weights=weights,
        causal=True,
    )


def test_repr_html_is_one_frame_holding_the_whole_viewer():
    frame = notebook_html_of(word_map())
    assert frame.startswith('<iframe id="attnkit-') and frame.count("<iframe") == 1
    # The frame, then the script that fits its height to the page it holds.
    assert frame.count("</iframe><script>") == 1 and frame.endswith("</script>")
    assert 'sandbox="allow-scripts"' in frame
    page_source = html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))
    data = json.loads(
        re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', page_source, re.S).group(1)
    )
    section = data["sections"]["self"]
    assert data["kind"] == "causal" and section["query_tokens"] == WORDS
    assert section["layers"] == [11] and section["heads"] == [2, 5]
    assert "\ufffd" not in page_source


def test_the_frame_runs_in_a_browser(page):  # noqa: F811 (the fixture)
    # What Jupyter does with the HTML display: put it into the notebook's page.
    page.set_content(f"<!DOCTYPE html><html><body>{notebook_html_of(word_map())}</body></html>")
    frame = page.frame_locator("iframe")
    frame.locator(READY).wait_for()
    text = frame.locator("body").inner_text()
    assert "smollm2" in text and "고파서" in text
    assert not [url for url in page.requests if not url.startswith(("about:", "data:"))]


def long_map(s: int) -> AttentionMap:
    labels = [f"w{i}" for i in range(s)]
    weights = torch.softmax(torch.randn(1, s, s), dim=-1).tril()
    return AttentionMap(
        model_name="toy",
        text=" ".join(labels),
        tokens=labels,
        labels=labels,
        layer=0,
        num_layers=1,
        heads=[0],
        weights=weights,
        causal=True,
    )


def test_the_frame_fits_its_content(page):  # noqa: F811 (the fixture)
    heights = {}
    for s in (3, 200):
        page.set_content(f"<!DOCTYPE html><html><body>{notebook_html_of(long_map(s))}</body></html>")
        page.frame_locator("iframe").locator(READY).wait_for()
        inner = (
            page.frame_locator("iframe")
            .locator("body")
            .evaluate("b => Math.ceil(b.getBoundingClientRect().bottom + parseFloat(getComputedStyle(b).marginBottom))")
        )
        page.wait_for_function(f"document.querySelector('iframe').getBoundingClientRect().height === {inner}")
        heights[s] = inner
    # A short map's frame is shorter than a long one's, and a long one scrolls inside a
    # bounded frame instead of growing with every token.
    assert heights[3] < heights[200] < 1200


def test_import_attnkit_in_ipython_registers_the_viewer_as_the_html_display(monkeypatch):
    import sys
    import types

    import attnkit

    registered = {}

    class HtmlFormatter:
        def for_type_by_name(self, module, name, function):
            registered[(module, name)] = function

    shell = types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters={"text/html": HtmlFormatter()}))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    attnkit._register_notebook_display()
    assert set(registered) == {("attnkit.inspect.maps", "AttentionMap"), ("attnkit.inspect.maps", "AttentionView")}
    shown = registered[("attnkit.inspect.maps", "AttentionMap")](word_map())
    assert shown.startswith('<iframe id="attnkit-') and "sandbox" in shown
