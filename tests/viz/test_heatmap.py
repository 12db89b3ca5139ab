"""Heatmaps: files are written in the asked format with the right size and labels."""

from __future__ import annotations

import pytest
import torch

from attnkit.viz.heatmap import draw_heatmap


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


def test_label_mismatch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"weights are \[2, 3\] but got 2 query and 2 key labels"):
        draw_heatmap(torch.rand(2, 3), ["a", "b"], ["a", "b"], tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"weights must be \[s_q, s_k\]"):
        draw_heatmap(torch.rand(1, 2, 3), ["a"], ["a"], tmp_path / "x.png")
