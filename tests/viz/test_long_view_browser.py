"""The viewer's long view in a real headless Chromium, on a tiny random Gemma 3: the exported
page shows the reduced map (max and mean), a query's top keys and the heads' summaries; in
`attnkit serve` a dragged region is replaced by its exact weights from the model, equal to
the dense map, and Zoom out goes back."""

from __future__ import annotations

import pytest

from attnkit import models
from attnkit.inspect.long_context import long_context_summaries
from attnkit.serve import background, create_app
from attnkit.viz.viewer.long_view import long_viewer_data, write_long_html
from tests.browser import READY, browser, page  # noqa: F401 (fixtures)

TEXT = " ".join(f"w{(i * 11) % 50 + 1}" for i in range(40))


def tooltip(page) -> dict[str, str]:
    page.wait_for_selector("#ak-tooltip:not([hidden])")
    return {k: page.text_content(f"#ak-tooltip .ak-tt-{k}").strip() for k in ("query", "key", "weight", "note")}


def cell_point(page, i: int, j: int) -> tuple[float, float]:
    """The page coordinates of the centre of cell (i, j) of the long map."""
    canvas = page.locator("#ak-long-map")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    cw, ch = (float(canvas.get_attribute(f"data-cell-{k}")) for k in ("width", "height"))
    left, top = (float(canvas.get_attribute(f"data-{k}")) for k in ("left", "top"))  # the labels' room
    return box["x"] + left + (j + 0.5) * cw, box["y"] + top + (i + 0.5) * ch


def hover(page, i: int, j: int) -> dict[str, str]:
    page.mouse.move(*cell_point(page, i, j))
    return tooltip(page)


@pytest.fixture(scope="module")
def gemma3(tiny_family_folder):
    folder = tiny_family_folder("gemma3_text")
    return folder, models.load(folder)


def test_exported_long_view_shows_the_reduced_map_top_keys_and_summaries(gemma3, page, tmp_path):
    _, model = gemma3
    run = long_context_summaries(model, TEXT, layers=[0, 1], top_k=3, window=4, map_block=8)
    _, tokens, _ = model.prepare_input(TEXT)
    path = write_long_html(tmp_path / "long.html", long_viewer_data(run, tokens, model_name=model.name, causal=True))
    page.goto(path.as_uri())
    page.wait_for_selector(READY)
    canvas = page.locator("#ak-long-map")
    assert (canvas.get_attribute("data-rows"), canvas.get_attribute("data-shows")) == ("5", "max")
    summary = run.summaries[0]
    # The heads' summaries beside the map, the first head current.
    rows = page.locator("#ak-long-head-rows tr")
    assert rows.count() == model.num_heads
    first = rows.nth(0).locator("td").all_text_contents()
    assert first[0] == "head 0" and float(first[1]) == pytest.approx(summary.head_table()[0]["sink"], abs=1e-3)
    # A cell's tooltip: the block's largest weight, then its mean.
    tip = hover(page, 3, 1)
    assert tip["query"].startswith("#24\u201331") and tip["key"].startswith("#8\u201315")
    assert float(tip["weight"]) == pytest.approx(float(summary.block_max[0, 3, 1]), abs=2e-5)
    page.get_by_label("Block value", exact=True).select_option(label="mean weight")
    page.wait_for_selector(READY)
    assert canvas.get_attribute("data-shows") == "mean"
    assert float(hover(page, 3, 1)["weight"]) == pytest.approx(float(summary.block_mean[0, 3, 1]), abs=2e-6)
    # A click lists the top keys of one of the block's queries, as the summaries found them.
    page.mouse.click(*cell_point(page, 4, 0))
    query = int(page.text_content("#ak-long-query").split("#")[1].split(",")[0])
    assert 32 <= query < 40
    listed = page.locator("#ak-long-top-rows tr")
    assert listed.count() == 3
    for n in range(3):
        cells = listed.nth(n).locator("td").all_text_contents()
        key = int(summary.top_keys[0, query, n])
        assert cells[1].endswith(f"#{key}") and int(cells[3]) == query - key
        assert float(cells[2]) == pytest.approx(float(summary.top_weights[0, query, n]), abs=1e-4)
    # The keyboard: focused again, the map's cursor starts on the selected cell (4, 0) and
    # moves with the arrows; Enter clicks its cell.
    page.locator("#ak-long-hint").click()
    canvas.focus()
    for key in ("ArrowUp", "ArrowUp", "ArrowRight", "Enter"):
        page.keyboard.press(key)
    assert "queries #16\u201323, keys #8\u201315" in page.text_content("#ak-long-where")
    assert 16 <= int(page.text_content("#ak-long-query").split("#")[1].split(",")[0]) < 24
    # Another layer and head.
    page.get_by_label("Layer", exact=True).select_option(label="layer 1")
    page.get_by_label("Head", exact=True).select_option(label="head 2")
    page.wait_for_selector(READY)
    assert page.locator("#ak-long-head-rows tr.ak-current td").first.text_content() == "head 2"
    page.get_by_label("Block value", exact=True).select_option(label="largest weight (max)")
    page.wait_for_selector(READY)
    assert float(hover(page, 2, 2)["weight"]) == pytest.approx(float(run.summaries[1].block_max[2, 2, 2]), abs=2e-5)
    # The exported page offers no zoom: exact weights come from attnkit serve.
    assert page.locator("#ak-long-zoom").is_hidden() and "attnkit serve" in page.text_content("#ak-long-hint")


