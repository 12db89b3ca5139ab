"""The viewer page of a conversation in a chat template, in a real headless Chromium: the
list of turns, each token's turn band and role, the template's role markers, and the
matrix tooltip naming a token's turn."""

from __future__ import annotations

from attnkit.models.checkpoints.chat import Turn
from attnkit.viz.viewer import ViewerData
from tests.browser import browser, page  # noqa: F401 (fixtures)
from tests.viz.test_viewer_browser import open_export
from tests.viz.test_viewer_data import softmax_maps

TOKENS = ["<|system|>", "Be", "brief", "</s>", "<|user|>", "the", "cat", "</s>", "<|assistant|>"]
TURNS = [Turn("system", 0, 4, 1, 3), Turn("user", 4, 8, 5, 7), Turn("assistant", 8, 9, 9, 9)]


def test_the_page_shows_each_tokens_turn_and_the_role_markers(page, tmp_path):
    attn = {0: softmax_maps(2, 9, 9, causal=True)}
    data = ViewerData.from_run("chat", TOKENS, attn, causal=True, turns=TURNS)
    viewer = open_export(page, tmp_path, data)

    assert page.is_visible("#ak-turns")
    chips = page.locator("#ak-turns .ak-turn-chip").all_text_contents()
    assert chips == ["1. system: tokens 0\u20133", "2. user: tokens 4\u20137", "3. assistant: tokens 8\u20138"]
    roles = [page.get_attribute(f"#ak-q-{n}", "data-role") for n in range(len(TOKENS))]
    assert roles == ["system"] * 4 + ["user"] * 4 + ["assistant"]
    markers = [n for n in range(len(TOKENS)) if "ak-role-marker" in page.get_attribute(f"#ak-q-{n}", "class")]
    assert markers == [0, 3, 4, 7, 8]
    assert page.get_attribute("#ak-k-5", "title").endswith("(turn 2, user)")
    assert page.get_attribute("#ak-q-4", "title").endswith("(turn 2, user; role marker)")
    # The band beside a token is its role's colour, the same on both sides.
    band = page.eval_on_selector("#ak-q-5", "e => getComputedStyle(e).borderLeftColor")
    assert (
        band
        == page.eval_on_selector("#ak-k-6", "e => getComputedStyle(e).borderLeftColor")
        != page.eval_on_selector("#ak-q-8", "e => getComputedStyle(e).borderLeftColor")
    )

    viewer.view("matrix")
    canvas = page.locator("#ak-matrix")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    cell, left, top = (float(canvas.get_attribute(f"data-{k}")) for k in ("cell", "left", "top"))
    page.mouse.move(box["x"] + left + 5.5 * cell, box["y"] + top + 8.5 * cell)
    page.wait_for_selector("#ak-tooltip:not([hidden])")
    assert page.text_content("#ak-tooltip .ak-tt-query").strip().endswith("(turn 3, assistant; role marker)")
    assert page.text_content("#ak-tooltip .ak-tt-key").strip().endswith("(turn 2, user)")


def test_a_plain_text_page_shows_no_turns(page, tmp_path):
    open_export(page, tmp_path, ViewerData.from_run("plain", TOKENS, {0: softmax_maps(2, 9, 9)}, causal=False))
    assert not page.is_visible("#ak-turns")
    assert page.get_attribute("#ak-q-5", "data-role") is None
