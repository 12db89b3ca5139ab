"""The long-context routes of ``attnkit serve``: a block-reduced map of one head over a long
text (``POST /api/long/map``) and the exact weights of a zoomed block (``POST
/api/long/block``), computed block by block without the ``[s, s]`` map
(:mod:`attnkit.inspect.long_context`).

Every request is checked before any work (its text, at most the model's ``max_long_tokens``
tokens; its layer, head, block, window and ranges), then waits in its model's
:class:`attnkit.serve.work_queue.WorkQueue`: bounded (429 with ``Retry-After`` past
``max_queue`` waiting requests), holding no worker thread while it waits, never run once its
client has gone, and stopped at the next layer or block when the client goes while it runs.

A map request runs the model once and keeps the layer's queries and keys (``2 · s · h · d``
floats) for the zoom requests of the same text, layer and model that follow; one text per
model is kept at a time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from torch import Tensor

from attnkit.inspect.long_context import (
    LayerScoring,
    LongContextRun,
    exact_block,
    long_context_summaries,
    summarizable_model,
)
from attnkit.inspect.maps import sequence_labels
from attnkit.serve.admission import check_text, run_queued

# Blocks per side of a reduced map by default, and at most.
DEFAULT_MAP_SIDE = 256
MAX_MAP_SIDE = 512
# The most weights one zoom returns (rows × keys).
MAX_BLOCK_WEIGHTS = 512 * 512
# The most keys a map lists per query.
MAX_TOP_K = 32
# The distance counted as near by default.
DEFAULT_WINDOW = 256


class LongMapRequest(BaseModel):
    """Body of ``POST /api/long/map``."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr = Field(description="Not blank; at most max_chars characters and max_long_tokens tokens.")
    model: StrictStr | None = Field(None, description="A name from GET /api/info (default: the server's first model).")
    layer: StrictInt = Field(description="The layer, from 0.")
    head: StrictInt = Field(description="The query head, from 0.")
    block: StrictInt | None = Field(
        None,
        description=f"Tokens per side of a map cell, at most the text's tokens (default: the text's tokens / "
        f"{DEFAULT_MAP_SIDE}, rounded up).",
    )
    window: StrictInt = Field(
        DEFAULT_WINDOW,
        description=f"Distance counted as near in the head's summary, 1 to max_long_tokens (or {DEFAULT_WINDOW}).",
    )
    top_k: StrictInt = Field(1, description=f"Keys listed per query in top_k_keys, 1 to {MAX_TOP_K}.")
    level: Literal["token", "word"] = Field(
        "token", description='How tokens are labelled: as they read ("token"), or by the word each belongs to ("word").'
    )