@pytest.fixture(scope="module")
def server(gemma3):
    folder, _ = gemma3
    app = create_app([str(folder)], allowed_hosts=["127.0.0.1", "localhost"])
    with background(app) as url:
        yield url


def test_serve_zooms_a_dragged_region_to_exact_weights_and_back(gemma3, server, page):
    folder, model = gemma3
    name = model.hook_name("self_attn.pattern", 1)
    dense = model.run(TEXT, return_weights=False, logits=False, names_filter=[name]).cache[name][0]  # [h, s, s]
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    page.get_by_label("Text", exact=True).fill(TEXT)
    page.get_by_label("Long text", exact=True).select_option(value="on")
    page.get_by_label("Layers to compute", exact=True).select_option(label="layer 1 \u00b7 global")
    page.get_by_label("Heads to compute", exact=True).select_option(label="head 2")
    page.get_by_role("button", name="Show attention").click()
    page.wait_for_selector(READY)
    canvas = page.locator("#ak-long-map")
    assert canvas.get_attribute("data-shows") == "max" and canvas.get_attribute("data-rows") == "40"
    # 40 tokens at the default 256 cells a side: one token per cell, the block's max is the weight.
    assert float(hover(page, 7, 3)["weight"]) == pytest.approx(float(dense[2, 7, 3]), abs=2e-6)

    # Drag across rows 30..37 and keys 3..19: the model computes that region exactly.
    page.mouse.move(*cell_point(page, 30, 3))
    page.mouse.down()
    page.mouse.move(*cell_point(page, 34, 10), steps=4)
    page.mouse.move(*cell_point(page, 37, 19), steps=4)
    page.mouse.up()
    page.wait_for_selector("#ak-long-map[data-shows=exact]")
    page.wait_for_selector(READY)
    assert (canvas.get_attribute("data-rows"), canvas.get_attribute("data-cols")) == ("8", "17")
    for i, j in [(0, 0), (5, 9), (7, 16)]:
        tip = hover(page, i, j)
        assert tip["note"] == "(exact)" and tip["query"].endswith(f"#{30 + i}") and tip["key"].endswith(f"#{3 + j}")
        assert float(tip["weight"]) == pytest.approx(float(dense[2, 30 + i, 3 + j]), abs=2e-6)
    assert "Exact weights of queries #30\u201337 and keys #3\u201319" in page.text_content("#ak-long-where")

    # Zoom out: the reduced map again; then one query's exact row on request.
    page.get_by_role("button", name="Zoom out").click()
    page.wait_for_selector("#ak-long-map[data-shows=max]")
    page.mouse.click(*cell_point(page, 20, 5))
    page.get_by_role("button", name="Exact row of the selected query").click()
    page.wait_for_selector("#ak-long-map[data-shows=exact]")
    page.wait_for_selector(READY)
    assert (canvas.get_attribute("data-rows"), canvas.get_attribute("data-cols")) == ("1", "21")
    assert float(hover(page, 0, 5)["weight"]) == pytest.approx(float(dense[2, 20, 5]), abs=2e-6)

    # Long text off: the full maps of the same text, in the usual views.
    page.get_by_label("Long text", exact=True).select_option(value="off")
    page.get_by_role("button", name="Show attention").click()
    page.wait_for_selector(READY)
    assert page.locator("#ak-long-view").is_hidden() and page.locator("#ak-tab-head").is_visible()
    assert page.locator("#ak-queries .ak-token").count() == 40
    assert page.requests and all(url.startswith(server + "/") for url in page.requests)


