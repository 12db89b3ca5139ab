"""How large the files of attention maps and viewer pages will be, said before anything is
computed, so that a program can refuse a file too large to use (``attnkit inspect
--max-size``):

- the JSON of a map (:func:`estimate_map_json`), the canvas a map's PNG is drawn on
  (:func:`estimate_map_canvas`) and its SVG (:func:`estimate_map_svg`), written by
  :func:`attnkit.viz.export.write_map`;
- the viewer page of a model of one text (:func:`estimate_viewer_html`) and of an
  encoder–decoder (:func:`estimate_encoder_decoder_html`), written by
  :mod:`attnkit.viz.export`;
- the files of a long text (``attnkit inspect --long``): the long view page
  (:func:`estimate_long_html`, :mod:`attnkit.viz.viewer.long_view`), the head table
  (:func:`estimate_long_table_json`) and the top keys (:func:`estimate_long_top_npz`).

The viewer pages' estimates are fits (within 10% on real models); the others are bounds,
never below what is written (the JSON's up to its tokens' text: 160 bytes a token).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence

from attnkit.deprecation import renamed_keywords

# Bytes per attention weight in the JSON files, at most: a weight rounded to 6 decimals
# ("0.000123, "), keyed by whether it is masked (a causal map's later keys: "0.0, ").
JSON_BYTES_PER_WEIGHT = {False: 10.0, True: 5.0}
# Bytes per row of weights in the JSON files: its brackets and separator.
JSON_BYTES_PER_ROW = 4
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
# The JSON's fields besides its tokens and weights: their names, the model, layer, method.
JSON_BYTES_PER_FILE = 300
VIEWER_BYTES_PER_TOKEN = 40
# An SVG map's texts besides its tick labels and cell values, per panel: its title, axis
# labels, colour bar ticks and label (at most 10 ticks); and the bytes of one text, at most:
# a label written as text with its style and position (measured: 300 to 450).
SVG_TEXTS_PER_PANEL = 16
SVG_BYTES_PER_TEXT = 1000
# An SVG's header, style and definitions (measured: under 5 kB).
SVG_BYTES_PER_FILE = 10_000
# Bytes of a long view page's head record besides its arrays, at most: its summary, names,
# zlib's headers and its stored blocks' (about 300 to 500), and its layer's record.
LONG_HEAD_BYTES = 1000
# Bytes of the long view page's fields besides the tokens and layers (model name aside).
LONG_FIELDS_BYTES = 300
# The longest text of a finite float in JSON, ``-2.2250738585072014e-308``: a head table's
# numbers are at most this long.
LONGEST_FLOAT = -2.2250738585072014e-308
# Bytes of one array of an ``.npz`` file besides its data, at most: its ``.npy`` header
# (128), the zip entry's local and central headers with their zip64 fields and its name
# (about 200), and deflate's headers on an array it cannot shrink.
NPZ_BYTES_PER_ARRAY = 1024


def estimate_map_json(
    tokens: int, heads: int, *, causal: bool, rows: int | None = None, key_tokens: int | None = None
) -> int:
    """About how many bytes :func:`attnkit.viz.export.write_map` writes as JSON for one layer.

    Args:
        tokens: the text's length in tokens (an upper bound for a word map).
        heads: how many heads the map holds.
        causal: whether the model is causal (the weights of later keys are zeros; for a
            map of some rows, counted as if none were).
        rows: the query rows the map holds (default every token).
        key_tokens: the columns' tokens when they are another text than the rows' (an
            encoder–decoder's cross-attention: ``tokens`` the target's, these the source's),
            whose tokens the file carries too.

    Returns:
        The estimate in bytes.
    """
    n_r = tokens if rows is None else rows
    n_c = tokens if key_tokens is None else key_tokens
    labels = tokens + (key_tokens or 0)
    # A causal map of every row attends to n(n + 1)/2 of its weights.
    masked = n_r * (n_c - 1) // 2 if causal and rows is None else 0
    weights = (n_r * n_c - masked) * JSON_BYTES_PER_WEIGHT[False] + masked * JSON_BYTES_PER_WEIGHT[True]
    return int(heads * (weights + n_r * JSON_BYTES_PER_ROW) + labels * JSON_BYTES_PER_TOKEN + JSON_BYTES_PER_FILE)


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


def estimate_map_svg(
    tokens: int,
    heads: int,
    *,
    dpi: float | None = None,
    figsize: tuple[float, float] | None = None,
    rows: int | None = None,
) -> int:
    """An upper bound of the bytes of :func:`attnkit.viz.export.write_map`'s SVG: its map is
    an embedded PNG of at most the canvas's pixels (:func:`estimate_map_canvas`), counted
    as if it did not compress, in base64; beside it each text (tick labels, at most
    :data:`attnkit.viz.heatmap.MAX_TICKS` a side, the values written in the cells of short
    texts, titles and the colour bar's) at :data:`SVG_BYTES_PER_TEXT`.

    Args:
        As :func:`estimate_map_canvas`.

    Returns:
        The bound in bytes.
    """
    from attnkit.viz.heatmap import MAX_ANNOTATED_TOKENS, MAX_TICKS

    n_r = tokens if rows is None else rows
    canvas = estimate_map_canvas(tokens, heads, dpi=dpi, figsize=figsize, rows=rows)
    annotated = n_r * tokens if max(n_r, tokens) <= MAX_ANNOTATED_TOKENS else 0
    texts = heads * (min(n_r, MAX_TICKS) + min(tokens, MAX_TICKS) + annotated + SVG_TEXTS_PER_PANEL)
    return math.ceil(canvas * 4 / 3) + texts * SVG_BYTES_PER_TEXT + SVG_BYTES_PER_FILE


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
    maps = [None] * layers if windows is None else list(windows)
    weights = heads * sum(_viewer_map_bytes(tokens, tokens, causal=causal, window=window) for window in maps)
    return int(weights + layers * VIEWER_BYTES_PER_LAYER + tokens * VIEWER_BYTES_PER_TOKEN + viewer_page_bytes())


def estimate_encoder_decoder_html(
    source_tokens: int, target_tokens: int, *, encoder_layers: int, decoder_layers: int, heads: Mapping[str, int]
) -> int:
    """About how many bytes :func:`attnkit.viz.export.write_encoder_decoder_viewer` writes,
    before anything is computed: each of its three sections at its own size (the encoder's
    maps ``[s_src, s_src]``, the decoder's masked ``[s_tgt, s_tgt]``, the cross-attention's
    ``[s_tgt, s_src]``), at :func:`estimate_viewer_html`'s bytes per weight.

    Args:
        source_tokens: the source's length in tokens.
        target_tokens: the target's (for one to generate, the most it may have).
        encoder_layers: the encoder layers the page holds.
        decoder_layers: the decoder layers (each has a self- and a cross-attention map).
        heads: the heads of each map of each kind (``"encoder"``, ``"decoder"``, ``"cross"``).

    Returns:
        The estimate in bytes.
    """
    s_src, s_tgt = source_tokens, target_tokens
    weights = (
        encoder_layers * heads["encoder"] * _viewer_map_bytes(s_src, s_src, causal=False)
        + decoder_layers * heads["decoder"] * _viewer_map_bytes(s_tgt, s_tgt, causal=True)
        + decoder_layers * heads["cross"] * _viewer_map_bytes(s_tgt, s_src, causal=False)
    )
    layers = encoder_layers + 2 * decoder_layers
    # Each of the three sections names its rows and its columns.
    tokens = 3 * (s_src + s_tgt)
    return int(weights + layers * VIEWER_BYTES_PER_LAYER + tokens * VIEWER_BYTES_PER_TOKEN + viewer_page_bytes())


def _viewer_map_bytes(rows: int, keys: int, *, causal: bool, window: int | None = None) -> float:
    """The bytes of one head's ``[rows, keys]`` map in a viewer page: the weights a query
    may attend to (for a causal map, the keys up to its own, within ``window``) at
    :data:`VIEWER_BYTES_FIT`'s bytes per weight of a row of ``keys`` weights."""
    a, b = VIEWER_BYTES_FIT[causal]
    per_weight = max(0.05, a + b * math.log2(65535 / max(keys, 1)))
    if not causal:
        return rows * keys * per_weight
    w = keys if window is None else min(window, keys)
    return (w * (w + 1) // 2 + (keys - w) * w) * per_weight


@functools.cache
def viewer_page_bytes() -> int:
    """The bytes of a viewer page without its data: its script, style and template."""
    from attnkit.viz.viewer.render import render_page

    return len(render_page("null", title="").encode())


@renamed_keywords(model="model_name", removed_in="0.3")
def estimate_long_html(tokens: Sequence[str], heads: int, *, top_k: int, block: int, model_name: str = "") -> int:
    """An upper bound of the bytes :func:`attnkit.viz.viewer.long_view.write_long_html`
    writes: the arrays as if zlib saved nothing, in base64, plus the token labels and the
    page around the data.

    Args:
        tokens: the ``s`` token strings.
        heads: how many heads the page holds, over all its layers.
        top_k: keys kept per query.
        block: ``B``, tokens per side of a map cell.
        model_name: the model's name, as the page shows it.

    Returns:
        The bound in bytes: ``heads · (2 · 2n² + 6 · s · k + LONG_HEAD_BYTES) · 4/3`` plus
        the labels and the page without data.
    """
    from attnkit.viz.viewer.long_view import long_page_title
    from attnkit.viz.viewer.render import embed_json, render_page

    s = len(tokens)
    n = math.ceil(s / block)
    per_head = 2 * 2 * n * n + (4 + 2) * s * min(top_k, s) + LONG_HEAD_BYTES  # two uint16 maps, int32 + uint16 top-k
    labels = len(embed_json(json.dumps(list(tokens))))
    fields = LONG_FIELDS_BYTES + len(embed_json(json.dumps(model_name)))
    page = len(render_page("null", title=long_page_title(model_name)).encode())
    return math.ceil(heads * per_head * 4 / 3) + labels + fields + page


def estimate_long_table_json(heads: Mapping[int, Sequence[int]], *, tokens: int, block: int, model_name: str) -> int:
    """An upper bound of the bytes of the head table of ``attnkit inspect --long``
    (``long_context.json``, :func:`attnkit.cli.long_context.write_long_outputs`): the table
    written with every number as long as a float's text can be (:data:`LONGEST_FLOAT`).

    Args:
        heads: the heads summarised in each layer.
        tokens: the text's length in tokens (the distance quantiles are below it).
        block: tokens per side of a block of the reduced maps.
        model_name: the model's name.

    Returns:
        The bound in bytes.
    """
    from attnkit.inspect.long_context import DEFAULT_QUANTILES

    def widest(layer: int, head: int) -> dict[str, float | int]:
        quantiles = {f"distance_q{round(q * 100)}": tokens for q in DEFAULT_QUANTILES}
        floats = ("sink", "distance", "within_window", "beyond_window", "entropy")
        return {"layer": layer, "head": head} | dict.fromkeys(floats, LONGEST_FLOAT) | quantiles

    rows = [widest(layer, head) for layer, chosen in heads.items() for head in chosen]
    data = {"model": model_name, "tokens": tokens, "map_block": block, "heads": rows}
    return len(json.dumps(data, indent=1))


def estimate_long_top_npz(heads: Mapping[int, Sequence[int]], *, tokens: int, top_k: int) -> int:
    """An upper bound of the bytes of the top keys of ``attnkit inspect --long``
    (``long_context_top.npz``: each layer's keys as int32 and weights as float32,
    ``[heads, s, k]``): the arrays as if deflate saved nothing (it adds at most about
    0.03% to data it cannot shrink), and :data:`NPZ_BYTES_PER_ARRAY` each.

    Args:
        heads: the heads summarised in each layer.
        tokens: the text's length in tokens.
        top_k: keys kept per query (at most ``tokens``).

    Returns:
        The bound in bytes.
    """
    entries = sum(len(chosen) for chosen in heads.values()) * tokens * min(top_k, tokens)
    return math.ceil(entries * (4 + 4) * 1.001) + 2 * len(heads) * NPZ_BYTES_PER_ARRAY
