"""Fonts for labels in any script: Hangul is drawn with a font that has it, or a clear
warning names the package to install — never silent empty boxes."""

from __future__ import annotations

import warnings

import pytest
import torch
from matplotlib import font_manager

from attnkit.viz import fonts
from attnkit.viz.fonts import CJK_FONT_PACKAGE, choose_fonts, font_covers, needed_characters
from attnkit.viz.heatmap import draw_heatmap

LABELS = ["어제", "밤에", "배(1/3)", "고파서", "피자를", "먹었다", "[CLS]", "␣", "the₁", "\\n"]
NEEDS_FONT = f"no installed font has Hangul; install one, e.g. apt-get install {CJK_FONT_PACKAGE}"


def test_the_chosen_fonts_cover_every_label_character():
    choice = choose_fonts(LABELS)
    assert choice.missing == "", NEEDS_FONT
    assert choice.families[0] == "DejaVu Sans"  # Latin labels keep matplotlib's font
    covered = set()
    for family in choice.families:
        covered |= {ch for ch in needed_characters(LABELS) if font_covers(family, ch)}
    assert covered == needed_characters(LABELS)
    assert any(font_covers(family, "어제밤에배가고파서피자를먹었다") for family in choice.families)


def test_latin_labels_need_no_fallback():
    assert choose_fonts(["The", "cat", "sat", "␣"]) == fonts.FontChoice(("DejaVu Sans",), "")
    assert needed_characters(["a b\n", "\t"]) == {"a", "b"}


def test_fonts_installed_after_matplotlibs_cache_are_found(monkeypatch):
    # As on a machine where the font package came after matplotlib built its font list:
    # matplotlib knows only the fonts it ships.
    own = [e for e in font_manager.fontManager.ttflist if "mpl-data" in str(e.fname)]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", own)
    assert choose_fonts(["배가"]).missing == "", NEEDS_FONT


def test_an_uncovered_script_warns_once_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setattr(fonts, "_cover", lambda font_manager, missing, exclude: ([], missing))
    monkeypatch.setattr(fonts, "_register_system_fonts", lambda font_manager: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draw_heatmap(torch.eye(2), ["배가", "고파서"], ["배가", "고파서"], tmp_path / "map.png")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages  # not one more per missing glyph from matplotlib
    assert "'가고배서파'" in messages[0] and f"apt-get install {CJK_FONT_PACKAGE}" in messages[0]
    assert (tmp_path / "map.png").is_file()


def test_font_covers_an_unknown_family_is_an_error():
    with pytest.raises(ValueError, match="no installed font of family 'No Such Font'"):
        font_covers("No Such Font", "a")


MATH_LIKE = ["$$", "$\\frac$", "It costs $5 or $6", "$x^2$", "a\\$b", "_^{}%#&~"]


def test_labels_with_dollars_and_math_characters_are_drawn_as_written(tmp_path):
    from attnkit.viz.fonts import plain_text
    from attnkit.viz.head_grid import draw_head_grid
    from attnkit.viz.heatmap import draw_attention_heads

    weights = torch.rand(len(MATH_LIKE), len(MATH_LIKE))
    title = "It costs $$ today"
    draw_heatmap(weights, MATH_LIKE, MATH_LIKE, tmp_path / "map.svg", title=title, xlabel="$k$", ylabel="$q")
    draw_attention_heads(weights.expand(2, -1, -1), MATH_LIKE, MATH_LIKE, tmp_path / "heads.png", title=title)
    grid = torch.rand(2, len(MATH_LIKE))
    draw_head_grid(grid, tmp_path / "grid.png", title=title, label="$", columns=MATH_LIKE, rows=["$0$", "$$"])
    svg = (tmp_path / "map.svg").read_text()
    # SVG keeps text as text: each label appears literally (XML-escaped), none typeset.
    for text in [title, "It costs $5 or $6", "$x^2$", "a\\$b", "_^{}%#&amp;~"]:
        assert text in svg
    assert plain_text("a $ b") == "a \\$ b"
