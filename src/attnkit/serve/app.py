"""The viewer as a local web app: one page (``GET /``), the attention of any text
(``POST /api/attention``) and what the server offers (``GET /api/info``), over models loaded
once when the app is created. The API is documented in ``docs/viewer.md`` and, as OpenAPI,
at ``/openapi.json``.

FastAPI and uvicorn are optional dependencies (``pip install 'attnkit[serve]'``).

Every input is checked before the model runs, and every refusal is a 4xx with a JSON body
``{"detail": "what was wrong"}`` (400 for a body that is not JSON, 413 for one over the size
limit, 422 for anything else: empty text, too many tokens, unknown model, ...; 429 with
``Retry-After`` when a model's queue is full). The only file the app serves is its own
page, whose script and style are inline, and every response, errors included, carries a
content-security policy that forbids other origins. Requests whose ``Host`` is not one of
the server's own names are refused (DNS rebinding). Concurrent requests for one model run
in batches (:mod:`attnkit.serve.batching`); a request whose client hangs up before its turn
never runs. The long-context routes (:mod:`attnkit.serve.long_context`) have a token limit
and a queue of their own, bounded the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

try:
    import uvicorn
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"attnkit serve needs FastAPI and uvicorn ({err}): pip install 'attnkit[serve]'") from None

from attnkit import __version__
from attnkit.functional.finite import check_finite
from attnkit.functional.indices import select_indices
from attnkit.models.checkpoints.hub import is_hub_name
from attnkit.models.protocol import InspectableModel
from attnkit.serve.admission import check_text, run_queued
from attnkit.serve.batching import Batcher
from attnkit.serve.long_context import add_long_context_routes, long_context_limit
from attnkit.serve.work_queue import WorkQueue
from attnkit.viz.terminal import counted
from attnkit.viz.viewer import (
    content_security_policy,
    render_html,
    viewer_data_from_encoder_decoder,
    viewer_data_from_run,
)

logger = logging.getLogger("attnkit.serve")

DEFAULT_MAX_TOKENS = 1024
# Weights in one response, layers x heads x tokens^2: 2^25 is about 67 MB of uint16 before
# compression, e.g. every layer and head of SmolLM2 on 350 tokens, or 32 maps of 1,024.
DEFAULT_MAX_WEIGHTS = 2**25
DEFAULT_MAX_CHARS = 50_000
DEFAULT_MAX_BODY_BYTES = 256 * 1024
# Requests waiting for one model, past which the server answers 429: about ten seconds of
# SmolLM2 work on two cores.
DEFAULT_MAX_QUEUE = 32
# The most tokens an encoder-decoder writes when a request gives no target.
GENERATED_TOKENS = 64
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


# ---------------------------------------------------------------- API schema (for OpenAPI)


class AttentionRequest(BaseModel):
    """Body of ``POST /api/attention``."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr = Field(description="Not blank; at most max_chars characters and max_tokens tokens.")
    model: StrictStr | None = Field(None, description="A name from GET /api/info (default: the server's first model).")
    layers: list[StrictInt] | Literal["last"] | None = Field(
        None,
        description='Layer indices, from 0, or "last": the last layer (an encoder-decoder: the last layer of each '
        "stack, encoder and decoder). Default: all.",
    )
    heads: list[StrictInt] | None = Field(None, description="Head indices, from 0 (default: all).")
    level: Literal["token", "word"] = Field(
        "token",
        description='"token", or "word" for the attention between the words of the text: rows and columns are '
        "words, a word's row the average of its tokens' rows, summed over each key word's tokens.",
    )
    modes: list[Literal["value", "rollout"]] = Field(
        [],
        description='Colour modes added beside the weights, as sections of their own: "value" (value-weighted '
        'attention, each map scaled to its largest value) and "rollout" (attention rollout up to each layer, '
        "heads merged, shown as head 0); their weights count towards max_weights. Refused for encoder-decoders.",
    )
    chat: StrictBool = Field(
        False,
        description="Read text as the chat model reads it, in its chat template (see chat_template in GET "
        '/api/info): one user message, or a JSON list of messages [{"role": ..., "content": ...}]. Positions count '
        "the template's tokens, and each self section carries the turns. Refused for a model without a template.",
    )
    decoder_text: StrictStr | None = Field(
        None,
        description="An encoder-decoder's target, the decoder's text (text is then its source). Absent, null or "
        "blank: the model writes the target itself by greedy decoding, and the response says so (generated). "
        "Refused for other models.",
    )


