"""``attnkit serve`` for a learner: "last layer" of an encoder–decoder means each stack's
last layer (a BART with 3 encoder and 2 decoder layers answers with its decoder and cross
maps too), local layers are tagged, and the model view after one layer of a long text
offers ranges of layers that fit instead of resubmitting into a refusal."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from attnkit import models
from attnkit.serve import background, create_app
from attnkit.viz.viewer import ViewerData
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.fixtures.encoder_decoder_checkpoints import write_bart
from tests.fixtures.tiny_families import WINDOW, write_tiny_family

SOURCE = "the big dog ran to the park"
TARGET = "a red cat sat on the mat and"


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    """A BART whose encoder is deeper than its decoder: the last layer index differs."""
    return models.load(write_bart(tmp_path_factory.mktemp("bart") / "bart", encoder_layers=3, decoder_layers=2))


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """Gemma 3 with local, global, local layers of window WINDOW."""
    folder = tmp_path_factory.mktemp("gemma3") / "gemma3"
    folder.mkdir()
    return models.load(write_tiny_family("gemma3_text", folder))


def test_last_layer_of_an_encoder_decoder_is_each_stacks_last(bart, gemma3) -> None:
    loaded = {"bart": bart, "gemma3": gemma3}
    app = create_app(["bart", "gemma3"], loader=loaded.__getitem__)
    client = TestClient(app, base_url="http://127.0.0.1")
    response = client.post(
        "/api/attention", json={"model": "bart", "text": SOURCE, "decoder_text": TARGET, "layers": "last"}
    )
    assert response.status_code == 200, response.text
    data = ViewerData.from_json(response.text)
    assert list(data.sections) == ["encoder", "decoder", "cross"]
    assert data.sections["encoder"].layers == (2,)
    assert data.sections["decoder"].layers == (1,) and data.sections["cross"].layers == (1,)
    assert len(data.sections["cross"].query_tokens) == len(bart.tokenize(TARGET).tokens)
    # A decoder-only model's last layer; its local layers carry their window.
    response = client.post("/api/attention", json={"model": "gemma3", "text": "w1 w2 w3", "layers": "last"})
    assert ViewerData.from_json(response.text).sections["self"].layers == (2,)
    response = client.post("/api/attention", json={"model": "gemma3", "text": "w1 w2 w3"})
    assert ViewerData.from_json(response.text).sections["self"].windows == (WINDOW, None, WINDOW)
    # Anything else than indices or "last" is refused.
    response = client.post("/api/attention", json={"model": "gemma3", "text": "w1", "layers": "first"})
    assert response.status_code == 422


def test_the_page_shows_all_three_kinds_for_the_default_last_layer(bart, page) -> None:
    app = create_app(["bart"], loader=lambda name: bart)
    with background(app) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-state=empty]")
        viewer = Viewer(page)
        assert page.get_by_label("Layers to compute", exact=True).locator("option").first.text_content() == (
            "last layer of each stack (2 and 1)"
        )
        page.get_by_label("Source", exact=True).fill(SOURCE)
        page.get_by_label("Target (decoder text)", exact=True).fill(TARGET)
        page.get_by_role("button", name="Show attention").click()
        viewer.wait()
        section = page.get_by_label("Attention", exact=True)
        assert page.is_visible("#ak-section")
        assert section.locator("option").evaluate_all("os => os.map(o => o.value)") == ["encoder", "decoder", "cross"]
        assert section.input_value() == "cross"
        target = len(bart.tokenize(TARGET).tokens)
        source = len(bart.tokenize(SOURCE).tokens)
        assert f"{source} source and {target} target tokens" in page.text_content("#ak-status")
        assert "Columns: source tokens" in page.text_content("#ak-axes")


def test_model_view_after_one_layer_offers_ranges_that_fit(gemma3, page) -> None:
    text = " ".join(f"w{n}" for n in range(12))
    tokens = len(gemma3.tokenize(text).tokens)
    per_layer = gemma3.num_heads * tokens**2
    # Two of the three layers fit in one response, not all three.
    app = create_app(["gemma3"], loader=lambda name: gemma3, max_weights=2 * per_layer + 1)
    with background(app) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-state=empty]")
        viewer = Viewer(page)
        page.get_by_label("Text", exact=True).fill(text)
        page.get_by_role("button", name="Show attention").click()
        viewer.wait()
        assert page.get_by_label("Layer", exact=True).locator("option").all_text_contents() == [
            f"layer 2 · local ({WINDOW})"
        ]
        asked = len([u for u in page.requests if u.endswith("/api/attention")])
        viewer.view("model")
        page.wait_for_selector("#ak-model-note:not([hidden])")
        # Nothing was sent: all three layers would be refused.
        assert len([u for u in page.requests if u.endswith("/api/attention")]) == asked
        assert "up to 2 layers" in page.text_content("#ak-model-note")
        picker = page.get_by_label("Layers to compute", exact=True)
        assert picker.input_value() == "0-1"
        assert "layers 0–1" in picker.locator("option").all_text_contents()
        page.get_by_role("button", name="Show attention").click()
        viewer.wait()
        viewer.view("model")
        assert page.locator(".ak-thumb").count() == 2 * gemma3.num_heads
        assert page.locator(".ak-grid-label").all_text_contents()[-2:] == [
            f"layer 0 · local ({WINDOW})",
            "layer 1 · global",
        ]
        assert "Error" not in page.text_content("#ak-status")
