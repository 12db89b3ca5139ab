"""The exported viewer page in a real headless Chromium: views, layer and head switching,
the matrix tooltip against the embedded JSON, keyboard use, encoder–decoder sections and
1,000 tokens."""

from __future__ import annotations

import time

import pytest

from attnkit.viz.viewer import ViewerData, write_html
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.viz.test_viewer_data import softmax_maps

TOKENS = ["The", "cat", "sat", "on", "the", "mat", "."]


def open_export(page, tmp_path, data: ViewerData) -> Viewer:
    page.goto(write_html(tmp_path / "view.html", data).as_uri())
    viewer = Viewer(page)
    viewer.wait()
    return viewer


def ink(page, selector: str) -> int:
    """How many pixels of a canvas are drawn on."""
    return page.eval_on_selector(
        selector,
        """c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let p = 3; p < d.length; p += 4) if (d[p] > 0) n++;
        return n;
    }""",
    )


def test_causal_export_views_switching_and_tooltip(page, tmp_path):
    attn = {layer: softmax_maps(3, 7, 7, causal=True, seed=layer) for layer in range(2)}
    viewer = open_export(page, tmp_path, ViewerData.from_run("toy", TOKENS, attn, causal=True))
    embedded = ViewerData.from_dict(viewer.data()).sections["self"]

    # Head view, last layer by default: every token on both sides, lines drawn.
    assert page.locator("#ak-queries .ak-token").all_text_contents() == TOKENS
    assert page.locator("#ak-keys .ak-token").all_text_contents() == TOKENS
    assert page.get_by_label("Layer", exact=True).input_value() == "1"
    all_lines = ink(page, "#ak-lines")
    assert all_lines > 0
    # Hovering a token isolates its lines; heads can be switched off and on.
    page.hover("#ak-q-0")
    assert 0 < ink(page, "#ak-lines") < all_lines
    assert page.get_attribute("#ak-q-0", "class") == "ak-token ak-active"
    page.mouse.move(5, 5)
    page.click("#ak-heads-none")
    assert ink(page, "#ak-lines") == 0
    page.get_by_role("checkbox", name="head 2").check()
    one_head = ink(page, "#ak-lines")
    assert 0 < one_head < all_lines
    viewer.select("Layer", "layer 0")
    assert ink(page, "#ak-lines") > 0

    # Matrix view: switch layer and head, hover cells, compare with the embedded JSON
    # (exact up to display rounding) and with the weights exported (within 1e-3).
    viewer.view("matrix")
    viewer.select("Head", "head 2")
    for i, j in [(4, 2), (6, 0), (0, 0)]:
        tip = viewer.hover_cell(i, j)
        assert (tip.query_index, tip.key_index, tip.query, tip.key) == (i, j, TOKENS[i], TOKENS[j])
        assert tip.weight == pytest.approx(embedded.map(0, 2)[i, j].item(), abs=1e-5)
        assert tip.weight == pytest.approx(attn[0][2, i, j].item(), abs=1e-3)
    viewer.select("Layer", "layer 1")
    viewer.select("Head", "head 1")
    tip = viewer.hover_cell(5, 3)
    assert tip.weight == pytest.approx(attn[1][1, 5, 3].item(), abs=1e-3)
    assert viewer.hover_cell(1, 4).weight == 0  # masked: the future
    assert page.text_content("#ak-tooltip .ak-tt-note") == "(masked)"

    # Model view: a grid of layers x heads; choosing one opens it in the matrix view.
    viewer.view("model")
    assert page.locator(".ak-thumb").count() == 2 * 3
    page.get_by_role("button", name="layer 0, head 1: open in the matrix view").click()
    viewer.wait()
    assert page.get_attribute("#ak-tab-matrix", "aria-selected") == "true"
    assert page.get_by_label("Layer", exact=True).input_value() == "0"
    assert page.get_by_label("Head", exact=True).input_value() == "1"
    assert viewer.hover_cell(3, 3).weight == pytest.approx(attn[0][1, 3, 3].item(), abs=1e-3)

    # The page asked for nothing but itself.
    assert page.requests and all(url.startswith("file://") for url in page.requests)


