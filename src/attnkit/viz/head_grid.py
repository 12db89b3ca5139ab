"""Layers × heads pictures of per-head statistics (``attnkit heads``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.viz.fonts import font_context
from attnkit.viz.heatmap import require_matplotlib

# Above this many heads the numbers no longer fit in the cells.
MAX_ANNOTATED_CELLS = 400


def draw_head_grid(
    values: Tensor,
    path: str | Path,
    *,
    title: str,
    label: str,
    annotate: bool | None = None,
) -> Path:
    """Draw one value per head as a grid, layers as rows and heads as columns, and save it;
    the format follows the suffix (``.png``, ``.svg``).

    Args:
        values: ``[layers, heads]``.
        path: where to write.
        title: the figure title.
        label: what the colour scale measures.
        annotate: write each value in its cell; default when there are at most
            ``MAX_ANNOTATED_CELLS`` heads.

    Returns:
        The path written.

    Raises:
        ValueError: ``values`` is not 2-D.
    """
    if values.ndim != 2:
        raise ValueError(f"values must be [layers, heads], got shape {list(values.shape)}")
    plt = require_matplotlib()
    grid = values.detach().to(torch.float32).cpu().numpy()
    n_layers, n_heads = grid.shape
    annotate = n_layers * n_heads <= MAX_ANNOTATED_CELLS if annotate is None else annotate
    path = Path(path)
    # Text is laid out when the figure is saved, so the fonts must hold until then.
    with font_context([title, label]):
        fig, ax = plt.subplots(figsize=(min(3 + 0.55 * n_heads, 30), min(2 + 0.28 * n_layers, 40)))
        try:
            low, high = float(grid.min()), float(grid.max())
            image = ax.imshow(grid, cmap="Blues", vmin=min(low, 0.0), vmax=max(high, 1e-12), aspect="auto")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=label)
            ax.set_xticks(range(n_heads))
            ax.set_yticks(range(n_layers))
            ax.tick_params(labelsize=7)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(title)
            if annotate:
                threshold = (min(low, 0.0) + high) / 2
                for layer in range(n_layers):
                    for head in range(n_heads):
                        value = grid[layer, head]
                        colour = "white" if value > threshold else "black"
                        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", color=colour, fontsize=6)
            fig.tight_layout()
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
    return path