class ErrorBody(BaseModel):
    """Body of every 4xx response."""

    detail: str = Field(description="What was wrong with the request, in words.")


class ModelInfo(BaseModel):
    name: str = Field(description='The value for "model" in a request.')
    family: str
    kind: str = Field(description='"causal", "bidirectional" or "encoder-decoder".')
    layers: int = Field(description="Number of layers (an encoder-decoder's encoder layers); indices 0 .. layers - 1.")
    decoder_layers: int = Field(
        0, description="An encoder-decoder's decoder layers (0 for other models); indices 0 .. decoder_layers - 1."
    )
    heads: int = Field(
        description="Query heads per layer; valid indices are 0 .. heads - 1 (an encoder-decoder: its encoder's)."
    )
    decoder_heads: int = Field(
        0, description="An encoder-decoder's heads per decoder layer, self- and cross-attention (0 for other models)."
    )
    max_tokens: int = Field(description="Longest text accepted for this model, in its tokens.")
    max_long_tokens: int = Field(
        0, description="Longest text of the long-context routes (/api/long/...), in its tokens (0: none)."
    )
    windows: list[int | None] | None = Field(
        None,
        description="Each layer's sliding window (null for a global layer) of a model with local layers; "
        "null for a model without them.",
    )
    chat_template: bool = Field(False, description='Whether the model has a chat template ("chat" in a request).')


class InfoBody(BaseModel):
    """Body of ``GET /api/info``."""

    version: str
    models: list[ModelInfo]
    default_model: str
    max_chars: int
    max_weights: int = Field(description="Most weights (layers x heads x tokens^2) in one response.")
    max_body_bytes: int


class WeightsBody(BaseModel):
    shape: list[int] = Field(description="[layers, heads, s_q, s_k]")
    dtype: str = Field(description='"uint16"')
    byteorder: str = Field(description='"little"')
    scale: float = Field(description="weight = stored integer * scale (1 / 65535)")
    compression: str = Field(description='"zlib"')
    encoding: str = Field(description='"base64"')
    data: list[str] = Field(description="One string per layer: [heads, s_q, s_k] row-major.")


class SectionBody(BaseModel):
    causal: bool
    query_tokens: list[str]
    key_tokens: list[str]
    layers: list[int]
    heads: list[int]
    weights: WeightsBody


class ViewerDataBody(BaseModel):
    """Body of a successful ``POST /api/attention``: the viewer's data (``docs/viewer.md``)."""

    format: str = Field(description='"attnkit-viewer"')
    version: int
    model: str
    kind: str = Field(description='"causal", "bidirectional" or "encoder-decoder"')
    text: str = Field(description="The text (an encoder-decoder's source).")
    sections: dict[str, SectionBody] = Field(description='"self", or "encoder", "decoder" and "cross"')
    target_text: str | None = Field(None, description="An encoder-decoder's target (absent for other models).")
    generated: bool | None = Field(
        None, description="An encoder-decoder's target was written by the model (greedy decoding), none being given."
    )


# ---------------------------------------------------------------- the app