def test_keyboard_only(page, tmp_path):
    attn = {0: softmax_maps(2, 7, 7, seed=3)}
    viewer = open_export(page, tmp_path, ViewerData.from_run("bert-ish", TOKENS, attn, causal=False))
    # Tabs: arrow keys move between views.
    page.focus("#ak-tab-head")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    viewer.wait()
    assert page.evaluate("document.activeElement.id") == "ak-tab-matrix"
    assert page.is_visible("#ak-matrix-view") and not page.is_visible("#ak-head-view")
    # The matrix: Tab reaches it, arrow keys move a cursor and the tooltip reads the cell.
    page.focus("#ak-scale")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "ak-matrix"
    for key in ["ArrowDown", "ArrowDown", "ArrowRight", "End", "ArrowLeft"]:
        page.keyboard.press(key)
    tip = viewer.tip()
    assert (tip.query_index, tip.key_index) == (2, 5)
    assert tip.weight == pytest.approx(attn[0][0, 2, 5].item(), abs=1e-3)
    assert "weight " + f"{tip.weight:.5f}" in page.text_content("#ak-matrix-live")
    # The head view's token columns: arrow keys isolate one token after another.
    page.click("#ak-tab-head")
    viewer.wait()
    page.focus("#ak-keys")
    page.keyboard.press("ArrowDown")
    assert page.get_attribute("#ak-keys", "aria-activedescendant") == "ak-k-1"
    assert page.get_attribute("#ak-k-1", "aria-selected") == "true"
    # Every control has a label.
    for control in ["Layer", "Colour scale", "Lines per token"]:
        assert page.get_by_label(control, exact=True).is_visible()


def test_encoder_decoder_sections(page, tmp_path):
    src, tgt = ["a", "b", "c", "d", "e"], ["<s>", "E", "D", "C"]
    cross = {layer: softmax_maps(2, 4, 5, seed=10 + layer) for layer in range(2)}
    data = ViewerData.encoder_decoder(
        "toy-encoder-decoder",
        src,
        tgt,
        cross=cross,
        encoder={layer: softmax_maps(2, 5, 5, seed=layer) for layer in range(2)},
        decoder={layer: softmax_maps(2, 4, 4, causal=True, seed=20 + layer) for layer in range(2)},
    )
    viewer = open_export(page, tmp_path, data)
    section = page.get_by_label("Attention", exact=True)
    assert [o.strip() for o in section.locator("option").all_text_contents()] == [
        "encoder self-attention",
        "decoder self-attention (causal)",
        "cross-attention (decoder to encoder)",
    ]
    # The page opens on cross-attention, as attnkit inspect prints it.
    assert section.input_value() == "cross"
    viewer.select("Attention", "encoder self-attention")
    assert page.locator("#ak-queries .ak-token").count() == 5
    viewer.select("Attention", "cross-attention (decoder to encoder)")
    assert page.locator("#ak-queries .ak-token").all_text_contents() == tgt
    assert page.locator("#ak-keys .ak-token").all_text_contents() == src
    assert ink(page, "#ak-lines") > 0
    viewer.view("matrix")
    viewer.select("Layer", "layer 0")
    viewer.select("Head", "head 1")
    tip = viewer.hover_cell(3, 0)
    assert (tip.query, tip.key) == ("C", "a")
    assert tip.weight == pytest.approx(cross[0][1, 3, 0].item(), abs=1e-3)
    viewer.select("Attention", "decoder self-attention (causal)")
    assert viewer.hover_cell(1, 2).weight == 0
    viewer.view("model")
    assert page.locator(".ak-thumb").count() == 2 * 2


