"""``attnkit serve`` of an encoder–decoder in a real headless Chromium: the second text box
(the target), a target written by the model when it is left empty, and the head, model
and matrix views of the encoder, decoder and cross-attention (target tokens as rows,
source tokens as columns), each weight as the API returns it."""

from __future__ import annotations

import httpx
import pytest

from attnkit import models
from attnkit.serve import background, create_app
from attnkit.viz.viewer import ViewerData
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.fixtures.tiny_decoder import TinyModel
from tests.fixtures.tiny_encoder_decoder import write_encoder_decoder_folder

SOURCE = "3 0 5 1 2"
TARGET = "2 1 5 0 3"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_encoder_decoder_folder(tmp_path_factory.mktemp("served") / "reverse")

    def loader(name):
        return TinyModel() if name == "tiny" else models.load(name)

    app = create_app(["tiny", str(folder)], loader=loader, allowed_hosts=["127.0.0.1", "localhost"])
    with background(app) as url:
        yield url


def api(url: str, body: dict) -> ViewerData:
    response = httpx.post(f"{url}/api/attention", json={"model": "reverse", **body}, timeout=10)
    response.raise_for_status()
    return ViewerData.from_json(response.text)


def test_source_and_target_in_every_view(server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    target_box = page.get_by_label("Target (decoder text)", exact=True)
    assert not target_box.is_visible()  # the default model reads one text
    page.get_by_label("Model", exact=True).select_option(label="reverse (2+2 layers, 2 heads)")
    assert target_box.is_visible() and page.get_by_label("Source", exact=True).is_visible()
    viewer = Viewer(page)

    page.get_by_label("Source", exact=True).fill(SOURCE)
    target_box.fill(TARGET)
    page.get_by_label("Layers to compute", exact=True).select_option(label="all layers (2 encoder, 2 decoder)")
    page.get_by_role("button", name="Show attention").click()
    viewer.wait()
    assert "5 source and 5 target tokens" in page.text_content("#ak-status")
    assert page.text_content("#ak-text-shown") == f"Source: \u201c{SOURCE}\u201d \u00b7 target: \u201c{TARGET}\u201d"
    sections = page.get_by_label("Attention", exact=True).locator("option").all_text_contents()
    assert sections == [
        "encoder self-attention",
        "decoder self-attention (causal)",
        "cross-attention (decoder to encoder)",
    ]
    expected = api(server, {"text": SOURCE, "decoder_text": TARGET})

    # Cross-attention: target tokens attend (left, rows), source tokens are attended to.
    viewer.select("Attention", "cross-attention (decoder to encoder)")
    assert page.locator("#ak-queries .ak-token").all_text_contents() == TARGET.split()
    assert page.locator("#ak-keys .ak-token").all_text_contents() == SOURCE.split()
    viewer.view("model")
    assert page.locator(".ak-thumb").count() == 2 * 2
    viewer.view("matrix")
    for kind, layer, head, (i, j) in [("cross", 1, 0, (0, 4)), ("cross", 0, 1, (3, 1))]:
        viewer.select("Layer", f"layer {layer}")
        viewer.select("Head", f"head {head}")
        tip = viewer.hover_cell(i, j)
        assert (tip.query, tip.key) == (TARGET.split()[i], SOURCE.split()[j])
        assert tip.weight == pytest.approx(expected.sections[kind].map(layer, head)[i, j].item(), abs=1e-5)

    # Decoder self-attention: the columns are what each position reads, <s> first.
    viewer.select("Attention", "decoder self-attention (causal)")
    viewer.select("Layer", "layer 1")
    viewer.select("Head", "head 1")
    tip = viewer.hover_cell(2, 0)
    assert (tip.query, tip.key) == ("5", "<s>")
    assert tip.weight == pytest.approx(expected.sections["decoder"].map(1, 1)[2, 0].item(), abs=1e-5)
    viewer.view("head")
    assert page.locator("#ak-keys .ak-token").all_text_contents() == ["<s>", *TARGET.split()[:-1]]


def test_an_empty_target_is_written_by_the_model_and_said(server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    page.get_by_label("Model", exact=True).select_option(label="reverse (2+2 layers, 2 heads)")
    page.get_by_label("Source", exact=True).fill(SOURCE)
    page.get_by_role("button", name="Show attention").click()
    Viewer(page).wait()
    assert page.text_content("#ak-status").startswith("No target given: the model wrote it by greedy decoding.")
    written = api(server, {"text": SOURCE})
    # This model writes only its end token, a target that reads as no text: its tokens are shown.
    tokens = " ".join(written.sections["cross"].query_tokens)
    assert written.target_text == "" and tokens == "</s>"
    assert page.text_content("#ak-text-shown").endswith(
        f"target tokens (they read as no text): {tokens} (written by the model, greedy decoding)"
    )
    # The page opens on cross-attention: the written target's tokens are its rows.
    assert page.locator("#ak-queries .ak-token").count() == len(written.sections["cross"].query_tokens)
