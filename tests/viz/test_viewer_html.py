"""The exported page: one self-contained file, data embedded safely, a policy that lets
only its own script and style run."""

from __future__ import annotations

import base64
import hashlib
import html
import re

import pytest

from attnkit.viz.viewer import ViewerData, content_security_policy, embed_json, render_html, write_html
from tests.viz.test_viewer_data import softmax_maps

HOSTILE = ["</script><script>alert(1)</script>", "<!--", "a&amp;b", "{{JS}}", "\u2028", "", "é"]


def page_parts(page: str) -> dict[str, str]:
    """The inline style, the data and the script of a page."""
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    data = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', page, re.S).group(1)
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1
    return {"style": style, "data": data, "script": scripts[0]}


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.fixture
def data() -> ViewerData:
    return ViewerData.from_run("m<b>", HOSTILE, {0: softmax_maps(2, 7, 7, causal=True)}, causal=True, text="x</script>")


def test_page_is_self_contained(data):
    page = render_html(data)
    # Nothing is fetched: no URL of any scheme that reaches a host, no src/href but the
    # empty data: icon.
    assert not re.search(r"\b(?:https?|wss?|ftp):|//[a-z0-9.-]+\.[a-z]{2,}/", page, re.I)
    assert re.findall(r'\b(?:src|href)="([^"]*)"', page) == ["data:,"]
    assert "@import" not in page and "url(" not in page


def test_embedded_data_round_trips_and_cannot_end_the_script(data):
    page = render_html(data)
    parts = page_parts(page)
    assert "<" not in parts["data"] and ">" not in parts["data"] and "&" not in parts["data"]
    back = ViewerData.from_json(parts["data"])
    assert back.sections["self"].query_tokens == tuple(HOSTILE)
    assert back.text == "x</script>" and back.model_name == "m<b>"
    assert back.to_json() == data.to_json()
    assert "<title>Attention: m&lt;b&gt;</title>" in page


def test_policy_allows_exactly_the_inline_script_and_style(data):
    page = render_html(data)
    parts = page_parts(page)
    meta = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1))
    assert meta == content_security_policy(app=False)
    directives = dict(d.strip().split(" ", 1) for d in meta.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == sha256(parts["script"])
    assert directives["style-src"] == sha256(parts["style"])
    assert directives["connect-src"] == "'none'"
    assert "connect-src 'self'" in content_security_policy(app=True)
    # No inline handlers or style attributes, which the policy would block.
    assert not re.search(r"\son[a-z]+=|\sstyle=", page.replace(parts["data"], "").replace(parts["script"], ""))


def test_app_page_has_no_data_and_file_page_needs_some(tmp_path, data):
    page = render_html(None, app=True)
    assert 'data-mode="app"' in page and page_parts(page)["data"] == "null"
    with pytest.raises(ValueError, match="needs data"):
        render_html(None)
    path = write_html(tmp_path / "sub" / "view.html", data)
    assert path.read_text(encoding="utf-8") == render_html(data)


def test_embed_json_escapes_only_inside_strings():
    assert embed_json('{"a":"</script>&"}') == '{"a":"\\u003c/script\\u003e\\u0026"}'
