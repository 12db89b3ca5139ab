"""The long-context routes of ``attnkit serve``: a block-reduced map of one head over a long
text (``POST /api/long/map``) and the exact weights of a zoomed block (``POST
/api/long/block``), computed block by block without the ``[s, s]`` map
(:mod:`attnkit.inspect.long_context`).

A map request runs the model once and keeps the layer's queries and keys (``2 · s · h · d``
floats) for the zoom requests of the same text, layer and model that follow; one text per
model is kept at a time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from torch import Tensor

from attnkit.inspect.long_context import LayerScoring, LongContextRun, exact_block, long_context_summaries
from attnkit.inspect.maps import sequence_labels

# Blocks per side of a reduced map by default, and at most.
DEFAULT_MAP_SIDE = 256
MAX_MAP_SIDE = 512
# The most weights one zoom returns (rows × keys).
MAX_BLOCK_WEIGHTS = 512 * 512
# The most keys a map lists per query.
MAX_TOP_K = 32


class LongMapRequest(BaseModel):
    """Body of ``POST /api/long/map``."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr = Field(description="Not blank; at most max_chars characters and the model's context in tokens.")
    model: StrictStr | None = Field(None, description="A name from GET /api/info (default: the server's first model).")
    layer: StrictInt = Field(description="The layer, from 0.")
    head: StrictInt = Field(description="The query head, from 0.")
    block: StrictInt | None = Field(
        None,
        description=f"Tokens per side of a map cell (default: the text's tokens / {DEFAULT_MAP_SIDE}, rounded up).",
    )
    window: StrictInt = Field(256, description="Distance counted as near in the head's summary.")
    top_k: StrictInt = Field(1, description=f"Keys listed per query in top_k_keys, 1 to {MAX_TOP_K}.")
    level: Literal["token", "word"] = Field(
        "token", description='How tokens are labelled: as they read ("token"), or by the word each belongs to ("word").'
    )


class LongBlockRequest(BaseModel):
    """Body of ``POST /api/long/block``."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr
    model: StrictStr | None = None
    layer: StrictInt
    head: StrictInt
    rows: list[StrictInt] = Field(description="[start, stop): the query tokens.")
    keys: list[StrictInt] = Field(description="[start, stop): the key tokens.")
    level: Literal["token", "word"] = "token"


@dataclass
class _Kept:
    """The queries and keys of the last text mapped on one model."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    key: tuple[str, int, str] | None = None
    qk: tuple[Tensor, Tensor] | None = None
    scoring: LayerScoring | None = None
    tokens: list[str] = field(default_factory=list)  # as they read (sequence_labels)


def add_long_context_routes(app: FastAPI, served: dict[str, Any], *, max_chars: int) -> None:
    """Add ``POST /api/long/map`` and ``POST /api/long/block`` to ``app``.

    Args:
        app: the app of :func:`attnkit.serve.create_app`.
        served: its models by name (:class:`attnkit.serve.app.ServedModel`).
        max_chars: the longest text in characters.
    """
    default = next(iter(served))
    kept = {name: _Kept() for name in served}
    errors: dict[int | str, dict[str, Any]] = {422: {"description": "A request that does not fit the model."}}

    @app.post("/api/long/map", responses=errors)
    async def api_long_map(request: LongMapRequest) -> Any:
        """One head's map over a long text, reduced to blocks (max and mean of each block,
        exact), with its summary and every query's strongest key."""
        name = request.model or default
        model = _model_of(served, name)
        _check(request.text, model, request.layer, request.head, max_chars)
        return await run_in_threadpool(_summarise, name, model, kept[name], request)

    @app.post("/api/long/block", responses=errors)
    async def api_long_block(request: LongBlockRequest) -> Any:
        """The exact weights of one head for a block of query rows and keys (each row
        normalised over all its keys), from the queries and keys kept by the last map."""
        name = request.model or default
        model = _model_of(served, name)
        _check(request.text, model, request.layer, request.head, max_chars)
        return await run_in_threadpool(_zoom, name, model, kept[name], request)


def _model_of(served: dict[str, Any], name: str) -> Any:
    """The served model called ``name``, checked to have one self-attention stack.

    Raises:
        HTTPException: 422 for a name this server does not serve, or an encoder-decoder.
    """
    if name not in served:
        raise HTTPException(422, f"unknown model {name!r}: this server has {', '.join(map(repr, served))}")
    model = served[name].model
    if not hasattr(model, "prepare_input") or getattr(model, "encoder_decoder", False):
        raise HTTPException(422, f"{name} has no long-context maps: they need one causal or encoder self-attention")
    return model


def _check(text: str, model: Any, layer: int, head: int, max_chars: int) -> None:
    """Check a request's text, layer and head against the model and the server's limit.

    Raises:
        HTTPException: 422 for a blank or too long text, or a layer or head out of range.
    """
    if not text.strip():
        raise HTTPException(422, "the text is empty: give some words to look at")
    if len(text) > max_chars:
        raise HTTPException(422, f"the text is {len(text)} characters, more than this server's limit of {max_chars}")
    if not 0 <= layer < model.num_layers:
        raise HTTPException(422, f"layer must be in 0..{model.num_layers - 1}, got {layer}")
    if not 0 <= head < model.num_heads:
        raise HTTPException(422, f"head must be in 0..{model.num_heads - 1}, got {head}")


