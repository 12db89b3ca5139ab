"""Local (sliding-window) and global layers told apart: the model's per-layer windows reach
the attention map, its terminal header and the viewer's data, on a tiny random Gemma 3
(local, global, local layers); and the viewer data's other per-token and per-layer
annotations (windows, word starts) are checked."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect import attention_map
from attnkit.viz.attention_text import render_map
from attnkit.viz.viewer import Section, ViewerData, viewer_data_from_run
from tests.fixtures.tiny_families import WINDOW, write_tiny_family

TEXT = " ".join(f"w{n}" for n in range(10))  # longer than the window


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3") / "gemma3"
    folder.mkdir()
    return models.load(write_tiny_family("gemma3_text", folder))


def test_the_terminal_header_tags_local_and_global_layers(gemma3) -> None:
    local = attention_map(gemma3, TEXT, layer=0)
    assert (local.window, local.layer_kind) == (WINDOW, f"local ({WINDOW})")
    assert render_map(local).splitlines()[0].startswith(f"gemma3 · layer 0 (0..2), local ({WINDOW}) · head 0")
    assert (
        render_map(attention_map(gemma3, TEXT, layer=1))
        .splitlines()[0]
        .startswith("gemma3 · layer 1 (0..2), global · head 0")
    )
    # Outside the window the weights are zero: what the viewer greys.
    s = len(local.labels)
    assert float(local.weights[0, s - 1, : s - WINDOW].abs().sum()) == 0


def test_a_model_without_local_layers_says_nothing_of_them(tmp_path) -> None:
    folder = tmp_path / "gpt2"
    folder.mkdir()
    gpt2 = models.load(write_tiny_family("gpt2", folder))
    amap = attention_map(gpt2, TEXT, layer=0)
    assert (amap.layer_windows, amap.layer_kind) == (None, "")
    assert "local" not in render_map(amap).splitlines()[0] and "global" not in render_map(amap).splitlines()[0]
    run = gpt2.run(TEXT, return_weights=True)
    assert viewer_data_from_run(gpt2, run, text=TEXT).sections["self"].windows is None


def test_viewer_data_carries_each_layers_window_between_tokens_only(gemma3) -> None:
    run = gemma3.run(TEXT, return_weights=True)
    data = viewer_data_from_run(gemma3, run, text=TEXT)
    assert data.sections["self"].windows == (WINDOW, None, WINDOW)
    assert ViewerData.from_json(data.to_json()).sections["self"].windows == (WINDOW, None, WINDOW)
    # Between words a window of tokens has no exact meaning: no window is drawn.
    assert viewer_data_from_run(gemma3, run, text=TEXT, level="word").sections["self"].windows is None


def test_a_section_checks_its_windows() -> None:
    weights = torch.full((2, 1, 3, 3), 1 / 3)
    section = Section(("a", "b", "c"), ("a", "b", "c"), (0, 1), (0,), weights, windows=(None, None))
    assert section.windows is None  # no local layer
    with pytest.raises(ValueError, match="one positive window or None per layer"):
        Section(("a", "b", "c"), ("a", "b", "c"), (0, 1), (0,), weights, windows=(2,))
    with pytest.raises(ValueError, match="one positive window or None per layer"):
        Section(("a", "b", "c"), ("a", "b", "c"), (0, 1), (0,), weights, windows=(0, None))


def test_word_starts_are_one_flag_per_token_of_a_self_section() -> None:
    weights = torch.full((1, 1, 3, 3), 1 / 3)
    section = Section(("a", "b", "c"), ("a", "b", "c"), (0,), (0,), weights, word_starts=(True, False, True))
    assert Section.from_dict(section.to_dict()).word_starts == (True, False, True)
    with pytest.raises(ValueError, match="one flag per token"):
        Section(("a", "b", "c"), ("a", "b", "c"), (0,), (0,), weights, word_starts=(True,))
    with pytest.raises(ValueError, match="one flag per token"):
        Section(("a", "b", "c"), ("x", "y", "z"), (0,), (0,), weights, word_starts=(True, False, True))


def test_a_notebook_map_of_a_local_layer_carries_its_window(gemma3) -> None:
    from attnkit.viz.notebook import notebook_html_of

    assert "&quot;windows&quot;:[6]" in notebook_html_of(attention_map(gemma3, TEXT, layer=0)).replace(" ", "")
    assert "&quot;windows&quot;" not in notebook_html_of(attention_map(gemma3, TEXT, layer=0, level="word"))