def test_a_thousand_tokens_stay_responsive(page, tmp_path):
    s = 1000
    attn = {0: softmax_maps(4, s, s, causal=True, seed=5), 1: softmax_maps(4, s, s, causal=True, seed=6)}
    data = ViewerData.from_run("long", [f"t{i}" for i in range(s)], attn, causal=True)
    started = time.perf_counter()
    viewer = open_export(page, tmp_path, data)
    timings = {"open": time.perf_counter() - started}
    # Top-k lines by default: only the queries in view are drawn, so scrolling is cheap.
    assert page.get_by_label("Lines per token", exact=True).input_value() == "5"
    page.hover("#ak-head-scroll")
    started = time.perf_counter()
    page.mouse.wheel(0, 8000)
    page.wait_for_function("() => document.getElementById('ak-head-scroll').scrollTop > 1000")
    timings["scroll"] = time.perf_counter() - started
    for name in ["matrix", "model"]:
        started = time.perf_counter()
        viewer.view(name)
        timings[name] = time.perf_counter() - started
    viewer.view("matrix")
    viewer.select("Head", "head 3")
    tip = viewer.hover_cell(400, 7)
    assert (tip.query_index, tip.key_index) == (400, 7)
    assert tip.weight == pytest.approx(attn[1][3, 400, 7].item(), abs=1e-3)
    # Generous bounds for a loaded CI machine; locally each step takes well under a second.
    assert max(timings.values()) < 10, timings


def test_real_model_export(page, tmp_path, smollm2_path):
    """SmolLM2 on note 004's sentence: the page shows what the model computed."""
    from attnkit import models
    from attnkit.viz.viewer import viewer_data_from_run

    model = models.load("smollm2")
    text = "The animal didn't cross the road because it was too tired."
    run = model.run(text, return_weights=[0, model.num_layers - 1])
    viewer = open_export(page, tmp_path, viewer_data_from_run(model, run, text=text))
    tokens = page.locator("#ak-queries .ak-token").all_text_contents()
    assert tokens[:3] == ["The", "animal", "didn"] and len(tokens) == len(run.tokens)
    embedded = ViewerData.from_dict(viewer.data()).sections["self"]
    assert embedded.causal and embedded.heads == tuple(range(model.num_heads))
    viewer.view("matrix")
    it, animal = tokens.index("it"), tokens.index("animal")
    for layer, head in [(model.num_layers - 1, 0), (0, model.num_heads - 1)]:
        viewer.select("Layer", f"layer {layer}")
        viewer.select("Head", f"head {head}")
        tip = viewer.hover_cell(it, animal)
        assert (tip.query, tip.key) == ("it", "animal")
        assert tip.weight == pytest.approx(embedded.map(layer, head)[it, animal].item(), abs=1e-5)
        assert tip.weight == pytest.approx(run.attentions[layer][0, head, it, animal].item(), abs=1e-3)


def test_colour_modes_switch_in_the_attention_menu(page, tmp_path):
    from dataclasses import replace

    from attnkit.viz.viewer.data import Section

    tokens = ["The", "cat", "sat", "down"]
    weights = {layer: softmax_maps(3, 4, 4, causal=True, seed=layer) for layer in range(2)}
    value = {
        layer: w / w.amax(dim=(-2, -1), keepdim=True)
        for layer, w in ((layer, softmax_maps(3, 4, 4, causal=True, seed=5 + layer)) for layer in range(2))
    }
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
    section = page.get_by_label("Attention", exact=True)
    assert [o.strip() for o in section.locator("option").all_text_contents()] == [
        "self-attention",
        "value-weighted ‖α·f(x)‖ (each map scaled to its largest)",
        "attention rollout (layers below and heads merged)",
    ]
    viewer.view("matrix")
    viewer.select("Attention", "value-weighted ‖α·f(x)‖ (each map scaled to its largest)")
    viewer.select("Layer", "layer 1")
    viewer.select("Head", "head 2")
    assert viewer.hover_cell(3, 1).weight == pytest.approx(value[1][2, 3, 1].item(), abs=1e-3)
    viewer.select("Attention", "attention rollout (layers below and heads merged)")
    assert page.locator("#ak-head option").all_text_contents() == ["all heads, merged"]
    assert viewer.hover_cell(2, 0).weight == pytest.approx(rollout[1][0, 2, 0].item(), abs=1e-3)
    viewer.view("model")
    assert page.locator(".ak-thumb").count() == 2
