"""How large the files of attention maps and viewer pages will be, said before anything is
computed, so that a program can refuse a file too large to use (``attnkit inspect
--max-size``): the JSON of a map (:func:`estimate_map_json`), the canvas a map's PNG is drawn
on (:func:`estimate_map_canvas`) and the viewer page (:func:`estimate_viewer_html`). Their
writers are in :mod:`attnkit.viz.export`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

# Bytes per attention weight in the JSON files, measured on SmolLM2 and MiniLM maps: text
# of weights rounded to 6 decimals ("0.000123, "; a masked "0.0, " is shorter).
JSON_BYTES_PER_WEIGHT = {False: 10.0, True: 7.5}
# The viewer page's weights, zlib-compressed uint16 in base64, take
# a + b * log2(65535 / tokens) bytes per weight a query may attend to (masked zeros compress
# to almost nothing): a row of n weights sums to 1, so its integers shrink, and compress
# better, as n grows. Causal: (a, b) 5% above SmolLM2's mean layer (every head of all 30
# layers, 7 to 1,500 tokens of English prose, a line within 4% of it there), so that pages
# of every layer come out about 5% over and its last layer, sharper than the mean (1.13x at
# 1,500 tokens), about 7% under; bidirectional: fitted on MiniLM (60 to 480 tokens). One
# layer differs from the mean by how spread its attention is: SmolLM2's at 1,500 tokens
# from 0.63x (layer 18) to 1.61x (layer 0, the most spread).
VIEWER_BYTES_FIT = {False: (0.490, 0.168), True: (-0.360, 0.2636)}
# Per layer of the page: its base64 string's quotes and padding, zlib's header and checksum.
VIEWER_BYTES_PER_LAYER = 64
# Per token: its strings, span and label in the JSON, its label in the viewer page.
JSON_BYTES_PER_TOKEN = 160
VIEWER_BYTES_PER_TOKEN = 40


def estimate_map_json(tokens: int, heads: int, *, causal: bool, rows: int | None = None) -> int:
    """About how many bytes :func:`attnkit.viz.export.write_map` writes as JSON for one layer.

    Args:
        tokens: the text's length in tokens (an upper bound for a word map).
        heads: how many heads the map holds.
        causal: whether the model is causal (half the weights are zeros).
        rows: the query rows the map holds (default every token).

    Returns:
        The estimate in bytes.
    """
    n_r = tokens if rows is None else rows
    return int(heads * n_r * tokens * JSON_BYTES_PER_WEIGHT[causal] + tokens * JSON_BYTES_PER_TOKEN)


def estimate_map_canvas(
    tokens: int,
    heads: int,
    *,
    dpi: float | None = None,
    figsize: tuple[float, float] | None = None,
    rows: int | None = None,
) -> int:
    """About how many bytes of memory the canvas of :func:`attnkit.viz.export.write_map`'s PNG takes (the
    file is smaller, but the canvas is drawn whole before it is compressed).

    Args:
        tokens: the text's length in tokens (an upper bound for a word map).
        heads: how many heads the map holds (several are drawn as a grid of panels).
        dpi: the PNG's dots per inch (default: the drawing function's).
        figsize: the figure size in inches (default: from the tokens or the heads).
        rows: the query rows the map holds (default every token).

    Returns:
        The estimate in bytes.
    """
    from attnkit.viz.heatmap import DEFAULT_DPI, canvas_bytes, default_figsize, heads_figsize

    if figsize is None:
        figsize = default_figsize(tokens if rows is None else rows, tokens) if heads <= 1 else heads_figsize(heads)
    return canvas_bytes(figsize, DEFAULT_DPI if dpi is None else dpi)


def estimate_viewer_html(
    tokens: int, layers: int, heads: int, *, causal: bool, windows: Sequence[int | None] | None = None
) -> int:
    """About how many bytes :func:`attnkit.viz.export.write_viewer` writes, before anything is computed: within
    10% on pages of every layer of SmolLM2 from 7 to 1,500 tokens and on most single layers
    (:data:`VIEWER_BYTES_FIT` says by how much one layer may differ).

    Args:
        tokens: the text's length in tokens (an upper bound for a word page).
        layers: how many layers the page holds.
        heads: how many heads of each layer.
        causal: whether the model is causal.
        windows: the sliding window of each of the page's layers (``None`` for a global
            one), for a model with local layers: their maps have fewer weights to store.

    Returns:
        The estimate in bytes.
    """
    a, b = VIEWER_BYTES_FIT[causal]
    per_weight = max(0.05, a + b * math.log2(65535 / max(tokens, 1)))

    def attended(window: int | None) -> int:  # weights a query may attend to, over one map
        if not causal:
            return tokens * tokens
        w = tokens if window is None else min(window, tokens)
        return w * (w + 1) // 2 + (tokens - w) * w

    maps = [attended(None)] * layers if windows is None else [attended(w) for w in windows]
    weights = heads * sum(maps)
    return int(
        weights * per_weight + layers * VIEWER_BYTES_PER_LAYER + tokens * VIEWER_BYTES_PER_TOKEN + viewer_page_bytes()
    )


@functools.cache
def viewer_page_bytes() -> int:
    """The bytes of a viewer page without its data: its script, style and template."""
    from attnkit.viz.viewer.render import render_page

    return len(render_page("null", title="").encode())
