"""``attnkit serve`` in a real headless Chromium: the app page on a loopback port, with a
tiny injected model — type a text, pick layers and heads, read the tooltip, compare it with
what the API returns."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from attnkit.serve import background, create_app
from attnkit.viz.viewer import ViewerData
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.fixtures.tiny_decoder import TinyModel

TEXT = "the cat sat on the mat because it was tired"


@pytest.fixture(scope="module")
def server():
    app = create_app(["tiny"], loader=lambda name: TinyModel(), max_tokens=48, allowed_hosts=["127.0.0.1", "localhost"])
    with background(app) as url:
        yield url


def api(url: str, body: dict) -> ViewerData:
    response = httpx.post(f"{url}/api/attention", json=body, timeout=10)
    response.raise_for_status()
    return ViewerData.from_json(response.text)


def test_type_pick_and_read(server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    assert page.get_by_label("Model", exact=True).input_value() == "tiny"
    viewer = Viewer(page)

    # All layers and heads: the model view shows them all.
    page.get_by_label("Text", exact=True).fill(TEXT)
    page.get_by_label("Layers to compute", exact=True).select_option(label="all 2 layers")
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    assert "10 tokens" in page.text_content("#ak-status")
    assert page.locator("#ak-queries .ak-token").all_text_contents() == TEXT.split()
    expected = api(server, {"text": TEXT}).sections["self"]
    viewer.view("model")
    assert page.locator(".ak-thumb").count() == 2 * 4
    viewer.view("matrix")
    for layer, head, (i, j) in [(0, 2, (6, 3)), (1, 3, (9, 0)), (1, 0, (4, 4))]:
        viewer.select("Layer", f"layer {layer}")
        viewer.select("Head", f"head {head}")
        tip = viewer.hover_cell(i, j)
        assert (tip.query_index, tip.key_index, tip.query) == (i, j, TEXT.split()[i])
        assert tip.weight == pytest.approx(expected.map(layer, head)[i, j].item(), abs=1e-5)

    # One layer and one head asked of the server.
    page.get_by_label("Layers to compute", exact=True).select_option(label="layer 0")
    page.get_by_label("Heads to compute", exact=True).select_option(label="head 1")
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    assert page.get_by_label("Layer", exact=True).locator("option").all_text_contents() == ["layer 0"]
    assert page.get_by_label("Head", exact=True).locator("option").all_text_contents() == ["head 1"]
    tip = viewer.hover_cell(8, 2)
    assert tip.weight == pytest.approx(expected.map(0, 1)[8, 2].item(), abs=1e-5)

    # The page only ever talked to its own server.
    assert page.requests and all(url.startswith(server + "/") for url in page.requests)


def test_errors_are_shown_and_the_app_recovers(server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    run = page.get_by_role("button", name="Show attention")
    page.get_by_label("Text", exact=True).fill("  ")
    run.click()
    assert page.text_content("#ak-status") == "Type a text first."
    page.get_by_label("Text", exact=True).fill("word " * 60)
    page.expected_errors.append("the server responded with a status of 422")
    run.click()
    page.wait_for_selector("body[data-state=error]")
    assert page.text_content("#ak-status") == "Error 422: the text is 60 tokens, more than the limit of 48 for tiny"
    assert page.get_attribute("#ak-status", "role") == "alert"
    page.get_by_label("Text", exact=True).fill("short and fine")
    run.click()
    Viewer(page).wait()
    assert page.locator("#ak-keys .ak-token").all_text_contents() == ["short", "and", "fine"]


def test_the_example_text_is_real_text_that_runs_at_once(server, page):
    """The text box opens with an example in it, not a grey hint that looks like one: Show
    attention computes it without typing anything."""
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    box = page.get_by_label("Text", exact=True)
    assert box.input_value() == "The cat sat on the mat."
    page.get_by_role("button", name="Show attention").click()
    Viewer(page).wait()
    assert page.locator("#ak-queries .ak-token").all_text_contents() == ["The", "cat", "sat", "on", "the", "mat."]
    # Emptied, the box shows a hint that reads as an instruction, not as a text.
    box.fill("")
    assert box.get_attribute("placeholder") == "Type a text here"


def test_policy_blocks_other_origins(server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    # A script that tried to reach another origin would be stopped by the page's policy.
    page.expected_errors.append("http://127.0.0.2:9/x")  # the policy's reports of what it blocked
    blocked = page.evaluate("""async () => {
        try { await fetch('http://127.0.0.2:9/x'); return 'fetched'; } catch (e) { return 'blocked'; }
    }""")
    assert blocked == "blocked"
    assert not any("127.0.0.2" in url for url in page.requests)


def test_real_model_through_serve(page, minilm_path):
    """MiniLM loaded by the default loader: what the page shows is what the model computes,
    between tokens and between words."""
    from attnkit import models

    text = "The animal didn't cross the road because it was too tired."
    with background(create_app(["minilm"])) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-state=empty]")
        page.get_by_label("Text", exact=True).fill(text)
        page.get_by_label("Layers to compute", exact=True).select_option(label="layer 2")
        page.get_by_role("button", name="Show attention").click()
        viewer = Viewer(page)
        viewer.wait()
        tokens = page.locator("#ak-queries .ak-token").all_text_contents()
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "animal" in tokens
        viewer.view("matrix")
        viewer.select("Head", "head 7")
        it, animal = tokens.index("it"), tokens.index("animal")
        tip = viewer.hover_cell(it, animal)
        from_api = api(url, {"text": text, "layers": [2], "heads": [7]}).sections["self"]
        assert tip.weight == pytest.approx(from_api.map(2, 7)[it, animal].item(), abs=1e-5)

        # Between words: "didn", "'", "t" become one label, and the tooltip reads the word map.
        page.get_by_label("Between", exact=True).select_option(label="words")
        page.get_by_role("button", name="Show attention").click()
        viewer.wait()
        words = page.locator("#ak-queries .ak-token").all_text_contents()
        assert words == [
            "[CLS]",
            "The",
            "animal",
            "didn't",
            "cross",
            "the",
            "road",
            "because",
            "it",
            "was",
            "too",
            "tired",
            ".",
            "[SEP]",
        ]
        assert page.text_content("#ak-status").startswith("14 words in ")
        viewer.view("matrix")
        viewer.select("Head", "head 7")
        word_tip = viewer.hover_cell(words.index("didn't"), words.index("animal"))
        assert word_tip.query == "didn't"
        by_words = api(url, {"text": text, "layers": [2], "heads": [7], "level": "word"}).sections["self"]
        assert word_tip.weight == pytest.approx(by_words.map(2, 7)[3, 2].item(), abs=1e-5)
    direct = models.load("minilm").run(text, return_weights=[2], heads=[7]).attentions[2]
    assert tip.weight == pytest.approx(direct[0, 0, it, animal].item(), abs=1e-3)


def test_first_page_limit_word_summary_and_model_view_of_every_layer(server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    assert page.text_content("#ak-status") == (
        "Choose Show attention for this example, or type a text of your own (at most 48 tokens for tiny)."
    )
    viewer = Viewer(page)
    page.get_by_label("Text", exact=True).fill("the cat, the mat")
    page.get_by_label("Between", exact=True).select_option("word")
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    assert page.text_content("#ak-summary").endswith(" · 4 words")
    # The default request is the last layer; the model view asks for every layer itself.
    assert page.get_by_label("Layer", exact=True).locator("option").all_text_contents() == ["layer 1"]
    viewer.view("model")
    expect(page.locator(".ak-thumb")).to_have_count(2 * 4)
    viewer.wait()
    assert page.get_by_label("Layers to compute", exact=True).input_value() == "all"


def test_a_recompute_keeps_the_ranked_key_and_every_choice(server, page):
    """Ranking "it" → "cat" on the last layer, then computing every layer as the ranking
    advises, keeps the query, the key, the view, the head, the heads shown and the scale."""
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    viewer = Viewer(page)
    page.get_by_label("Text", exact=True).fill(TEXT)
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    page.uncheck("#ak-toggle-1")
    viewer.view("matrix")
    viewer.select("Head", "head 2")
    viewer.select("Colour scale", "weight, 0 to 1")
    viewer.view("rank")
    viewer.select("Query token", "#7 it")
    viewer.select("Key token", "#1 cat")
    assert "Only 1 of the model\u2019s 2 layers were computed" in page.text_content("#ak-rank-note")
    page.get_by_label("Layers to compute", exact=True).select_option(label="all 2 layers")
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    page.wait_for_selector("#ak-rank-view:not([hidden])")
    assert page.get_by_label("Query token", exact=True).input_value() == "7"
    assert page.get_by_label("Key token", exact=True).input_value() == "1"
    note = page.text_content("#ak-rank-note")
    assert (
        note.startswith("From \u201cit\u201d #7 to \u201ccat\u201d #1: 2 layers \u00d7 4 heads") and "Only" not in note
    )
    assert set(page.locator("#ak-rank-rows td:nth-child(3)").all_text_contents()) == {"cat #1"}
    assert page.get_by_label("Colour scale", exact=True).input_value() == "linear"
    assert not page.is_checked("#ak-toggle-1") and page.is_checked("#ak-toggle-0")
    viewer.view("matrix")
    assert page.get_by_label("Head", exact=True).input_value() == "2"
    # Another text starts afresh: its own last query, any key.
    page.get_by_label("Text", exact=True).fill("the dog ran")
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    assert page.get_by_label("Key token", exact=True).input_value() == "-1"
    assert page.get_by_label("Query token", exact=True).input_value() == "2"