@dataclass
class ServedModel:
    """A model the app serves, the :class:`attnkit.serve.batching.Batcher` that runs its
    requests (on one thread, several texts per forward pass), and the
    :class:`attnkit.serve.work_queue.WorkQueue` of its long-context requests (on another
    thread, one at a time). Each queue holds at most ``max_queue`` waiting requests.

    ``max_long_tokens`` is the longest text of the long-context routes (0 for a model that
    has none: an encoder-decoder).
    """

    name: str
    model: InspectableModel
    max_tokens: int
    max_queue: int = DEFAULT_MAX_QUEUE
    max_long_tokens: int = 0
    batcher: Batcher = field(init=False, repr=False)
    long_queue: WorkQueue = field(init=False, repr=False)
    # An encoder-decoder runs one source and target at a time, outside the batcher.
    encoder_decoder_lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.batcher = Batcher(self.model, max_queue=self.max_queue, name=f"attnkit-model-{self.name}")
        self.long_queue = WorkQueue(max_queue=self.max_queue, name=f"attnkit-long-{self.name}")

    @property
    def encoder_decoder(self) -> bool:
        """Whether the model reads a source and a target (:meth:`attnkit.models.Model.run_encoder_decoder`)."""
        return bool(getattr(self.model, "encoder_decoder", False))

    def info(self) -> ModelInfo:
        """What ``GET /api/info`` says about this model."""
        kind = "encoder-decoder" if self.encoder_decoder else "causal" if self.model.causal else "bidirectional"
        return ModelInfo(
            name=self.name,
            family=str(getattr(self.model, "family", "")),
            kind=kind,
            layers=self.model.num_layers,
            decoder_layers=int(getattr(self.model, "num_decoder_layers", 0)) if self.encoder_decoder else 0,
            heads=self.model.num_heads,
            decoder_heads=_decoder_heads(self.model) if self.encoder_decoder else 0,
            max_tokens=self.max_tokens,
            max_long_tokens=self.max_long_tokens,
            windows=None if self.encoder_decoder else _listed_windows(self.model),
            chat_template=_has_chat_template(self.model),
        )


def _has_chat_template(model: Any) -> bool:
    """Whether a model's checkpoint folder has a chat template."""
    from attnkit.models.checkpoints.chat import read_chat_template

    path = getattr(model, "path", None)
    return path is not None and read_chat_template(Path(path)) is not None


def _listed_windows(model: Any) -> list[int | None] | None:
    """Each layer's sliding window, or ``None`` for a model without local layers."""
    from attnkit.inspect.maps import model_windows

    windows = model_windows(model)
    return None if windows is None else list(windows)


def _decoder_heads(model: Any) -> int:
    """An encoder-decoder :class:`attnkit.models.Model`'s heads per decoder layer."""
    return int(model.heads_per_kind["decoder"])


def public_name(spec: str) -> str:
    """The name a model is served under: a path's last folder (so that ``/api/info`` does
    not reveal where the server's files are), anything else (a fetched model's name, a
    Hugging Face name ``ORG/NAME`` that is not a folder here) as given."""
    if is_hub_name(spec) and not Path(spec).expanduser().exists():
        return spec
    if os.sep in spec or (os.altsep and os.altsep in spec) or spec.startswith(("~", ".")):
        return Path(spec).expanduser().resolve().name
    return spec


