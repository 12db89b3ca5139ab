"""Signed figures of `attnkit heads --ablate` and `attnkit patch` (by head, and by layer and
position): without --cmap, a negative cell is red and a positive one blue (a diverging map
centred on zero), read from the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from tests.fixtures.crafted import write_tiny_llama

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny")


def _cell_colours(
    png: Path, effects: list[list[float]], *, title: str, label: str, **axes
) -> dict[tuple[int, int], tuple]:
    """The RGB of each cell of a head grid PNG, read beside the cell's centre (where its
    number is written): the grid is drawn again to find where each cell lies."""
    from attnkit.viz.head_grid import plot_head_grid

    image = matplotlib.image.imread(png)
    fig = plot_head_grid(torch.tensor(effects), title=title, label=label, symmetric=True, cmap="RdBu", **axes)
    fig.set_dpi(100)
    fig.canvas.draw()
    ax = fig.axes[0]
    colours = {}
    for layer, row in enumerate(effects):
        for head in range(len(row)):
            x, y = ax.transData.transform((head - 0.35, layer))
            colours[layer, head] = tuple(image[int(round(image.shape[0] - y)), int(round(x)), :3])
    return colours


def _check_signed_png(out: Path, stem: str) -> None:
    data = json.loads((out / f"{stem}.json").read_text())
    effects = data["effects"]
    title = f"{data['kind'] if data['replacement'] != 'mean' else 'mean-ablation'} — {data['model']}"
    axes = {}
    if data["by"] != "head":
        title = f"patching {data['component']} by {data['by']} — {data['model']}"
        axes = {"rows": [str(layer) for layer in data["layers"]], "columns": data["columns"]}
        axes["xlabel"] = "position (clean token)"
    colours = _cell_colours(out / f"{stem}.png", effects, title=title, label=data["metric"], **axes)
    flat = {(layer, head): v for layer, row in enumerate(effects) for head, v in enumerate(row)}
    negative, positive = min(flat, key=flat.get), max(flat, key=flat.get)
    assert flat[negative] < 0 < flat[positive], "the fixture should give effects of both signs"
    # The most positive cell is at the blue end of the scale; the most negative one is red
    # in proportion to its size (a one-directional map would draw both in one hue).
    red, _, blue = colours[negative]
    assert red - blue > 0.05, f"negative cell {negative} ({flat[negative]:.3f}) is not red: {colours[negative]}"
    red, _, blue = colours[positive]
    assert blue - red > 0.3, f"positive cell {positive} ({flat[positive]:.3f}) is not blue: {colours[positive]}"


def test_ablation_png_is_diverging_without_cmap(tiny, tmp_path, capsys):
    code = main(
        ["heads", "the cat sat on the", "--ablate", "--target", "mat", "--model", str(tiny), "--out", str(tmp_path)]
        + ["--format", "png,json", "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    _check_signed_png(tmp_path, "tiny_ablation")


def test_patching_png_is_diverging_without_cmap(tiny, tmp_path, capsys):
    code = main(
        ["patch", "--clean", "the cat sat on the", "--corrupt", "a cat sat on a", "--target", "mat", "--wrong", "b"]
        + ["--model", str(tiny)]
        + ["--out", str(tmp_path), "--format", "png,json", "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    _check_signed_png(tmp_path, "tiny_patching")


def test_patching_by_layer_and_position_png_is_diverging_without_cmap(tiny, tmp_path, capsys):
    code = main(
        ["patch", "--clean", "the cat sat on the", "--corrupt", "a cat sat on a", "--target", "mat", "--wrong", "b"]
        + ["--by", "layer-position", "--component", "mlp_out", "--model", str(tiny)]
        + ["--out", str(tmp_path), "--format", "png,json", "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    _check_signed_png(tmp_path, "tiny_patching_mlp_out_by-layer-position")
