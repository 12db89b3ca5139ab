"""The exported viewer page in a real headless Chromium, as a learner finds their way in it:
ranking layers and heads for a clicked token, a selection that survives layer changes,
local layers' window-masked cells, thumbnails that name their cells, labels that name the
quantity drawn, encoder–decoder axes, and a long map that zooms to readable cells."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnkit.viz.viewer import Section, ViewerData, write_html
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.viz.test_viewer_data import softmax_maps

TOKENS = ["The", "animal", "did", "not", "cross", "because", "it", "was", "tired", "."]
IT, ANIMAL = 6, 1
GREY = [226, 226, 226]


def open_export(page, tmp_path, data: ViewerData) -> Viewer:
    page.goto(write_html(tmp_path / "view.html", data).as_uri())
    viewer = Viewer(page)
    viewer.wait()
    return viewer


def planted(layers: int = 4, heads: int = 4, layer: int = 2, head: int = 3) -> dict[int, torch.Tensor]:
    """Causal maps where only ``layer``, ``head`` puts 0.9 of "it"'s weight on "animal"."""
    s = len(TOKENS)
    attn = {n: softmax_maps(heads, s, s, causal=True, seed=n) for n in range(layers)}
    for n in range(layers):  # no other map gives "it" more than 0.5 on any key
        row = torch.full((heads, IT + 1), 1.0 / (IT + 1))
        attn[n][:, IT, : IT + 1] = row
    attn[layer][head, IT, : IT + 1] = 0.1 / IT
    attn[layer][head, IT, ANIMAL] = 0.9
    return attn


def pixel(page, i: int, j: int) -> list[int]:
    """The colour of the matrix view's cell (query i, key j)."""
    return page.eval_on_selector(
        "#ak-matrix",
        """(c, [i, j]) => {
        const cell = Number(c.dataset.cell), left = Number(c.dataset.left), top = Number(c.dataset.top);
        const k = c.width / c.getBoundingClientRect().width;
        const x = Math.floor((left + (j + 0.5) * cell) * k), y = Math.floor((top + (i + 0.5) * cell) * k);
        return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));
    }""",
        [i, j],
    )


def test_ranking_finds_the_planted_head_and_a_clicked_token_stays_selected(page, tmp_path):
    attn = planted()
    viewer = open_export(page, tmp_path, ViewerData.from_run("toy", TOKENS, attn, causal=True))

    # Click "it": it stays selected when the pointer leaves, the layer picker takes the
    # focus and the layer changes.
    page.click(f"#ak-q-{IT}")
    page.mouse.move(5, 5)
    page.focus("#ak-layer")
    viewer.select("Layer", "layer 0")
    assert "ak-pinned-token" in page.get_attribute(f"#ak-q-{IT}", "class")
    assert page.get_attribute(f"#ak-q-{IT}", "aria-selected") == "true"
    assert page.evaluate("document.querySelectorAll('.ak-token.ak-active').length") == 1
    viewer.select("Layer", "layer 3")
    assert page.get_attribute(f"#ak-q-{IT}", "aria-selected") == "true"
    assert "“it” #6" in page.text_content("#ak-pinned-text")

    # One click from the map to the ranking, which starts from the clicked token.
    page.click("#ak-pinned-rank")
    viewer.wait()
    assert page.get_attribute("#ak-tab-rank", "aria-selected") == "true"
    assert page.get_by_label("Query token", exact=True).input_value() == str(IT)
    first = page.locator("#ak-rank-rows tr").first
    assert first.locator("button").text_content() == "layer 2, head 3"
    assert float(first.locator("td").last.text_content()) == pytest.approx(0.9, abs=1e-3)
    assert page.locator("#ak-rank-rows tr").count() == 4 * 4
    # With a key token chosen, the weight to that key ranks the maps.
    viewer.select("Key token", "#1 animal")
    rows = page.locator("#ak-rank-rows tr")
    assert rows.first.locator("button").text_content() == "layer 2, head 3"
    assert float(rows.nth(1).locator("td").last.text_content()) == pytest.approx(1 / (IT + 1), abs=1e-3)

    # Choosing a row opens that map in the matrix view on the ranked cell.
    rows.first.locator("button").click()
    viewer.wait()
    assert page.get_attribute("#ak-tab-matrix", "aria-selected") == "true"
    assert page.get_by_label("Layer", exact=True).input_value() == "2"
    assert page.get_by_label("Head", exact=True).input_value() == "3"
    tip = viewer.tip()
    assert (tip.query, tip.key) == ("it", "animal")
    assert tip.weight == pytest.approx(0.9, abs=1e-4)


