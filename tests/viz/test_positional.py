"""Positional-encoding pictures: the numbers behind them come from attnkit.nn and have the
properties the notes describe."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import RotaryEmbedding, SinusoidalPositionalEncoding
from attnkit.viz.positional import (
    default_dimensions,
    draw_dimensions,
    draw_position_pair,
    draw_positional_pictures,
    rotary_similarity,
    sinusoidal_periods,
    sinusoidal_similarity,
)


def test_periods_follow_the_formula() -> None:
    periods = sinusoidal_periods(SinusoidalPositionalEncoding(512), [0, 1, 10, 300, 511])
    assert periods[0] == periods[1] == pytest.approx(2 * math.pi)  # sin and cos of pair 0
    for dim, period in zip([10, 300, 511], periods[2:]):
        assert period == pytest.approx(2 * math.pi * 10000 ** (2 * (dim // 2) / 512), rel=1e-5)
    assert default_dimensions(512) == [0, 10, 300, 511] and default_dimensions(64) == [0, 1, 37, 63]


def test_near_positions_are_more_alike_and_similarity_is_relative() -> None:
    pe = SinusoidalPositionalEncoding(512)
    curve = sinusoidal_similarity(pe, 600)
    table = pe.encodings(torch.tensor([3, 4, 500]))
    assert curve[0] == pytest.approx(1.0)
    # PE(p)·PE(p+Δ) = Σ cos(ω_i Δ) does not depend on p.
    assert curve[1].item() == pytest.approx(F.cosine_similarity(table[0], table[1], dim=0).item(), abs=1e-5)
    assert curve[497].item() == pytest.approx(F.cosine_similarity(table[0], table[2], dim=0).item(), abs=1e-4)
    assert curve[1] > 0.95 > 0.3 > curve[497]


def test_rotary_score_depends_on_the_distance_only() -> None:
    rope = RotaryEmbedding(64)
    q = torch.randn(64, generator=torch.Generator().manual_seed(0))
    from_0, from_37 = rotary_similarity(rope, q, 300), rotary_similarity(rope, q, 300, start=37)
    torch.testing.assert_close(from_0, from_37, atol=1e-5, rtol=0)
    assert from_0[0] == pytest.approx(1.0)
    # With equal energy in every rotation pair, q·k is Σ cos(ω_j Δ): the sinusoidal curve
    # exactly, since both use the frequencies base^(-2j/d).
    torch.testing.assert_close(
        rotary_similarity(rope, torch.ones(64), 300),
        sinusoidal_similarity(SinusoidalPositionalEncoding(64), 300),
        atol=1e-5,
        rtol=0,
    )
    with pytest.raises(ValueError, match=r"vector must be \[d\] with d = 64, got \[32\]"):
        rotary_similarity(rope, torch.ones(32), 10)


def test_pictures_are_written(tmp_path) -> None:
    pictures = draw_positional_pictures(tmp_path, d_model=64, pairs=[(3, 4)], max_position=50, max_distance=100)
    assert [p.name for p in pictures.files] == ["pe_positions_3_4.png", "pe_dimensions.png", "pe_similarity.png"]
    for path in pictures.files:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(pictures.periods) == [0, 1, 37, 63] and pictures.sinusoidal.shape == (101,)
    assert set(pictures.rotary) == {0, 100} and pictures.pair_similarity[(3, 4)] > 0.9


def test_bad_arguments(tmp_path) -> None:
    pe = SinusoidalPositionalEncoding(64)
    with pytest.raises(ValueError, match=r"dimensions must be in \[0, 64\)"):
        draw_dimensions(pe, [0, 64], 10, tmp_path / "x.png")
    with pytest.raises(ValueError, match="positions must be >= 0"):
        draw_position_pair(pe, (-1, 3), tmp_path / "x.png")
    with pytest.raises(ValueError, match="max_distance and max_position must be >= 1"):
        draw_positional_pictures(tmp_path, d_model=64, max_distance=0)
    with pytest.raises(ValueError, match="embed_dim must be even"):
        draw_positional_pictures(tmp_path, d_model=63)
    assert not list(tmp_path.iterdir())
