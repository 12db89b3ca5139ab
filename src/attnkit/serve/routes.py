"""The app's routes besides the long-context ones (:mod:`attnkit.serve.long_context`): the
page (``GET /``), ``GET /api/info`` and ``POST /api/attention``, and the 4xx body of a
request that does not parse."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from attnkit import __version__
from attnkit.models.model.kinds import ONE_TEXT, SOURCE_AND_TARGET, for_kind
from attnkit.serve.admission import admit, check_mode_weights, http_error, run_queued
from attnkit.serve.bodies import AttentionRequest, ErrorBody, InfoBody, ViewerDataBody
from attnkit.serve.limits import Limits
from attnkit.serve.runner import page_data, run_encoder_decoder
from attnkit.serve.served import ServedModel
from attnkit.viz.viewer import render_html


def _validation_message(errors: Sequence[dict[str, Any]]) -> tuple[int, str]:
    """A status and one readable sentence for pydantic's list of errors."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "not JSON")
        return 400, f"the request body is not valid JSON ({reason})"
    parts = []
    for e in errors:
        # A field of several types names the type each error is about ("list[int]",
        # "literal['last']"): the field's own path is enough.
        path = (p for p in e.get("loc", ()) if p != "body" and not (isinstance(p, str) and "[" in p))
        loc = ".".join(str(p) for p in path) or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return 422, "invalid request: " + "; ".join(parts)


def add_routes(app: FastAPI, served: dict[str, ServedModel], limits: Limits) -> None:
    """The page, ``GET /api/info`` and ``POST /api/attention``, and the 4xx body of
    requests that do not parse."""
    default = next(iter(served))
    info = InfoBody(
        version=__version__,
        models=[s.info() for s in served.values()],
        default_model=default,
        max_chars=limits.max_chars,
        max_weights=limits.max_weights,
        max_body_bytes=limits.max_body_bytes,
    )
    page = render_html(None, app=True)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Any, exc: RequestValidationError) -> JSONResponse:
        status, detail = _validation_message(exc.errors())
        return JSONResponse({"detail": detail}, status_code=status)

    errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 413, 422, 429)}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(page)

    # A coroutine: it runs on the event loop and needs none of the worker threads that
    # other requests may hold.
    @app.get("/api/info", response_model=InfoBody)
    async def api_info() -> InfoBody:
        """The models this server has loaded, their layers and heads, and its limits."""
        return info

    @app.post("/api/attention", response_class=Response, responses={200: {"model": ViewerDataBody}, **errors})
    async def api_attention(request: AttentionRequest, http: Request) -> Response:
        """Run a model on a text and return the attention weights of the chosen layers and
        heads in the viewer's format, between tokens or words."""
        started = time.perf_counter()
        name = request.model or default
        if name not in served:
            raise http_error(422, f"unknown model {name!r}: this server has {', '.join(map(repr, served))}")
        s = served[name]
        answer = for_kind(
            s.model,
            {ONE_TEXT: _one_text_attention, SOURCE_AND_TARGET: _encoder_decoder_attention},
            what="POST /api/attention",
        )
        data = await answer(request, http, s, limits)
        if data is None:  # the client has gone; nobody reads this
            return Response(status_code=499)
        timing = f"total;dur={(time.perf_counter() - started) * 1000:.1f}"
        return Response(data.to_json(), media_type="application/json", headers={"server-timing": timing})


async def _one_text_attention(request: AttentionRequest, http: Request, s: ServedModel, limits: Limits) -> Any:
    """The viewer data of a request to a model of one text, run with other requests'
    texts by its batcher; ``None`` when the client has gone."""
    if request.decoder_text is not None:
        raise http_error(422, f"{s.name} reads one text: decoder_text is for encoder-decoder models")
    # Other requests' batch waits for this one while it is read and checked.
    with s.batcher.arriving():
        admitted = await admit(request, s, limits)
    check_mode_weights(request.modes, admitted, limits)
    run = await run_queued(
        lambda: s.batcher.submit(admitted.text, admitted.layers, admitted.heads, admitted.tokens), http.receive
    )
    if run is None:
        return None
    return await run_in_threadpool(page_data, s, run, admitted, request)


async def _encoder_decoder_attention(request: AttentionRequest, _http: Request, s: ServedModel, limits: Limits) -> Any:
    """The viewer data of a request to an encoder-decoder: its source and target."""
    if request.chat:
        raise http_error(422, f"{s.name} is an encoder-decoder: chat is for models of one text")
    return await run_encoder_decoder(request, s, limits)