def test_model_view_thumbnails_name_their_strongest_cell(page, tmp_path):
    attn = planted()
    viewer = open_export(page, tmp_path, ViewerData.from_run("toy", TOKENS, attn, causal=True))
    viewer.view("model")
    thumb = page.get_by_role("button", name="layer 2, head 3: open in the matrix view").locator("canvas")
    box = thumb.bounding_box()
    s = len(TOKENS)
    page.mouse.move(box["x"] + (ANIMAL + 0.5) * box["width"] / s, box["y"] + (IT + 0.5) * box["height"] / s)
    page.wait_for_selector("#ak-tooltip:not([hidden])")
    tip = viewer.tip()
    assert (tip.query, tip.key, tip.query_index, tip.key_index) == ("it", "animal", IT, ANIMAL)
    assert tip.weight == pytest.approx(0.9, abs=1e-4)
    assert page.text_content("#ak-tooltip .ak-tt-where") == "layer 2, head 3"


def test_local_layers_are_tagged_and_their_window_masked_cells_grey(page, tmp_path):
    s, window = 8, 3
    tokens = [f"t{n}" for n in range(s)]
    attn = {n: softmax_maps(2, s, s, causal=True, seed=n) for n in range(2)}
    band = torch.ones(s, s, dtype=torch.bool).tril() & ~torch.ones(s, s, dtype=torch.bool).tril(-window)
    attn[0] = torch.softmax(torch.randn(2, s, s).masked_fill(~band, float("-inf")), dim=-1)
    data = ViewerData.from_run("gemma-ish", tokens, attn, causal=True, windows={0: window, 1: None})
    viewer = open_export(page, tmp_path, data)
    assert page.locator("#ak-layer option").all_text_contents() == ["layer 0 · local (3)", "layer 1 · global"]
    viewer.view("matrix")
    viewer.select("Layer", "layer 0 · local (3)")
    # Outside the window (7 - 2 >= 3): grey, and the tooltip says it is masked.
    assert pixel(page, 7, 2) == GREY
    tip = viewer.hover_cell(7, 2)
    assert tip.weight == 0
    assert page.text_content("#ak-tooltip .ak-tt-note").startswith("(masked)")
    assert "window of 3" in page.text_content("#ak-tooltip .ak-tt-note")
    # Inside the window: a weight, not grey; the causal future stays grey too.
    assert pixel(page, 7, 5) != GREY
    assert page.text_content("#ak-tooltip .ak-tt-note") != "" and pixel(page, 2, 5) == GREY
    assert "3 or more positions back" in page.text_content("#ak-legend-note")
    # The global layer greys only the future.
    viewer.select("Layer", "layer 1 · global")
    assert pixel(page, 7, 2) != GREY
    viewer.hover_cell(7, 2)
    assert page.text_content("#ak-tooltip .ak-tt-note") == ""
    viewer.view("model")
    assert page.locator(".ak-grid-label").all_text_contents()[-2:] == ["layer 0 · local (3)", "layer 1 · global"]


def test_value_and_rollout_say_what_they_draw(page, tmp_path):
    tokens = ["The", "cat", "sat", "down"]
    weights = {layer: softmax_maps(3, 4, 4, causal=True, seed=layer) for layer in range(2)}
    value = {layer: w / w.amax(dim=(-2, -1), keepdim=True) for layer, w in weights.items()}
    rollout = {layer: softmax_maps(1, 4, 4, causal=True, seed=9 + layer) for layer in range(2)}
    data = ViewerData.from_run("m", tokens, weights, causal=True)
    data = replace(
        data,
        sections={
            **data.sections,
            "rollout": Section.from_layers(tokens, tokens, rollout, heads=[0], causal=True),
            "value": Section.from_layers(tokens, tokens, value, causal=True),
        },
    )
    viewer = open_export(page, tmp_path, data)
    assert page.text_content("#ak-legend-title") == "Colour: attention weight"
    assert page.is_visible("#ak-heads")
    viewer.select("Attention", "value-weighted ‖α·f(x)‖ (each map scaled to its largest)")
    assert "value-weighted norm" in page.text_content("#ak-legend-title")
    assert "scaled" in page.text_content("#ak-legend-title")
    assert page.locator("#ak-scale option").first.text_content() == "value-weighted norm, 0 to 1 (scaled per map)"
    viewer.view("matrix")
    viewer.hover_cell(3, 0)
    assert page.text_content("#ak-tooltip .ak-tt-quantity") == "norm"
    # Rollout merges the heads: no head to switch on or off.
    viewer.select("Attention", "attention rollout (layers below and heads merged)")
    viewer.view("head")
    assert not page.is_visible("#ak-heads") and not page.is_visible("#ak-heads-all")
    assert "rollout" in page.text_content("#ak-legend-title")
    assert page.text_content("#ak-tab-rank") == "Rank layers"


