"""Attention heatmaps in the source notes' style: Blues, values annotated, query tokens as
rows and key tokens as columns.

matplotlib is an optional dependency (``pip install 'attnkit[viz]'``); it is imported only
when a picture is drawn, with the non-interactive Agg backend so it works without a screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnkit.viz.fonts import font_context

# Above this many tokens the numbers no longer fit in the cells.
MAX_ANNOTATED_TOKENS = 24


def require_matplotlib():
    """Import matplotlib with the Agg backend, or say which extra to install.

    Raises:
        ImportError: matplotlib is missing.
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError("drawing pictures needs matplotlib: pip install 'attnkit[viz]'") from None
    matplotlib.use("Agg", force=True)
    # Keep text as text in SVG files: searchable, editable, and any script renders.
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    return plt


def draw_heatmap(
    weights: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    path: str | Path,
    *,
    title: str = "Attention",
    annotate: bool | None = None,
    xlabel: str = "Key (attended to)",
    ylabel: str = "Query (attending)",
) -> Path:
    """Draw one attention map and save it; the format follows the suffix (``.png``, ``.svg``).

    Args:
        weights: ``[s_q, s_k]`` post-softmax weights.
        query_labels: ``s_q`` row labels.
        key_labels: ``s_k`` column labels.
        path: where to write.
        title: the figure title.
        annotate: write each value in its cell; default when both sides have at most
            ``MAX_ANNOTATED_TOKENS`` tokens.

    Labels in any script are drawn with a font that has their glyphs
    (:func:`attnkit.viz.fonts.font_context`, which warns when none is installed).

    Returns:
        The path written.

    Raises:
        ValueError: the labels do not match the weights' shape.
    """
    if weights.ndim != 2:
        raise ValueError(f"weights must be [s_q, s_k], got shape {list(weights.shape)}")
    s_q, s_k = weights.shape
    if len(query_labels) != s_q or len(key_labels) != s_k:
        raise ValueError(
            f"weights are [{s_q}, {s_k}] but got {len(query_labels)} query and {len(key_labels)} key labels"
        )
    plt = require_matplotlib()
    values = weights.detach().to(torch.float32).cpu().numpy()
    annotate = max(s_q, s_k) <= MAX_ANNOTATED_TOKENS if annotate is None else annotate
    size = min(4 + 0.45 * s_k, 40), min(3 + 0.4 * s_q, 40)
    path = Path(path)
    # Text is laid out when the figure is saved, so the fonts must hold until then.
    with font_context([title, xlabel, ylabel, *query_labels, *key_labels]):
        fig, ax = plt.subplots(figsize=size)
        try:
            image = ax.imshow(values, cmap="Blues", vmin=0.0, vmax=max(float(values.max()), 1e-12), aspect="auto")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
            ax.set_xticks(range(s_k), labels=list(key_labels), rotation=45, ha="right", rotation_mode="anchor")
            ax.set_yticks(range(s_q), labels=list(query_labels))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            if annotate:
                threshold = values.max() / 2
                for i in range(s_q):
                    for j in range(s_k):
                        colour = "white" if values[i, j] > threshold else "black"
                        ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", color=colour, fontsize=8)
            fig.tight_layout()
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=120)
        finally:
            plt.close(fig)
    return path