def _map_block(block: int | None, s: int) -> int:
    """Tokens per side of a map cell for ``s`` tokens: ``block``, or enough for
    :data:`DEFAULT_MAP_SIDE` cells per side.

    Raises:
        HTTPException: 422 for a block below 1 or one that makes more than
            :data:`MAX_MAP_SIDE` cells per side.
    """
    size = block if block is not None else max(1, math.ceil(s / DEFAULT_MAP_SIDE))
    if size < 1 or math.ceil(s / size) > MAX_MAP_SIDE:
        raise HTTPException(
            422, f"block must be at least {max(1, math.ceil(s / MAX_MAP_SIDE))} for {s} tokens, got {size}"
        )
    return size


def _labels(model: Any, text: str, level: str) -> tuple[Tensor, list[str]]:
    """The ids ``[1, s]`` of ``text`` and its tokens as they read, at ``level``.

    Raises:
        HTTPException: 422 for a text the model cannot take.
    """
    try:
        ids, tokens, offsets = model.prepare_input(text)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None
    return ids, sequence_labels(model, tokens, ids, offsets, text, level=level)


def _keep(store: _Kept, text: str, layer: int, level: str, run: LongContextRun, tokens: list[str]) -> None:
    """Keep the queries, keys and scoring of ``layer`` from ``run`` for later zooms on ``text``."""
    store.key, store.qk, store.scoring, store.tokens = (
        (text, layer, level),
        run.kept_qk[layer],
        run.scorings[layer],
        tokens,
    )


def _summarise(name: str, model: Any, store: _Kept, request: LongMapRequest) -> dict[str, Any]:
    """Run ``POST /api/long/map``: summarise the head with a block-reduced map, keep the
    layer's queries and keys in ``store``, and return the response body.

    Raises:
        HTTPException: 422 for a text the model cannot take, or a block or window out of range.
    """
    layer, head = request.layer, request.head
    with store.lock:
        ids, tokens = _labels(model, request.text, request.level)
        size = _map_block(request.block, ids.shape[1])
        if request.window < 1:
            raise HTTPException(422, f"window must be at least 1, got {request.window}")
        if not 1 <= request.top_k <= MAX_TOP_K:
            raise HTTPException(422, f"top_k must be in 1..{MAX_TOP_K}, got {request.top_k}")
        run = long_context_summaries(
            model,
            ids,
            layers=[layer],
            heads=[head],
            top_k=request.top_k,
            window=request.window,
            map_block=size,
            keep_qk=True,
        )
        _keep(store, request.text, layer, request.level, run, tokens)
        summary = run.summaries[layer]
        assert summary.block_max is not None and summary.block_mean is not None  # asked with map_block
        return {
            "model": name,
            "layer": layer,
            "head": head,
            "tokens": tokens,
            "level": request.level,
            "causal": bool(model.causal),
            "block": size,
            "max": _rounded(summary.block_max[0].tolist()),
            "mean": _rounded(summary.block_mean[0].tolist()),
            "summary": summary.head_table()[0],
            "top_keys": summary.top_keys[0, :, 0].tolist(),
            "top_weights": _rounded([summary.top_weights[0, :, 0].tolist()])[0],
            "top_k_keys": summary.top_keys[0].tolist(),
            "top_k_weights": _rounded(summary.top_weights[0].tolist()),
            "sliding_window": run.scorings[layer].window,
            "max_block_weights": MAX_BLOCK_WEIGHTS,
        }


def _zoom(name: str, model: Any, store: _Kept, request: LongBlockRequest) -> dict[str, Any]:
    """Run ``POST /api/long/block``: the exact weights of the asked block, from the queries
    and keys in ``store`` (recomputed first when they are of another text or layer).

    Raises:
        HTTPException: 422 for ranges out of the text or a block of too many weights.
    """
    with store.lock:
        if store.key != (request.text, request.layer, request.level) or store.qk is None or store.scoring is None:
            ids, tokens = _labels(model, request.text, request.level)
            run = long_context_summaries(
                model, ids, layers=[request.layer], heads=[request.head], rows=[0], keep_qk=True
            )
            _keep(store, request.text, request.layer, request.level, run, tokens)
        assert store.qk is not None and store.scoring is not None  # kept just above
        q, k = store.qk
        s = k.shape[1]
        (r0, r1), (k0, k1) = _range(request.rows, s, "rows"), _range(request.keys, s, "keys")
        if (r1 - r0) * (k1 - k0) > MAX_BLOCK_WEIGHTS:
            raise HTTPException(
                422,
                f"the block is {r1 - r0} rows × {k1 - k0} keys = {(r1 - r0) * (k1 - k0)} weights, more than this "
                f"server's limit of {MAX_BLOCK_WEIGHTS} per zoom: ask for fewer rows or keys",
            )
        weights = exact_block(q, k, store.scoring, head=request.head, rows=(r0, r1), keys=(k0, k1))
        return {
            "model": name,
            "layer": request.layer,
            "head": request.head,
            "rows": [r0, r1],
            "keys": [k0, k1],
            "query_tokens": store.tokens[r0:r1],
            "key_tokens": store.tokens[k0:k1],
            "weights": weights.tolist(),
        }


def _range(pair: Sequence[int], s: int, what: str) -> tuple[int, int]:
    """A checked ``[start, stop)`` within ``0 .. s``."""
    if len(pair) != 2 or not 0 <= pair[0] < pair[1] <= s:
        raise HTTPException(422, f"{what} must be [start, stop) with 0 <= start < stop <= {s}, got {list(pair)}")
    return int(pair[0]), int(pair[1])


def _rounded(rows: list[list[float]]) -> list[list[float]]:
    """Weights to 6 significant digits: what a picture needs, a third of the JSON."""
    return [[float(f"{x:.6g}") for x in row] for row in rows]