def test_serve_tags_local_and_global_layers_in_the_layers_to_compute(gemma3, server, page):
    from tests.fixtures.tiny_families import WINDOW

    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    options = page.get_by_label("Layers to compute", exact=True).locator("option").all_text_contents()
    assert options[2:] == [
        f"layer 0 \u00b7 local ({WINDOW})",
        "layer 1 \u00b7 global",
        f"layer 2 \u00b7 local ({WINDOW})",
    ]


def test_serve_long_map_in_view_and_its_zoom_labelled_with_true_tooltips(gemma3, server, page):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    page.get_by_label("Text", exact=True).fill(TEXT)
    page.get_by_label("Long text", exact=True).select_option(value="on")
    page.get_by_role("button", name="Show attention").click()
    page.wait_for_selector(READY)
    canvas = page.locator("#ak-long-map")
    box = canvas.bounding_box()
    assert box["y"] < 800 and box["height"] <= 800 - 60, box  # its top on the first screen, all of it on one
    # A drag, then the pointer stays still: the tooltip reads the exact map, not the blocks.
    page.mouse.move(*cell_point(page, 30, 3))
    page.mouse.down()
    page.mouse.move(*cell_point(page, 37, 19), steps=4)
    page.mouse.up()
    page.wait_for_selector("#ak-long-map[data-shows=exact]")
    page.wait_for_selector(READY)
    tip = page.locator("#ak-tooltip")
    assert tip.is_hidden() or "(exact)" in tip.text_content() or "(masked)" in tip.text_content()
    # The zoomed cells are labelled with their tokens: room is kept left and above for them.
    assert float(canvas.get_attribute("data-left")) > 0 and float(canvas.get_attribute("data-top")) > 0
    assert float(canvas.get_attribute("data-cell-height")) >= 9
    words = TEXT.split()
    got = hover(page, 2, 4)
    assert got["query"] == f"{words[32]}  #32" and got["key"] == f"{words[7]}  #7"


def test_a_zoom_of_a_hundred_rows_and_keys_is_labelled(page, tmp_path, tiny_family_folder):
    """100 × 100 exact weights, as a dragged region of a long text gives, read in labelled cells
    at 1280×800 (the tables move below the zoom)."""
    import json
    import shutil

    folder = tmp_path / "gemma3_256"
    shutil.copytree(tiny_family_folder("gemma3_text"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    page.set_viewport_size({"width": 1280, "height": 800})
    app = create_app([str(folder)], allowed_hosts=["127.0.0.1", "localhost"])
    text = " ".join(f"w{(i * 7) % 60 + 1}" for i in range(120))
    with background(app) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-state=empty]")
        page.get_by_label("Text", exact=True).fill(text)
        page.get_by_label("Long text", exact=True).select_option(value="on")
        page.get_by_role("button", name="Show attention").click()
        page.wait_for_selector(READY)
        page.eval_on_selector("#ak-long-map", "c => c.scrollIntoView()")  # all of the map on one screen
        page.mouse.move(*cell_point(page, 10, 5))
        page.mouse.down()
        page.mouse.move(*cell_point(page, 109, 104), steps=4)
        page.mouse.up()
        page.wait_for_selector("#ak-long-map[data-shows=exact]")
        page.wait_for_selector(READY)
    canvas = page.locator("#ak-long-map")
    assert (canvas.get_attribute("data-rows"), canvas.get_attribute("data-cols")) == ("100", "100")
    assert float(canvas.get_attribute("data-cell-width")) >= 9 and float(canvas.get_attribute("data-left")) > 0
    assert canvas.bounding_box()["width"] <= 1280


def test_serve_offers_the_value_and_rollout_modes_of_the_exported_page(gemma3, server, page):
    page.goto(server + "/")
    page.wait_for_selector("body[data-state=empty]")
    page.get_by_label("Text", exact=True).fill(TEXT)
    page.get_by_label("Colours", exact=True).select_option(label="weights, value-weighted and rollout")
    page.get_by_role("button", name="Show attention").click()
    page.wait_for_selector(READY)
    sections = page.get_by_label("Attention", exact=True).locator("option").all_text_contents()
    assert sections == [
        "self-attention",
        "value-weighted \u2016\u03b1\u00b7f(x)\u2016 (each map scaled to its largest)",
        "attention rollout (layers below and heads merged)",
    ]
    page.get_by_label("Attention", exact=True).select_option(value="rollout")
    page.wait_for_selector(READY)
    assert page.get_by_label("Head", exact=True).locator("option").all_text_contents() == ["all heads, merged"]