def host_name(header: str) -> str:
    """The name in an HTTP ``Host`` header: lower case, without the port, an IPv6 literal
    without its brackets (``"[::1]:8000"`` → ``"::1"``); ``""`` (which no server answers
    to) when anything but a port follows the name (``"[::1]evil"``, ``"localhost:evil"``)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        name, rest = (header[1:end], header[end + 1 :]) if end > 0 else ("", "")
    elif header.count(":") == 1:
        name, port = header.split(":")
        rest = f":{port}"
    else:
        name, rest = header, ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and rest[1:].isascii()):
        return ""
    return name


def _error(status: int, detail: str) -> HTTPException:
    return HTTPException(status_code=status, detail=detail)


def _indices(values: list[int] | None, count: int, what: str, model: str) -> list[int]:
    """Requested layer or head indices, checked, deduplicated and sorted (all when None)."""
    if values is None:
        return list(range(count))
    if not values:
        raise _error(422, f"{what}s must not be an empty list; leave it out for all {count} {what}s")
    try:
        return select_indices(values, count, what, context=f"{model} has {count} {what}s", from_end=False)
    except (TypeError, ValueError) as err:
        raise _error(422, str(err)) from None


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


class _Guard:
    """Pure ASGI middleware, outermost: refuses a ``Host`` that is not one of
    ``allowed_hosts`` (400), bodies over ``max_body_bytes`` (413, by the declared length or
    while reading a body sent without one), answers an unexpected failure with a JSON 500
    rather than a bare traceback page, and adds the security headers to every response."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, headers: list[tuple[bytes, bytes]], allowed_hosts: Sequence[str]
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.headers = headers
        self.allowed_hosts = frozenset(host_name(h) if h.startswith("[") else h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = list(message.get("headers", [])) + self.headers
            await send(message)

        headers = dict(scope["headers"])
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in self.allowed_hosts:
            detail = f"this server does not answer to the host name {host!r} (see attnkit serve --allow-host)"
            await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send_with_headers)
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            response = JSONResponse({"detail": self._too_large_detail()}, status_code=413)
            await response(scope, receive, send_with_headers)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    # FastAPI passes an HTTPException raised while reading the body through
                    # to its handler, which answers it like any other.
                    raise _error(413, self._too_large_detail())
            return message

        try:
            await self.app(scope, limited_receive, send_with_headers)
        except Exception:
            logger.exception("attnkit serve: %s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            detail = "the server failed on this request (an internal error, logged on the server)"
            await JSONResponse({"detail": detail}, status_code=500)(scope, receive, send_with_headers)

    def _too_large_detail(self) -> str:
        return f"the request body is larger than this server's limit of {self.max_body_bytes} bytes"


def create_app(
    models: Sequence[str] = ("smollm2",),
    *,
    loader: Callable[[str], InspectableModel] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_weights: int = DEFAULT_MAX_WEIGHTS,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_long_tokens: int | None = None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
) -> FastAPI:
    """The web app, with each model loaded now, once.

    Args:
        models: names or paths to load, each with ``loader``; requests pick one by its
            :func:`public_name` (a path's last folder), and the first is the default.
        loader: ``name -> model`` (default :func:`attnkit.models.load`): any
            :class:`attnkit.models.protocol.InspectableModel`; concurrent requests for one
            model share its ``run_batch`` passes.
        max_tokens: the longest text, in tokens (lowered to a model's ``max_length``).
        max_weights: the most weights in one response, ``layers * heads * tokens**2``.
        max_chars: the longest text in characters, checked before tokenizing.
        max_body_bytes: the largest request body.
        max_queue: the most requests waiting for one model, for its weights and, apart,
            for its long-context maps; past it, 429 with ``Retry-After``.
        max_long_tokens: the longest text of the long-context routes, in tokens (default:
            each model's context; lowered to it if longer).
        allowed_hosts: the names a request's ``Host`` header may give (without the port;
            IPv6 literals with or without brackets); any other is refused with 400, which
            defeats DNS rebinding. Default: this machine's loopback names.

    Returns:
        A FastAPI app, to run with uvicorn (or :func:`background`).

    Raises:
        ValueError: no models, two with the same public name, or a limit below 1.
        Exception: whatever ``loader`` raises for a model it cannot load.
    """
    names = [public_name(spec) for spec in models]
    if not models or len(set(names)) != len(names):
        raise ValueError(f"models must be one or more distinct names, got {names}")
    limits = Limits(max_tokens, max_weights, max_chars, max_body_bytes, max_queue)
    if max_long_tokens is not None and max_long_tokens < 1:
        raise ValueError(f"max_long_tokens must be at least 1, got {max_long_tokens}")
    if loader is None:
        from attnkit.models import load

        loader = load
    load_one = loader
    served = {
        name: ServedModel(
            name, model, min(max_tokens, int(model.max_length)), max_queue, long_context_limit(model, max_long_tokens)
        )
        for name, model in ((name, load_one(spec)) for name, spec in zip(names, models))
    }
    # Swagger UI and ReDoc load their script from a CDN, which the policy forbids;
    # the schema itself stays at /openapi.json.
    app = FastAPI(
        title="attnkit serve",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        description="Attention weights of a text, for the attnkit viewer. Schema: docs/viewer.md.",
    )
    app.state.models = served
    _add_routes(app, served, limits)
    add_long_context_routes(app, served, max_chars=limits.max_chars)
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, headers=_security_headers(), allowed_hosts=allowed_hosts)
    return app


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the app (see :func:`create_app`), each at least 1.

    Raises:
        ValueError: a limit below 1.
    """

    max_tokens: int
    max_weights: int
    max_chars: int
    max_body_bytes: int
    max_queue: int

    def __post_init__(self) -> None:
        for limit in dataclasses.fields(self):
            value = getattr(self, limit.name)
            if value < 1:
                raise ValueError(f"{limit.name} must be at least 1, got {value}")


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check, ready to join its model's batch."""

    served: ServedModel
    text: str
    layers: list[int]
    heads: list[int]
    tokens: int


