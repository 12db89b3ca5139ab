"""Pictures of positional encodings (docs/positional-encoding.md): the sinusoidal encoding
of two positions across dimensions, single dimensions across positions, and how similar
two positions' encodings are as a function of their distance, sinusoidal against rotary.

Shape letters: ``n`` positions, ``e`` model dim, ``d`` rotary head dim.

The numbers come from :mod:`attnkit.nn`'s encodings themselves
(:meth:`attnkit.nn.SinusoidalPositionalEncoding.encodings`,
:meth:`attnkit.nn.RotaryEmbedding.rotate`), so the pictures show what the models use.
matplotlib is imported only to draw (``pip install 'attnkit[viz]'``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.nn import RotaryEmbedding, SinusoidalPositionalEncoding
from attnkit.viz.files import atomic_path
from attnkit.viz.fonts import plain_text
from attnkit.viz.heatmap import lay_out_once, require_matplotlib

# The classic pictures: positions 3 and 4 (alike), 3 and 500 (different), and
# dimensions 0, 10, 300 and 511 of a 512-dim encoding.
NOTE_PAIRS: tuple[tuple[int, int], ...] = ((3, 4), (3, 500))
NOTE_DIMENSIONS: tuple[int, ...] = (0, 10, 300, 511)
# The rotary curve is drawn from two starting positions to show it depends on the
# distance only.
ROTARY_STARTS: tuple[int, int] = (0, 100)


def sinusoidal_periods(encoding: SinusoidalPositionalEncoding, dims: Sequence[int]) -> list[float]:
    """The period, in positions, of each dimension: ``2π · base^(2i/e)`` for dims ``2i``
    and ``2i + 1``.

    Raises:
        ValueError: a dimension outside ``[0, e)``.
    """
    _check_dims(dims, encoding.embed_dim)
    return [2 * math.pi * encoding.denominators[d // 2].item() for d in dims]


def sinusoidal_similarity(encoding: SinusoidalPositionalEncoding, max_distance: int, *, start: int = 0) -> Tensor:
    """Cosine similarity of ``PE(start)`` and ``PE(start + Δ)`` for ``Δ = 0 .. max_distance``.

    Returns:
        ``[max_distance + 1]``.
    """
    table = encoding.encodings(torch.arange(start, start + max_distance + 1))  # [n, e]
    return F.cosine_similarity(table[:1], table, dim=-1)  # [n]


def rotary_similarity(rotary: RotaryEmbedding, vector: Tensor, max_distance: int, *, start: int = 0) -> Tensor:
    """Cosine similarity of ``vector`` rotated to position ``start`` and to ``start + Δ``:
    the score ``q·k`` of a query and a key with the same content, ``Δ`` positions apart.

    Args:
        rotary: the rotary encoding.
        vector: ``[d]``.
        max_distance: the largest ``Δ``.
        start: the first position.

    Returns:
        ``[max_distance + 1]``.

    Raises:
        ValueError: ``vector`` is not ``[d]``.
    """
    if vector.shape != (rotary.head_dim,):
        raise ValueError(f"vector must be [d] with d = {rotary.head_dim}, got {list(vector.shape)}")
    n = max_distance + 1
    rotated = rotary.rotate(vector.expand(1, 1, n, -1), torch.arange(start, start + n))[0, 0]  # [n, d]
    return F.cosine_similarity(rotated[:1], rotated, dim=-1)  # [n]


def draw_position_pair(encoding: SinusoidalPositionalEncoding, positions: tuple[int, int], path: str | Path) -> Path:
    """The encodings of two positions across dimensions, one panel each.

    Returns:
        The path written.

    Raises:
        ValueError: a negative position.
    """
    if min(positions) < 0:
        raise ValueError(f"positions must be >= 0, got {positions}")
    table = encoding.encodings(torch.tensor(positions))  # [2, e]
    similarity = F.cosine_similarity(table[0], table[1], dim=0).item()
    plt = require_matplotlib()
    fig, axes = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True, sharey=True)
    try:
        for ax, pos, values, colour in zip(axes, positions, table, ("tab:blue", "tab:orange")):
            ax.plot(values.numpy(), color=colour, linewidth=0.8)
            ax.set_ylabel(f"PE(pos={pos})")
            ax.set_ylim(-1.1, 1.1)
        axes[-1].set_xlabel("dimension")
        fig.suptitle(
            f"Sinusoidal encoding of positions {positions[0]} and {positions[1]} (d_model = {encoding.embed_dim}): "
            f"cosine similarity {similarity:.3f}"
        )
        return _save(fig, path)
    finally:
        plt.close(fig)


def draw_dimensions(
    encoding: SinusoidalPositionalEncoding, dims: Sequence[int], max_position: int, path: str | Path
) -> Path:
    """Chosen dimensions across positions ``0 .. max_position`` with their periods, one
    panel each: low dimensions turn fast, high ones so slowly that they
    look constant.

    Returns:
        The path written.

    Raises:
        ValueError: a dimension outside ``[0, e)``, or ``max_position < 1``.
    """
    if max_position < 1:
        raise ValueError(f"max_position must be >= 1, got {max_position}")
    periods = sinusoidal_periods(encoding, dims)
    table = encoding.encodings(torch.arange(max_position + 1))  # [n, e]
    plt = require_matplotlib()
    fig, axes = plt.subplots(len(dims), 1, figsize=(10, 1.4 + 1.3 * len(dims)), sharex=True, squeeze=False)
    try:
        for ax, dim, period in zip(axes[:, 0], dims, periods):
            ax.plot(table[:, dim].numpy(), linewidth=0.9)
            ax.set_ylim(-1.1, 1.1)
            ax.set_ylabel(f"dim {dim}")
            kind = "sin" if dim % 2 == 0 else "cos"
            ax.set_title(f"dimension {dim} ({kind}): period {period:,.1f} positions", fontsize=9, loc="left")
        axes[-1, 0].set_xlabel("position")
        fig.suptitle(f"Sinusoidal encoding across positions (d_model = {encoding.embed_dim})")
        return _save(fig, path)
    finally:
        plt.close(fig)


def draw_similarity(curves: dict[str, Tensor], path: str | Path, *, title: str) -> Path:
    """Similarity against distance, one line per curve (``Δ = 0, 1, …``).

    Returns:
        The path written.
    """
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    try:
        for (label, curve), style in zip(curves.items(), ("-", "-", "--", ":")):
            ax.plot(curve.numpy(), style, label=plain_text(label), linewidth=1.0)
        ax.axhline(0.0, color="grey", linewidth=0.5)
        ax.set_xlabel("distance Δ between positions")
        ax.set_ylabel("cosine similarity")
        ax.set_title(plain_text(title))
        ax.legend()
        return _save(fig, path)
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class PositionalPictures:
    """What :func:`draw_positional_pictures` wrote and measured.

    Attributes:
        files: the pictures, in drawing order.
        pair_similarity: cosine similarity of each pair of positions.
        periods: period of each drawn dimension, in positions.
        sinusoidal: cosine similarity by distance, ``[max_distance + 1]``.
        rotary: per starting position, ``q·k`` cosine similarity by distance,
            ``[max_distance + 1]`` each.
    """

    files: list[Path]
    pair_similarity: dict[tuple[int, int], float]
    periods: dict[int, float]
    sinusoidal: Tensor
    rotary: dict[int, Tensor]


def default_dimensions(d_model: int) -> list[int]:
    """The classic dimensions 0, 10, 300, 511 of a 512-dim encoding, scaled to ``d_model``."""
    return sorted({round(d * (d_model - 1) / 511) for d in NOTE_DIMENSIONS})


def draw_positional_pictures(
    out_dir: str | Path,
    *,
    d_model: int = 512,
    base: float = 10000.0,
    pairs: Sequence[tuple[int, int]] = NOTE_PAIRS,
    dims: Sequence[int] | None = None,
    max_position: int = 200,
    max_distance: int = 1000,
    head_dim: int | None = None,
    seed: int = 0,
) -> PositionalPictures:
    """Draw every picture of ``attnkit pe`` into ``out_dir``: one per pair of positions
    (``pe_positions_A_B.png``), ``pe_dimensions.png`` and ``pe_similarity.png``.

    Args:
        out_dir: where to write (created if needed).
        d_model: the sinusoidal encoding's dim ``e``, even.
        base: the ``10000`` of the formula, also the rotary ``theta``.
        pairs: pairs of positions drawn across dimensions, one picture per pair.
        dims: dimensions drawn across positions (default :func:`default_dimensions`).
        max_position: the last position of the per-dimension picture.
        max_distance: the largest distance of the similarity picture.
        head_dim: the rotary head dim ``d`` (default ``d_model``, which gives rotary the
            same frequencies as the sinusoidal encoding).
        seed: seeds the random query vector that the rotary curve rotates.

    Returns:
        A :class:`PositionalPictures`.

    Raises:
        ValueError: invalid sizes, positions or dimensions.
    """
    # Every check before the first picture, so that an error leaves no partial output.
    if max_distance < 1 or max_position < 1:
        raise ValueError(f"max_distance and max_position must be >= 1, got {max_distance} and {max_position}")
    if any(min(pair) < 0 for pair in pairs):
        raise ValueError(f"positions must be >= 0, got pairs {list(pairs)}")
    encoding = SinusoidalPositionalEncoding(d_model, base=base)
    rotary = RotaryEmbedding(d_model if head_dim is None else head_dim, theta=base)
    dims = default_dimensions(d_model) if dims is None else list(dims)
    _check_dims(dims, d_model)
    out = Path(out_dir)
    files = [draw_position_pair(encoding, pair, out / f"pe_positions_{pair[0]}_{pair[1]}.png") for pair in pairs]
    files.append(draw_dimensions(encoding, dims, max_position, out / "pe_dimensions.png"))

    sinusoidal = sinusoidal_similarity(encoding, max_distance)  # [max_distance + 1]
    d = rotary.head_dim
    assert d is not None  # built for one head dim above
    vector = torch.randn(d, generator=torch.Generator().manual_seed(seed))  # [d]
    rotary_curves = {start: rotary_similarity(rotary, vector, max_distance, start=start) for start in ROTARY_STARTS}
    curves = {f"sinusoidal: PE(p)·PE(p+Δ), d_model = {d_model}": sinusoidal}
    for start, curve in rotary_curves.items():
        curves[f"rotary: q·k, one random q rotated to {start} and {start}+Δ, d = {d}"] = curve
    title = "Similarity of two positions by their distance"
    files.append(draw_similarity(curves, out / "pe_similarity.png", title=title))

    pair_similarity: dict[tuple[int, int], float] = {}
    for pair in pairs:
        table = encoding.encodings(torch.tensor(pair))  # [2, e]
        pair_similarity[(pair[0], pair[1])] = F.cosine_similarity(table[0], table[1], dim=0).item()
    periods = dict(zip(dims, sinusoidal_periods(encoding, dims)))
    return PositionalPictures(files, pair_similarity, periods, sinusoidal, rotary_curves)


def _check_dims(dims: Sequence[int], embed_dim: int) -> None:
    bad = [d for d in dims if not 0 <= d < embed_dim]
    if bad or not dims:
        raise ValueError(f"dimensions must be in [0, {embed_dim}) and at least one, got {list(dims)}")


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    lay_out_once(fig)
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=100, format=path.suffix.lstrip(".").lower() or None)
    return path
