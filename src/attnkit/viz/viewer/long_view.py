"""The viewer's long view: a long text's attention without any ``[s, s]`` map.

What the page carries, for each chosen layer and head of a
:class:`attnkit.inspect.long_context.LongContextRun` made with ``map_block=B``: the
block-reduced map (``max`` and ``mean`` over ``B × B`` blocks, ``[n, n]`` with
``n = ceil(s / B)``), every query's top-k keys and weights (``[s, k]``) and the head's
summary (sink mass, mean distance and its quantiles, window mass, entropy). Its size grows
with ``heads · (n² + s · k)``, never with ``s²``: :func:`attnkit.viz.estimates.estimate_long_html`
bounds it before anything is computed.

The JSON form (``format: "attnkit-viewer-long"``, ``version: 1``), embedded in the page as
the plain viewer embeds its data:

- ``model``, ``causal``, ``tokens`` (``s`` strings), ``block`` (``B``), ``top_k``,
  ``sink_tokens``, ``window`` (the distance counted as near in the summaries);
- ``layers``: one ``{"layer", "sliding_window", "heads"}`` per layer (``sliding_window``:
  the layer's own window for a local layer, else ``null``); each head
  ``{"head", "summary", "max", "mean", "top_keys", "top_weights"}``;
- ``max`` and ``mean``: ``{"scale", "data"}``, the ``[n, n]`` map as unsigned 16-bit
  integers ``round(v / scale)`` with ``scale = largest / 65535`` (each map scaled to its
  largest, so that the small means of a long text keep their precision), little-endian,
  zlib-compressed, base64;
- ``top_keys``: ``[s, k]`` int32 key positions (``-1`` where a query has fewer than ``k``
  keys), and ``top_weights``: ``[s, k]`` uint16 ``round(w · 65535)``, each little-endian,
  zlib-compressed, base64.

Shape letters: ``s`` tokens, ``n`` blocks per side, ``k`` keys kept per query.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from attnkit.deprecation import moved_names, renamed_keywords
from attnkit.inspect.long_context import LayerSummary, LongContextRun
from attnkit.viz.files import write_text_atomic
from attnkit.viz.viewer.data import QUANTISED_MAX
from attnkit.viz.viewer.render import render_page

FORMAT = "attnkit-viewer-long"
VERSION = 1
# zlib level 6: these arrays are written once per export, and the top keys shrink with it.
_ZLIB_LEVEL = 6

# The page's size bound, now in attnkit.viz.estimates: still importable from here until 0.3.
__getattr__ = moved_names(
    __name__,
    dict.fromkeys(("estimate_long_html", "LONG_HEAD_BYTES", "LONG_FIELDS_BYTES"), "attnkit.viz.estimates"),
    removed_in="0.3",
)


def _packed(array: np.ndarray) -> str:
    """Little-endian bytes of ``array``, zlib-compressed and base64-encoded."""
    return base64.b64encode(zlib.compress(array.tobytes(), _ZLIB_LEVEL)).decode("ascii")


def _quantised_map(values: Tensor) -> dict[str, Any]:
    """``{"scale", "data"}`` of a map ``[n, n]`` of non-negative values, scaled to its largest."""
    array = values.detach().double().cpu().numpy()
    largest = float(array.max()) if array.size else 0.0
    scale = largest / QUANTISED_MAX if largest > 0 else 1.0 / QUANTISED_MAX
    quantised = np.clip(np.rint(array / scale), 0, QUANTISED_MAX).astype("<u2")
    return {"scale": scale, "data": _packed(quantised)}


def _head_entry(summary: LayerSummary, index: int, row: dict[str, float | int]) -> dict[str, Any]:
    """The page's record of head ``summary.heads[index]``: its summary row, reduced maps and top-k."""
    assert summary.block_max is not None and summary.block_mean is not None  # checked by long_viewer_data
    keys = summary.top_keys[index].cpu().numpy().astype("<i4")  # [s, k]
    weights = np.rint(summary.top_weights[index].float().clamp(0, 1).cpu().numpy() * QUANTISED_MAX).astype("<u2")
    return {
        "head": summary.heads[index],
        "summary": row,
        "max": _quantised_map(summary.block_max[index]),
        "mean": _quantised_map(summary.block_mean[index]),
        "top_keys": _packed(keys),
        "top_weights": _packed(weights),
    }


@renamed_keywords(model="model_name", removed_in="0.3")
def long_viewer_data(run: LongContextRun, tokens: list[str], *, model_name: str, causal: bool) -> dict[str, Any]:
    """The long view's JSON form (module docstring) of a run made with ``map_block``.

    Args:
        run: from :func:`attnkit.inspect.long_context.long_context_summaries` with
            ``map_block`` set and every query row.
        tokens: the ``s`` token strings of ``run.ids``.
        model_name: the model's name, for the page's title.
        causal: whether the model is causal (later keys are drawn masked).

    Returns:
        A JSON-ready dict.

    Raises:
        ValueError: a run without reduced maps or with some query rows only, or ``tokens``
            of another length than the run's text.
    """
    s = int(run.ids.numel())
    if len(tokens) != s:
        raise ValueError(f"tokens must name the run's {s} tokens, got {len(tokens)}")
    if not run.summaries:
        raise ValueError("the run has no summarised layer")
    layers = []
    first = next(iter(run.summaries.values()))
    for layer in sorted(run.summaries):
        summary = run.summaries[layer]
        if summary.map_block is None or summary.block_max is None or summary.block_mean is None:
            raise ValueError(f"layer {layer} has no block-reduced map: run long_context_summaries with map_block=B")
        if summary.rows.numel() != s:
            raise ValueError(f"layer {layer} summarises {summary.rows.numel()} of {s} query rows; the page needs all")
        table = summary.head_table()
        heads = [_head_entry(summary, i, row) for i, row in enumerate(table)]
        layers.append({"layer": layer, "sliding_window": run.scorings[layer].window, "heads": heads})
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model_name,
        "causal": bool(causal),
        "tokens": list(tokens),
        "block": first.map_block,
        "top_k": int(first.top_keys.shape[-1]),
        "sink_tokens": first.sink_tokens,
        "window": first.window,
        "layers": layers,
    }


def render_long_html(data: dict[str, Any], *, title: str | None = None) -> str:
    """The viewer page of :func:`long_viewer_data`'s dict: it opens on the long view.

    Args:
        data: what :func:`long_viewer_data` returns.
        title: the page's title (default ``"Long-context attention: MODEL"``).

    Raises:
        ValueError: a dict of another format.
    """
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(
            f"data must be {FORMAT!r} version {VERSION}, got {data.get('format')!r} {data.get('version')!r}"
        )
    return render_page(json.dumps(data, separators=(",", ":")), title=title or long_page_title(data["model"]))


def long_page_title(model_name: str) -> str:
    """The long view page's title."""
    return f"Long-context attention: {model_name}"


def write_long_html(path: str | Path, data: dict[str, Any]) -> Path:
    """Write :func:`render_long_html`'s page to ``path`` (parent folders are created).

    Returns:
        The path written.
    """
    return write_text_atomic(path, render_long_html(data))