def _security_headers() -> list[tuple[bytes, bytes]]:
    """The headers of every response: no framing, no sniffing, no referrer, no caching."""
    return [
        (b"content-security-policy", (content_security_policy(app=True) + "; frame-ancestors 'none'").encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cross-origin-resource-policy", b"same-origin"),
        (b"x-frame-options", b"DENY"),
        (b"cache-control", b"no-store"),
    ]


def _add_routes(app: FastAPI, served: dict[str, ServedModel], limits: Limits) -> None:
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
            raise _error(422, f"unknown model {name!r}: this server has {', '.join(map(repr, served))}")
        s = served[name]
        if request.chat and s.encoder_decoder:
            raise _error(422, f"{name} is an encoder-decoder: chat is for models of one text")
        if s.encoder_decoder:
            data = await _run_encoder_decoder(request, s, limits)
            timing = f"total;dur={(time.perf_counter() - started) * 1000:.1f}"
            return Response(data.to_json(), media_type="application/json", headers={"server-timing": timing})
        if request.decoder_text is not None:
            raise _error(422, f"{name} reads one text: decoder_text is for encoder-decoder models")
        # Other requests' batch waits for this one while it is read and checked.
        with s.batcher.arriving():
            admitted = await _admit(request, s, limits)
        _check_mode_weights(request.modes, admitted, limits)
        run = await run_queued(
            lambda: s.batcher.submit(admitted.text, admitted.layers, admitted.heads, admitted.tokens), http.receive
        )
        if run is None:  # the client has gone; nobody reads this
            return Response(status_code=499)
        data = await run_in_threadpool(_page_data, s, run, admitted, request)
        timing = f"total;dur={(time.perf_counter() - started) * 1000:.1f}"
        return Response(data.to_json(), media_type="application/json", headers={"server-timing": timing})


def _refuse_modes(request: AttentionRequest, s: ServedModel) -> None:
    """Refuse colour modes for an encoder-decoder: they are of one self-attention.

    Raises:
        HTTPException: 422 naming the model.
    """
    if request.modes:
        raise _error(422, f"{s.name} is an encoder-decoder: colour modes (modes) are for one self-attention")


def _check_mode_weights(modes: Sequence[str], admitted: Admitted, limits: Limits) -> None:
    """Refuse colour modes that would take the response over the server's weights: value as
    many as the weights, rollout one map per layer.

    Raises:
        HTTPException: 422 naming the weights and the limit.
    """
    maps = len(admitted.layers) * len(admitted.heads)
    total = maps * (1 + ("value" in modes)) + len(admitted.layers) * ("rollout" in modes)
    weights = total * admitted.tokens**2
    if modes and weights > limits.max_weights:
        raise _error(
            422,
            f"with the colour modes {', '.join(modes)}, {total} maps x {admitted.tokens}^2 tokens is {weights} "
            f"weights, more than this server's limit of {limits.max_weights}: ask for fewer layers or heads, "
            "or no colour modes",
        )


def _page_data(s: ServedModel, run: Any, admitted: Admitted, request: AttentionRequest) -> Any:
    """The viewer's data of a run, with the colour modes of ``request`` added as sections, as
    the exported page has them.

    Raises:
        HTTPException: 422 for weights that are not finite, or what the methods refuse.
    """
    from dataclasses import replace

    from attnkit.viz.viewer.adapters import mode_sections

    data = _viewer_data(s.model, run, s.name, admitted.text, request.level)
    if not request.modes:
        return data
    try:
        own = data.sections["self"]
        extra = mode_sections(
            s.model, admitted.text, request.modes, layers=own.layers, heads=own.heads, level=request.level
        )
    except ValueError as err:
        raise _error(422, str(err)) from None
    return replace(data, sections={**data.sections, **extra})


def _viewer_data(model: Any, run: Any, name: str, text: str, level: str) -> Any:
    """The viewer's data of a run, its weights checked finite.

    Raises:
        HTTPException: 422 naming the layer whose weights are NaN or infinite.
    """
    try:
        for layer, weights in run.attentions.items():
            check_finite(weights, f"the attention weights of layer {layer} of {name}")
        return viewer_data_from_run(model, run, name=name, text=text, level=level)
    except ValueError as err:
        raise _error(422, str(err)) from None


async def _admit(request: AttentionRequest, s: ServedModel, limits: Limits) -> Admitted:
    """Check a request for model ``s``: the text (blank, too long in characters, lone
    surrogates, too many tokens), the layers and heads, and the weights it would return.

    Raises:
        HTTPException: 422 naming what is wrong and, for too many weights, what would fit.
    """
    text = request.text
    check_text(text, limits.max_chars)
    if request.chat:
        text = await run_in_threadpool(_chat_text, s, text)
    asked = [s.model.num_layers - 1] if request.layers == "last" else request.layers
    layers = _indices(asked, s.model.num_layers, "layer", s.name)
    heads = _indices(request.heads, s.model.num_heads, "head", s.name)
    count = await _count_tokens(text, s)
    weights = len(layers) * len(heads) * count * count
    if weights > limits.max_weights:
        per_layer = len(heads) * count * count
        raise _error(
            422,
            f"{counted(len(layers), 'layer')} x {counted(len(heads), 'head')} x {count}^2 tokens is {weights} "
            f"weights, more than this server's limit of {limits.max_weights}: ask for at most "
            f"{counted(max(1, limits.max_weights // per_layer), 'layer')} or fewer heads",
        )
    return Admitted(s, text, layers, heads, count)


def _chat_text(s: ServedModel, text: str) -> str:
    """``chat``: the text in the model's chat template.

    Raises:
        HTTPException: 422 for a model without one (one line that says so), or messages
            that are not messages.
    """
    from attnkit.models.checkpoints.chat import no_template_message

    apply = getattr(s.model, "apply_chat_template", None)  # a stand-in model may have none
    if apply is None:
        raise _error(422, no_template_message(s.name))
    try:
        return apply(text)
    except ValueError as err:
        raise _error(422, str(err)) from None


async def _count_tokens(text: str, s: ServedModel, what: str = "the text") -> int:
    """The number of tokens of ``text`` for model ``s``.

    Raises:
        HTTPException: 422 for a text the tokenizer refuses or one over the token limit.
    """
    try:
        count = len((await run_in_threadpool(s.model.tokenize, text)).tokens)
    except ValueError as err:
        message = str(err)
        # The model says "text is N tokens long": name which text when it is not the source.
        if what != "the text" and message.startswith("text is "):
            message = f"{what} is {message.removeprefix('text is ')}"
        raise _error(422, message) from None
    if count > s.max_tokens:
        raise _error(422, f"{what} is {count} tokens, more than the limit of {s.max_tokens} for {s.name}")
    return count


def _stack_layers(
    asked: list[int] | str | None, encoder_depth: int, decoder_depth: int, name: str
) -> tuple[list[int], list[int], list[int]]:
    """``(layers, encoder_layers, decoder_layers)`` of a request's ``layers``: each stack
    the indices it has, and for ``"last"`` each stack's own last layer.

    Raises:
        HTTPException: 422 for an index no stack has.
    """
    if isinstance(asked, str):  # "last"
        encoder_layers, decoder_layers = [encoder_depth - 1], [decoder_depth - 1]
        return sorted({*encoder_layers, *decoder_layers}), encoder_layers, decoder_layers
    layers = _indices(asked, max(encoder_depth, decoder_depth), "layer", name)
    return layers, [i for i in layers if i < encoder_depth], [i for i in layers if i < decoder_depth]


async def _run_encoder_decoder(request: AttentionRequest, s: ServedModel, limits: Limits) -> Any:
    """The viewer data of an encoder-decoder request: the source (``text``) and the target
    (``decoder_text``, or the model's own greedy one when it is absent or blank), with the
    encoder, decoder and cross-attention of the asked layers (each stack the indices it
    has; ``"last"``: each stack's own last layer) and heads, checked first as :func:`_admit`
    checks a text.

    Raises:
        HTTPException: 422 naming what is wrong and, for too many weights, what would fit.
    """
    model: Any = s.model  # an encoder-decoder attnkit.models.Model, beyond the protocol: run_encoder_decoder
    _refuse_modes(request, s)
    check_text(request.text, limits.max_chars)
    target = request.decoder_text if request.decoder_text is not None and request.decoder_text.strip() else None
    if target is not None:
        check_text(target, limits.max_chars, "the decoder text")
    encoder_depth, decoder_depth = model.num_layers, int(model.num_decoder_layers)
    counts = model.heads_per_kind  # BART's stacks may have different head counts
    heads = _indices(request.heads, max(counts.values()), "head", s.name)
    # Each stack shows the asked layers and heads it has; a stack with none of the heads, none.
    kept = {kind: [head for head in heads if head < count] for kind, count in counts.items()}
    layers, asked_encoder, asked_decoder = _stack_layers(request.layers, encoder_depth, decoder_depth, s.name)
    s_src = await _count_tokens(request.text, s)
    encoder_layers = asked_encoder if kept["encoder"] else []
    decoder_layers = asked_decoder if kept["decoder"] and kept["cross"] else []
    if not encoder_layers and not decoder_layers:
        raise _error(422, f"{s.name} has none of these layers and heads in one stack: heads per kind {counts}")
    # (a stack with none of the heads computes no layer; any valid head stands in for its list)
    kept = {kind: chosen or [0] for kind, chosen in kept.items()}

    def run(target: Any, **asked: Any) -> Any:
        with s.encoder_decoder_lock:
            return model.run_encoder_decoder(request.text, target, heads=kept, **asked)

    written = None
    if target is None:
        # The model writes the target first (no weights), so that the limit below counts
        # the tokens it wrote.
        try:
            written = await run_in_threadpool(
                run, None, encoder_layers=[], decoder_layers=[], max_new_tokens=min(s.max_tokens, GENERATED_TOKENS)
            )
        except ValueError as err:
            raise _error(422, str(err)) from None
        s_tgt = written.target_ids.shape[1]
    else:
        s_tgt = await _count_tokens(target, s, "the target (decoder_text)")
    weights = len(kept["encoder"]) * len(encoder_layers) * s_src**2 + len(decoder_layers) * (
        len(kept["decoder"]) * s_tgt**2 + len(kept["cross"]) * s_tgt * s_src
    )
    if weights > limits.max_weights:
        raise _error(
            422,
            f"{counted(len(layers), 'layer')} x {counted(len(heads), 'head')} of {counted(s_src, 'source token')} "
            f"and {counted(s_tgt, 'target token')} is {weights} weights, more than this server's limit of "
            f"{limits.max_weights}: ask for fewer layers or heads",
        )

    def work() -> Any:
        if written is None:
            result = run(target, encoder_layers=encoder_layers, decoder_layers=decoder_layers)
        else:
            result = run(written.target_ids, encoder_layers=encoder_layers, decoder_layers=decoder_layers)
            result = dataclasses.replace(result, target_text=written.target_text, generated=True)
        return viewer_data_from_encoder_decoder(model, result, name=s.name, level=request.level)

    try:
        return await run_in_threadpool(work)
    except ValueError as err:
        raise _error(422, str(err)) from None


@contextmanager
def background(app: Any, host: str = "127.0.0.1", port: int = 0, *, timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` with uvicorn in a background thread for the duration of a ``with``.

    Args:
        app: an ASGI app, e.g. from :func:`create_app`.
        host: the address to bind.
        port: the port; ``0`` picks a free one.
        timeout: seconds to wait for the server to start and to stop.

    Yields:
        The base URL, e.g. ``"http://127.0.0.1:54321"``.

    Raises:
        RuntimeError: the server did not start in time.
    """
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="attnkit-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout)