def test_encoder_decoder_opens_on_cross_attention_and_names_its_axes(page, tmp_path):
    src, tgt = ["a", "b", "c", "d", "e"], ["E", "D", "C", "</s>"]
    data = ViewerData.encoder_decoder(
        "toy-encoder-decoder",
        src,
        tgt,
        encoder={0: softmax_maps(2, 5, 5)},
        decoder={0: softmax_maps(2, 4, 4, causal=True)},
        cross={0: softmax_maps(2, 4, 5)},
        decoder_key_tokens=["<s>", "E", "D", "C"],
    )
    viewer = open_export(page, tmp_path, data)
    assert page.get_by_label("Attention", exact=True).input_value() == "cross"
    assert page.locator("#ak-queries .ak-token").all_text_contents() == tgt
    assert "5 source and 4 target tokens" in page.text_content("#ak-summary")
    axes = page.text_content("#ak-axes")
    assert "Rows: target tokens" in axes and "Columns: source tokens" in axes
    viewer.select("Attention", "decoder self-attention (causal)")
    axes = page.text_content("#ak-axes")
    assert "the token its position produces" in axes and "one position behind" in axes
    viewer.select("Attention", "encoder self-attention")
    assert "source tokens" in page.text_content("#ak-axes")


def test_a_written_target_that_reads_as_no_text_shows_its_tokens(page, tmp_path):
    src, tgt = ["a", "b", "c"], ["<pad>"] * 14
    data = ViewerData.encoder_decoder(
        "toy-encoder-decoder",
        src,
        tgt,
        cross={0: softmax_maps(2, 14, 3)},
        text="a b c",
        target_text="",
        generated=True,
    )
    open_export(page, tmp_path, data)
    shown = page.text_content("#ak-text-shown")
    assert '""' not in shown and "\u201c\u201d" not in shown
    assert shown.endswith(
        "target tokens (they read as no text): "
        + " ".join(["<pad>"] * 12)
        + " \u2026 (written by the model, greedy decoding)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("s", [601, 1500])
def test_fit_the_width_fills_the_width_without_a_scroll_bar(page, tmp_path, s):
    page.set_viewport_size({"width": 1280, "height": 800})
    attn = {0: softmax_maps(1, s, s, causal=True, seed=2)}
    viewer = open_export(page, tmp_path, ViewerData.from_run("long", [f"w{n}" for n in range(s)], attn, causal=True))
    viewer.view("matrix")
    wrap = page.eval_on_selector(
        "#ak-matrix-wrap",
        "w => ({client: w.clientWidth, scroll: w.scrollWidth, width: w.getBoundingClientRect().width})",
    )
    canvas = page.locator("#ak-matrix").bounding_box()
    cell, left = (
        float(page.get_attribute("#ak-matrix", "data-cell")),
        float(page.get_attribute("#ak-matrix", "data-left")),
    )
    assert wrap["scroll"] <= wrap["client"], wrap  # every key column in view
    assert canvas["width"] == pytest.approx(left + s * cell, abs=1)
    assert wrap["client"] - 12 <= canvas["width"] <= wrap["client"], (canvas, wrap)  # the width, not half of it
    # The last key column is in view, under the pointer where the tooltip says.
    box = page.locator("#ak-matrix").bounding_box()
    top = float(page.get_attribute("#ak-matrix", "data-top"))
    page.mouse.move(box["x"] + left + (s - 0.5) * cell, box["y"] + top + 10.5 * cell)
    page.wait_for_selector("#ak-tooltip:not([hidden])")
    tip = viewer.tip()  # a pointer moves in whole pixels: a cell under one pixel is found within one
    assert abs(tip.query_index - 10) <= (cell < 1) and s - 1 - tip.key_index <= (cell < 1)


@pytest.mark.slow
def test_a_long_map_zooms_to_readable_labelled_cells(page, tmp_path):
    s = 1500
    tokens = [f"w{n}" for n in range(s)]
    attn = {0: softmax_maps(1, s, s, causal=True, seed=1)}
    viewer = open_export(page, tmp_path, ViewerData.from_run("long", tokens, attn, causal=True))
    # Every line of 1,500 tokens is not offered.
    assert page.eval_on_selector("#ak-topk option[value='0']", "o => o.disabled")
    viewer.view("matrix")
    assert float(page.get_attribute("#ak-matrix", "data-cell")) < 9
    assert "choose a larger Cell size" in page.text_content("#ak-legend-note")
    viewer.select("Cell size", "16 px, labelled")
    canvas = page.locator("#ak-matrix")
    assert float(canvas.get_attribute("data-cell")) == 16 and float(canvas.get_attribute("data-left")) > 0
    # The canvas holds only the part in view, the scroll area the whole map.
    assert canvas.bounding_box()["width"] <= 1200
    page.eval_on_selector("#ak-matrix-wrap", "w => { w.scrollLeft = 700 * 16; w.scrollTop = 900 * 16; }")
    page.wait_for_timeout(100)
    box = canvas.bounding_box()
    left, top = float(canvas.get_attribute("data-left")), float(canvas.get_attribute("data-top"))
    page.mouse.move(box["x"] + left + 3 * 16 + 8, box["y"] + top + 2 * 16 + 8)
    page.wait_for_selector("#ak-tooltip:not([hidden])")
    tip = viewer.tip()
    assert (tip.query_index, tip.key_index) == (902, 703)
    assert tip.weight == pytest.approx(attn[0][0, 902, 703].item(), abs=1e-4)
    # Keys move a cursor that the zoomed map scrolls to.
    canvas.focus()
    page.keyboard.press("End")
    assert viewer.tip().key_index == s - 1


@pytest.mark.slow
def test_the_it_animal_head_of_smollm2_is_found_by_clicking(page, tmp_path, smollm2):
    from attnkit.viz.export import write_viewer

    text = "The animal didn't cross the street because it was too tired."
    page.goto(write_viewer(smollm2, text, tmp_path).as_uri())
    viewer = Viewer(page)
    viewer.wait()
    labels = page.locator("#ak-queries .ak-token").all_text_contents()
    it, animal = labels.index("it"), labels.index("animal")
    page.click(f"#ak-q-{it}")
    page.click("#ak-pinned-rank")
    viewer.wait()
    viewer.select("Key token", f"#{animal} animal")
    top = page.locator("#ak-rank-rows tr").first
    assert top.locator("button").text_content() == "layer 13, head 8"
    run = smollm2.run(text, return_weights=[13], heads=[8])
    assert float(top.locator("td").last.text_content()) == pytest.approx(
        run.attentions[13][0, 0, it, animal].item(), abs=1e-3
    )


@pytest.mark.slow
def test_korean_word_starts_stay_visible_between_tokens(page, tmp_path, smollm2):
    from attnkit.viz.export import write_viewer

    text = "배가 아파서 배를 먹었다"
    page.goto(write_viewer(smollm2, text, tmp_path, layers=[0]).as_uri())
    Viewer(page).wait()
    labels = page.locator("#ak-queries .ak-token").all_text_contents()
    firsts = [n for n, label in enumerate(labels) if label.startswith("배") and label.endswith("(1/3)")]
    assert len(firsts) == 2  # the two "배" read the same...
    for n in firsts[1:]:  # ...but the second starts its own word, and says so
        assert "ak-word-start" in page.get_attribute(f"#ak-q-{n}", "class")
        assert "ak-word-start" in page.get_attribute(f"#ak-k-{n}", "class")
    starts = page.locator("#ak-queries .ak-word-start").count()
    assert starts == len(text.split()) - 1  # one rule above every word but the first
    assert "ak-word-start" not in page.get_attribute(f"#ak-q-{firsts[0] + 1}", "class")


def test_escape_releases_the_selected_token_wherever_the_focus_is(page, tmp_path):
    viewer = open_export(page, tmp_path, ViewerData.from_run("toy", TOKENS, planted(), causal=True))
    for focus in ("#ak-layer", "#ak-tab-matrix", "body"):
        viewer.view("head")
        page.click(f"#ak-q-{IT}")
        page.mouse.move(5, 5)
        page.focus(focus) if focus != "body" else page.evaluate("document.activeElement.blur()")
        assert "ak-pinned-token" in page.get_attribute(f"#ak-q-{IT}", "class")
        page.keyboard.press("Escape")
        assert "ak-pinned-token" not in page.get_attribute(f"#ak-q-{IT}", "class"), focus
        assert page.get_attribute(f"#ak-q-{IT}", "aria-selected") == "false"
        assert "ak-invisible" in page.get_attribute("#ak-pinned", "class")
