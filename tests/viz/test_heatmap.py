"""Heatmaps: figures to reuse, files in the asked format, long inputs reduced and readable,
causal cells greyed."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba

from attnkit.viz import heatmap
from attnkit.viz.heatmap import (
    DEFAULT_DPI,
    MASKED_COLOUR,
    MAX_CELLS,
    MAX_FIGSIZE,
    MAX_TICKS,
    block_max,
    causal_mask,
    draw_attention_heads,
    draw_heatmap,
    drawn_values,
    plot_attention,
    plot_attention_heads,
    save_figure,
)


def test_png_and_svg_are_written(tmp_path):
    weights = torch.softmax(torch.randn(6, 6), dim=-1)
    tokens = ["The", "cat", "sat", "on", "the", "mat"]
    png = draw_heatmap(weights, tokens, tokens, tmp_path / "map.png", title="Last layer, head 0")
    svg = draw_heatmap(weights, tokens, tokens, tmp_path / "map.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = svg.read_text()
    assert "<svg" in text
    # SVG text stays text: every label and annotated value can be found in the file.
    assert all(f">{t}<" in text for t in tokens)
    assert f">{weights[2, 3].item():.2f}<" in text


def test_a_laid_out_figure_is_drawn_once_when_saved(tmp_path, monkeypatch):
    """The labels are fitted once, when the figure is made: saving draws the figure once,
    not a second time to lay it out again."""
    tokens = ["The", "cat", "sat"]
    fig = plot_attention(torch.softmax(torch.randn(3, 3), dim=-1), tokens, tokens)
    draws = []
    draw = type(fig).draw
    monkeypatch.setattr(type(fig), "draw", lambda self, renderer: (draws.append(renderer), draw(self, renderer))[1])
    save_figure(fig, tmp_path / "map.png")
    assert len(draws) == 1


def test_label_mismatch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"weights are \[2, 3\] but got 2 query and 2 key labels"):
        draw_heatmap(torch.rand(2, 3), ["a", "b"], ["a", "b"], tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"weights must be \[s_q, s_k\]"):
        draw_heatmap(torch.rand(1, 2, 3), ["a"], ["a"], tmp_path / "x.png")


def causal_weights(s: int, seed: int = 0) -> torch.Tensor:
    scores = torch.randn(s, s, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(scores.masked_fill(~causal_mask(s, s), float("-inf")), dim=-1)  # [s, s]


def test_plot_attention_returns_a_figure_and_draws_into_a_given_axes():
    from matplotlib.figure import Figure

    tokens = ["The", "cat", "sat"]
    fig = plot_attention(torch.eye(3), tokens, tokens)
    assert isinstance(fig, Figure)
    outer = Figure()
    left, right = outer.subplots(1, 2)
    assert plot_attention(torch.eye(3), tokens, tokens, ax=right, title="mine") is outer
    assert right.get_title() == "mine" and len(right.images) == 1 and not left.images


@pytest.mark.slow
def test_long_inputs_are_reduced_by_block_max_with_thinned_ticks(tmp_path):
    s = 2000
    weights = causal_weights(s)
    labels = [f"w{i}" for i in range(s)]
    fig = plot_attention(weights, labels, labels, causal=True)
    ax = fig.axes[0]
    shown = ax.images[0].get_array()
    assert max(shown.shape) <= MAX_CELLS
    # Block max: the largest weight of the map survives the reduction.
    assert float(shown.max()) == pytest.approx(float(weights.max()))
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert len(ticks) <= MAX_TICKS and ticks[1] == "w50 · 50"
    assert not ax.texts  # no numbers in cells
    assert ax.images[0].norm.__class__.__name__ == "PowerNorm"  # square root by default
    png = draw_heatmap(weights, labels, labels, tmp_path / "long.png", causal=True)
    width, height = struct.unpack(">II", png.read_bytes()[16:24])
    assert width <= MAX_FIGSIZE[0] * DEFAULT_DPI and height <= MAX_FIGSIZE[1] * DEFAULT_DPI
    assert png.stat().st_size < 2_000_000


def test_block_max_keeps_each_blocks_largest_value_and_ignores_masked_cells():
    values = np.array([[1.0, 5.0, 2.0], [np.nan, 3.0, np.nan], [4.0, np.nan, np.nan]])
    reduced = block_max(values, 2, 2)
    assert reduced.shape == (2, 2)
    assert reduced[0, 0] == 5.0 and reduced[0, 1] == 2.0 and reduced[1, 0] == 4.0 and np.isnan(reduced[1, 1])


def test_causal_cells_are_greyed_not_printed_as_zeros(tmp_path):
    tokens = ["The", "cat", "sat", "on"]
    fig = plot_attention(causal_weights(4), tokens, tokens, causal=True)
    ax = fig.axes[0]
    shown = ax.images[0].get_array()
    assert shown.mask.sum() == 6 and shown.mask[0, 1] and not shown.mask[1, 0]  # above the diagonal
    assert len(ax.texts) == 10 and "0.00" not in [t.get_text() for t in ax.texts]
    assert tuple(ax.images[0].cmap.get_bad()) == to_rgba(MASKED_COLOUR)


@pytest.mark.parametrize(("scale", "norm"), [("linear", "Normalize"), ("sqrt", "PowerNorm"), ("log", "LogNorm")])
def test_colour_scales(scale, norm):
    fig = plot_attention(causal_weights(5), list("abcde"), list("abcde"), scale=scale, cmap="magma")
    image = fig.axes[0].images[0]
    assert type(image.norm).__name__ == norm and image.cmap.name.startswith("magma")


def test_unknown_scale_and_colour_map_are_errors():
    with pytest.raises(ValueError, match="scale must be one of linear, sqrt, log, got 'cubic'"):
        plot_attention(torch.eye(2), ["a", "b"], ["a", "b"], scale="cubic")
    with pytest.raises(ValueError, match="unknown colour map 'Bluez'"):
        plot_attention(torch.eye(2), ["a", "b"], ["a", "b"], cmap="Bluez")


def test_heads_as_small_multiples_in_one_figure_on_one_scale(tmp_path):
    tokens = ["The", "cat", "sat", "on", "the", "mat"]
    weights = torch.stack([causal_weights(6, seed) for seed in range(9)])  # [9, 6, 6]
    fig = plot_attention_heads(weights, tokens, tokens, heads=list(range(9)), causal=True, title="Layer 29")
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == [f"head {h}" for h in range(9)]
    assert [ax.images[0].norm.vmax for ax in panels] == [pytest.approx(float(weights.max()))] * 9
    path = draw_attention_heads(weights, tokens, tokens, tmp_path / "heads.svg", causal=True)
    assert path.read_text().count(">head ") == 9
    with pytest.raises(ValueError, match="weights hold 9 heads but got 2 head numbers"):
        plot_attention_heads(weights, tokens, tokens, heads=[0, 1])


def test_dpi_and_figsize_set_the_picture_size(tmp_path):
    png = draw_heatmap(torch.eye(3), list("abc"), list("abc"), tmp_path / "map.png", dpi=50, figsize=(4, 3))
    assert struct.unpack(">II", png.read_bytes()[16:24]) == (200, 150)


def test_a_signed_map_is_diverging_centred_on_zero_with_its_quantity_on_the_bar():
    values = torch.tensor([[-0.5, 0.2], [0.1, 0.25]])
    fig = plot_attention(values, ["a", "b"], ["a", "b"], label="α·∂/∂α")
    image = fig.axes[0].images[0]
    assert image.cmap.name == "RdBu" and image.norm.vmin == -0.5 and image.norm.vmax == 0.5
    assert fig.axes[1].get_ylabel() == "α·∂/∂α (centred on 0)"
    weights = plot_attention(values.abs(), ["a", "b"], ["a", "b"], label="‖α·f(x)‖")
    assert weights.axes[0].images[0].cmap.name == "Blues" and weights.axes[0].images[0].norm.vmin == 0.0
    assert weights.axes[1].get_ylabel() == "‖α·f(x)‖ (linear scale)"


@pytest.mark.parametrize("first_query", [None, 3])
def test_a_map_is_drawn_a_few_rows_at_a_time_with_the_same_cells(monkeypatch, first_query):
    weights = torch.rand(37, 50)
    weights[5, 7] = -0.5  # a signed map, found in any chunk
    for factors in ((1, 1), (4, 3)):
        whole = weights.numpy().copy()
        whole[~causal_mask(37, 50, first_query).numpy()] = np.nan
        want = whole if factors == (1, 1) else block_max(whole, *factors, signed=True)
        monkeypatch.setattr(heatmap, "DRAWN_CHUNK_CELLS", 200)  # 4 rows of 50 keys at a time
        got, signed = drawn_values(weights, *factors, causal=True, first_query=first_query)
        assert signed and np.array_equal(got, want, equal_nan=True)


def test_the_causal_cells_of_a_map_of_some_rows_start_at_their_own_position():
    # Rows 2..4 of 6 keys: query 2 sees keys 0..2, not the bottom-right alignment's 0..3.
    assert causal_mask(3, 6, first_query=2).tolist() == [
        [True, True, True, False, False, False],
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
    ]
    assert causal_mask(3, 6).tolist()[0] == [True, True, True, True, False, False]