class LongBlockRequest(BaseModel):
    """Body of ``POST /api/long/block``."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr = Field(description="Not blank; at most max_chars characters and max_long_tokens tokens.")
    model: StrictStr | None = None
    layer: StrictInt
    head: StrictInt
    rows: list[StrictInt] = Field(description="[start, stop): the query tokens.")
    keys: list[StrictInt] = Field(description="[start, stop): the key tokens.")
    level: Literal["token", "word"] = "token"


@dataclass
class _Kept:
    """The queries and keys of the last text mapped on one model (read and written only by
    the model's long-context thread)."""

    key: tuple[str, int] | None = None
    qk: tuple[Tensor, Tensor] | None = None
    scoring: LayerScoring | None = None
    tokens: list[str] = field(default_factory=list)


def long_context_limit(model: Any, asked: int | None) -> int:
    """The longest text of the long-context routes for ``model``, in tokens: ``asked``
    lowered to the model's context (default: the context); 0 for a model without them."""
    if _why_no_long_maps(model) is not None:
        return 0
    context = int(model.max_length)
    return context if asked is None else min(asked, context)


def _why_no_long_maps(model: Any) -> str | None:
    """Why the long-context summaries cannot read ``model`` (not an
    :class:`attnkit.models.Model`, or an encoder-decoder), or ``None`` when they can
    (:func:`attnkit.inspect.long_context.summarizable_model`)."""
    try:
        summarizable_model(model)
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def add_long_context_routes(app: FastAPI, served: dict[str, Any], *, max_chars: int) -> None:
    """Add ``POST /api/long/map`` and ``POST /api/long/block`` to ``app``.

    Args:
        app: the app of :func:`attnkit.serve.create_app`.
        served: its models by name (:class:`attnkit.serve.served.ServedModel`).
        max_chars: the longest text in characters.
    """
    default = next(iter(served))
    kept = {name: _Kept() for name in served}
    errors: dict[int | str, dict[str, Any]] = {
        422: {"description": "A request that does not fit the model."},
        429: {"description": "max_queue long-context requests already wait for the model (header Retry-After)."},
    }

    @app.post("/api/long/map", responses=errors)
    async def api_long_map(request: LongMapRequest, http: Request) -> Any:
        """One head's map over a long text, reduced to blocks (max and mean of each block,
        exact), with its summary and every query's strongest key."""
        s = _served_with_long_maps(served, request.model or default)
        ids, tokens = await _admit(request.text, request.layer, request.head, s, max_chars, request.level)
        size = _map_block(request.block, len(tokens))
        _check_window_and_top_k(request.window, request.top_k, s.max_long_tokens)
        return await _queued(s, functools.partial(_summarise, s, kept[s.name], request, ids, tokens, size), http)

    @app.post("/api/long/block", responses=errors)
    async def api_long_block(request: LongBlockRequest, http: Request) -> Any:
        """The exact weights of one head for a block of query rows and keys (each row
        normalised over all its keys), from the queries and keys kept by the last map."""
        s = _served_with_long_maps(served, request.model or default)
        ids, tokens = await _admit(request.text, request.layer, request.head, s, max_chars, request.level)
        rows, keys = _range(request.rows, len(tokens), "rows"), _range(request.keys, len(tokens), "keys")
        weights = (rows[1] - rows[0]) * (keys[1] - keys[0])
        if weights > MAX_BLOCK_WEIGHTS:
            raise HTTPException(
                422,
                f"the block is {rows[1] - rows[0]} rows × {keys[1] - keys[0]} keys = {weights} weights, more than "
                f"this server's limit of {MAX_BLOCK_WEIGHTS} per zoom: ask for fewer rows or keys",
            )
        return await _queued(s, functools.partial(_zoom, s, kept[s.name], request, ids, tokens, rows, keys), http)


def _served_with_long_maps(served: dict[str, Any], name: str) -> Any:
    """The served model called ``name`` (:class:`attnkit.serve.served.ServedModel`), checked to
    have one self-attention stack.

    Raises:
        HTTPException: 422 for a name this server does not serve, or a model the summaries
            cannot read (an encoder-decoder, a stand-in that is not an attnkit.models.Model).
    """
    if name not in served:
        raise HTTPException(422, f"unknown model {name!r}: this server has {', '.join(map(repr, served))}")
    why = _why_no_long_maps(served[name].model)
    if why is not None:
        raise HTTPException(422, f"{name} has no long-context maps: {why}")
    return served[name]


async def _admit(text: str, layer: int, head: int, s: Any, max_chars: int, level: str) -> tuple[Tensor, list[str]]:
    """Check a request's text, layer and head against the model and the server's limits;
    the text's ids ``[1, n]`` and tokens as they read (:func:`attnkit.inspect.maps.sequence_labels`
    at ``level``).

    Raises:
        HTTPException: 422 for a blank, too long or invalid text (lone surrogates, more than
            ``max_long_tokens`` tokens), or a layer or head out of range.
    """
    model = s.model
    check_text(text, max_chars)
    if not 0 <= layer < model.num_layers:
        raise HTTPException(422, f"layer must be in 0..{model.num_layers - 1}, got {layer}")
    if not 0 <= head < model.num_heads:
        raise HTTPException(422, f"head must be in 0..{model.num_heads - 1}, got {head}")
    try:
        ids, tokens, offsets = await run_in_threadpool(model.prepare_input, text)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None
    if ids.shape[1] > s.max_long_tokens:
        raise HTTPException(
            422,
            f"the text is {ids.shape[1]} tokens, more than the long-context limit of {s.max_long_tokens} for {s.name}",
        )
    return ids, await run_in_threadpool(sequence_labels, model, tokens, ids, offsets, text, level=level)


async def _queued(s: Any, work: Callable[[Callable[[], bool]], Any], http: Request) -> Any:
    """Run ``work`` (``stop -> body``) in the long-context queue of model ``s``
    (:func:`attnkit.serve.admission.run_queued`: 429 when full, 422 for a ``ValueError`` such
    as a layer the summaries cannot reproduce); its body, or a 499 when the client has gone
    (the work then never runs, or stops)."""
    body = await run_queued(lambda: s.long_queue.submit(work), http.receive)
    return Response(status_code=499) if body is None else body


def _map_block(block: int | None, s: int) -> int:
    """Tokens per side of a map cell for ``s`` tokens: ``block``, or enough for
    :data:`DEFAULT_MAP_SIDE` cells per side.

    Raises:
        HTTPException: 422 for a block below the one that makes :data:`MAX_MAP_SIDE` cells
            per side, or above ``s`` (one cell).
    """
    size = block if block is not None else max(1, math.ceil(s / DEFAULT_MAP_SIDE))
    smallest = max(1, math.ceil(s / MAX_MAP_SIDE))
    if size < smallest:
        raise HTTPException(422, f"block must be at least {smallest} for {s} tokens, got {size}")
    if size > s:
        raise HTTPException(422, f"block must be at most the text's {s} tokens, got {size}")
    return size


def _check_window_and_top_k(window: int, top_k: int, max_long_tokens: int) -> None:
    """Check a map's window (at most the longest text, or the default window) and top_k.

    Raises:
        HTTPException: 422 naming the one out of range.
    """
    widest = max(DEFAULT_WINDOW, max_long_tokens)
    if not 1 <= window <= widest:
        raise HTTPException(422, f"window must be in 1..{widest}, got {window}")
    if not 1 <= top_k <= MAX_TOP_K:
        raise HTTPException(422, f"top_k must be in 1..{MAX_TOP_K}, got {top_k}")


def _keep(store: _Kept, text: str, layer: int, run: LongContextRun, tokens: list[str]) -> None:
    """Keep the queries, keys and scoring of ``layer`` from ``run`` for later zooms on ``text``."""
    store.key, store.qk, store.scoring, store.tokens = (
        (text, layer),
        run.kept_qk[layer],
        run.scorings[layer],
        tokens,
    )


def _summarise(
    s: Any,
    store: _Kept,
    request: LongMapRequest,
    ids: Tensor,
    tokens: list[str],
    size: int,
    stop: Callable[[], bool],
) -> dict[str, Any]:
    """Run ``POST /api/long/map`` (checked): summarise the head with a block-reduced map of
    ``size`` tokens per cell, keep the layer's queries and keys in ``store``, and return the
    response body."""
    layer, head, model = request.layer, request.head, s.model
    run = long_context_summaries(
        model,
        ids,
        layers=[layer],
        heads=[head],
        top_k=request.top_k,
        window=request.window,
        map_block=size,
        keep_qk=True,
        stop=stop,
    )
    _keep(store, request.text, layer, run, tokens)
    summary = run.summaries[layer]
    assert summary.block_max is not None and summary.block_mean is not None  # asked with map_block
    return {
        "model": s.name,
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


def _zoom(
    s: Any,
    store: _Kept,
    request: LongBlockRequest,
    ids: Tensor,
    tokens: list[str],
    rows: tuple[int, int],
    keys: tuple[int, int],
    stop: Callable[[], bool],
) -> dict[str, Any]:
    """Run ``POST /api/long/block`` (checked): the exact weights of ``rows`` × ``keys``, from
    the queries and keys in ``store`` (recomputed first when they are of another text or
    layer)."""
    if store.key != (request.text, request.layer) or store.qk is None or store.scoring is None:
        run = long_context_summaries(
            s.model, ids, layers=[request.layer], heads=[request.head], rows=[0], keep_qk=True, stop=stop
        )
        _keep(store, request.text, request.layer, run, tokens)
    assert store.qk is not None and store.scoring is not None  # kept just above
    q, k = store.qk
    weights = exact_block(q, k, store.scoring, head=request.head, rows=rows, keys=keys)
    return {
        "model": s.name,
        "layer": request.layer,
        "head": request.head,
        "rows": list(rows),
        "keys": list(keys),
        "query_tokens": tokens[rows[0] : rows[1]],
        "key_tokens": tokens[keys[0] : keys[1]],
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
