"""Layers × heads pictures of per-head statistics (``attnkit heads``), and other grids of
one value per layer and head or position (``attnkit patch``)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnkit.viz.fonts import font_context, plain_text
from attnkit.viz.heatmap import colour_map, lay_out_once, new_figure, root_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Above this many heads the numbers no longer fit in the cells.
MAX_ANNOTATED_CELLS = 400


def plot_head_grid(
    values: Tensor,
    *,
    title: str,
    label: str,
    ax: Axes | None = None,
    annotate: bool | None = None,
    cmap: str = "Blues",
    figsize: tuple[float, float] | None = None,
    symmetric: bool = False,
    rows: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    xlabel: str = "head",
) -> Figure:
    """Draw one value per head as a grid, layers as rows and heads as columns (or any
    other columns, such as the tokens of a text).

    Args:
        values: ``[layers, heads]``.
        title: the axes' title.
        label: what the colour scale measures.
        ax: the axes to draw into (default: a new figure).
        annotate: write each value in its cell; default when there are at most
            ``MAX_ANNOTATED_CELLS`` heads.
        cmap: a matplotlib colour map name.
        figsize: the new figure's size in inches; ignored with ``ax``.
        symmetric: centre the colour scale on zero, from ``-m`` to ``m`` with ``m`` the
            largest magnitude (signed values such as ablation effects, with a diverging
            colour map).
        rows: the rows' labels (default: their numbers ``0 ..``); the axis is ``layer``.
        columns: the columns' labels (default: their numbers), written vertically when given.
        xlabel: what the columns are.

    Returns:
        The figure drawn into.

    Raises:
        ValueError: ``values`` is not 2-D, labels of another count than the rows or
            columns, or an unknown colour map.
        ImportError: matplotlib is missing.
    """
    if values.ndim != 2:
        raise ValueError(f"values must be [layers, heads], got shape {list(values.shape)}")
    for what, labels, count in (("rows", rows, values.shape[0]), ("columns", columns, values.shape[1])):
        if labels is not None and len(labels) != count:
            raise ValueError(f"{what} must have one label per {what[:-1]} of values ({count}), got {len(labels)}")
    grid = values.detach().to(torch.float32).cpu().numpy()
    n_layers, n_heads = grid.shape
    annotate = n_layers * n_heads <= MAX_ANNOTATED_CELLS if annotate is None else annotate
    with font_context([title, label, *(columns or [])]) as choice:
        families = list(choice.families)
        created = ax is None
        size = figsize or (min(3 + 0.55 * n_heads, 30), min(2 + 0.28 * n_layers, 40))
        fig = new_figure(size) if ax is None else root_figure(ax)
        ax = fig.add_subplot() if ax is None else ax
        low, high = float(grid.min()), float(grid.max())
        if symmetric:
            high = max(abs(low), abs(high), 1e-12)
            low = -high
        image = ax.imshow(grid, cmap=colour_map(cmap), vmin=min(low, 0.0), vmax=max(high, 1e-12), aspect="auto")
        bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        bar.set_label(plain_text(_fit_label(label, fig.get_figheight())), fontfamily=families)
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        if columns is not None:
            ax.set_xticklabels([plain_text(c) for c in columns], rotation=90, fontfamily=families)
        if rows is not None:
            ax.set_yticklabels([plain_text(r) for r in rows])
        ax.tick_params(labelsize=7)
        ax.set_xlabel(plain_text(xlabel))
        ax.set_ylabel("layer")
        ax.set_title(plain_text(title), fontfamily=families)
        if annotate:
            threshold = (min(low, 0.0) + high) / 2
            for layer in range(n_layers):
                for head in range(n_heads):
                    value = grid[layer, head]
                    dark = abs(value) > high / 2 if symmetric else value > threshold
                    colour = "white" if dark else "black"
                    ax.text(head, layer, f"{value:.2f}", ha="center", va="center", color=colour, fontsize=6)
        if created:
            lay_out_once(fig)
    return fig


def draw_head_grid(values: Tensor, path: str | Path, *, dpi: float = 100, **options: Any) -> Path:
    """Draw one value per head as a grid (:func:`plot_head_grid`) and save it; the format
    follows the suffix (``.png``, ``.svg``).

    Args:
        values: ``[layers, heads]``.
        path: where to write.
        dpi: dots per inch.
        **options: :func:`plot_head_grid`'s keyword arguments (``title`` and ``label``
            required).

    Returns:
        The path written.

    Raises:
        ValueError: ``values`` is not 2-D.
    """
    return save_figure(plot_head_grid(values, **options), path, dpi=dpi)


# Points one character of a colour-bar label takes along the bar, at matplotlib's default
# 10-point label size (a generous average: capitals and quotes are wider than letters).
_POINTS_PER_CHARACTER = 6.5


def _fit_label(label: str, height_inches: float) -> str:
    """The colour-bar label broken into lines that fit along a bar of the figure's height
    (a one-row grid is short: "fraction of the logit difference ' Mary' - ' John' restored"
    ran past both ends)."""
    width = max(12, int(height_inches * 0.8 * 72 / _POINTS_PER_CHARACTER))
    return textwrap.fill(label, width=width, break_long_words=False)
