"""Terminal views of attention maps and head statistics, and the layers × heads pictures."""

from __future__ import annotations

import pytest
import torch

from attnkit.inspect.maps import AttentionMap
from attnkit.inspect.survey import DESCRIPTIONS, HeadSurvey, TokenPair
from attnkit.viz.attention_text import MAX_LISTED, MAX_ROWS, TAIL_ROWS, head_roles, numbered, render_map, render_survey
from attnkit.viz.head_grid import draw_head_grid, plot_head_grid
from attnkit.viz.terminal import display_width


def causal_map() -> AttentionMap:
    labels = ["The", "cat", "sat", "on", "the", "mat", "."]
    s = len(labels)
    weights = torch.ones(s, s).tril()
    weights[:, 0] += 3  # most attention on "The"
    weights = weights.tril() / weights.tril().sum(-1, keepdim=True)
    return AttentionMap(
        model_name="toy",
        text="The cat sat on the mat.",
        tokens=["The", *("Ġ" + t for t in labels[1:6]), "."],
        labels=labels,
        layer=29,
        num_layers=30,
        heads=[0],
        weights=weights[None],
    )


def test_render_map_lists_tokens_and_top_keys_per_query():
    text = render_map(causal_map(), top=2)
    assert "toy · layer 29 (0..29) · head 0 · 7 tokens" in text
    # Tokens as they read in the text, not as the tokenizer spells them ("Ġcat").
    assert "tokens: The | cat | sat | on | the | mat | .\n" in text
    assert "Layer 29, head 0" in text
    rows = {
        line.split()[1]: line.split()[2:]
        for line in text.splitlines()
        if line.split()[:1] and line.split()[0].isdigit()
    }
    # Query 0 sees only itself; a causal map shows no weight on later keys.
    assert rows["The"] == ["The", "1.00"]
    assert rows["cat"] == ["The", "0.80", "cat", "0.20"]
    assert rows["."][:2] == ["The", f"{4 / 10:.2f}"]
    assert max(display_width(line) for line in text.splitlines()) <= 100


def test_numbered_labels_tell_repeated_tokens_apart():
    assert numbered(["the", "cat", "the", "The"]) == ["the₁", "cat", "the₂", "The"]


def survey(pair: bool = False) -> HeadSurvey:
    layers, heads = 30, 9
    stats = {name: torch.zeros(layers, heads) for name in DESCRIPTIONS}
    stats["previous"][3, 2] = 0.9
    stats["induction"][17, 4] = 0.8
    stats["first"][:, :] = 0.6
    stats["self"][11, 6] = 0.85
    stats["entropy"][0, 1] = 2.5
    mass = torch.zeros(layers, heads)
    mass[13, 8] = 0.76
    token_pair = TokenPair("it", "animal", mass, texts=1, uniform=0.11) if pair else None
    return HeadSurvey(
        model_name="toy",
        num_layers=layers,
        num_heads=heads,
        texts=1,
        tokens=13,
        statistics=stats,
        induction_period=50,
        induction_seed=0,
        pair=token_pair,
    )


def test_head_roles_follow_the_priority_of_roles():
    roles = head_roles(survey())
    assert roles[3][2] == "P" and roles[17][4] == "I" and roles[11][6] == "S" and roles[0][0] == "F"


def test_render_survey_fits_100_columns_and_ranks_heads():
    text = render_survey(survey(pair=True), top=3)
    assert max(display_width(line) for line in text.splitlines()) <= 100
    previous = next(line for line in text.splitlines() if line.startswith("previous"))
    assert previous.split()[2:4] == ["L3H2", "0.90"]
    assert "How much 'it' attends to 'animal'" in text
    first_rank = next(line for line in text.splitlines() if line.startswith("1 "))
    assert first_rank.split() == ["1", "13", "8", "0.76"]
    assert "Head roles" in text
    # The role grid: one row per layer, one letter per head.
    assert "   17  F  F  F  F  I  F  F  F  F" in text


def test_render_survey_can_print_one_statistic_as_numbers():
    text = render_survey(survey(), stat="self")
    assert "self: mass on the token itself, layers × heads" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("11 "))
    assert row.split()[7] == "0.85"
    with pytest.raises(ValueError, match="unknown statistic 'nope'"):
        render_survey(survey(), stat="nope")


def test_draw_head_grid_writes_png_and_svg(tmp_path):
    values = torch.rand(6, 12)
    png = draw_head_grid(values, tmp_path / "grid.png", title="first — toy", label="mass")
    svg = draw_head_grid(values, tmp_path / "grid.svg", title="first — toy", label="mass")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f">{values[2, 3].item():.2f}<" in svg.read_text()
    with pytest.raises(ValueError, match=r"\[layers, heads\]"):
        draw_head_grid(torch.rand(3), tmp_path / "x.png", title="t", label="l")


def test_long_maps_print_a_shortened_table_saying_what_was_left_out():
    s = 300
    labels = [f"w{i}" for i in range(s)]
    weights = torch.softmax(torch.randn(s, s), dim=-1)
    amap = AttentionMap(
        model_name="toy",
        text=" ".join(labels),
        tokens=labels,
        labels=labels,
        layer=0,
        num_layers=1,
        heads=[0],
        weights=weights[None],
    )
    lines = render_map(amap).splitlines()
    numbered_rows = [line.split()[0] for line in lines if line.split()[:1] and line.split()[0].isdigit()]
    assert numbered_rows == [*map(str, range(MAX_ROWS - TAIL_ROWS)), *map(str, range(s - TAIL_ROWS, s))]
    assert (
        f"… {s - MAX_ROWS} query rows left out ({MAX_ROWS - TAIL_ROWS}..{s - TAIL_ROWS - 1}); "
        "the JSON file (--format json) has every row" in lines
    )
    assert any(line.endswith(f"| … {s - MAX_LISTED} more") for line in lines)
    assert len(lines) < 80


@pytest.mark.slow
def test_plot_head_grid_returns_a_figure_and_takes_an_axes():
    from matplotlib.figure import Figure

    outer = Figure()
    left, right = outer.subplots(1, 2)
    assert plot_head_grid(torch.rand(6, 12), title="first", label="mass", ax=left) is outer
    assert left.get_title() == "first" and len(left.images) == 1 and not right.images
    assert isinstance(plot_head_grid(torch.rand(2, 3), title="t", label="l", cmap="viridis"), Figure)
