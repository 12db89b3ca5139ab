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

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import uvicorn
    from fastapi import FastAPI
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"attnkit serve needs FastAPI and uvicorn ({err}): pip install 'attnkit[serve]'") from None

from attnkit import __version__
from attnkit.models.checkpoints.hub import is_hub_name
from attnkit.models.protocol import InspectableModel
from attnkit.serve.guard import LOOPBACK_HOSTS, Guard, security_headers
from attnkit.serve.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_WEIGHTS,
    Limits,
)
from attnkit.serve.long_context import add_long_context_routes, long_context_limit
from attnkit.serve.routes import add_routes
from attnkit.serve.served import ServedModel


def public_name(spec: str) -> str:
    """The name a model is served under: a path's last folder (so that ``/api/info`` does
    not reveal where the server's files are), anything else (a fetched model's name, a
    Hugging Face name ``ORG/NAME`` that is not a folder here) as given."""
    if is_hub_name(spec) and not Path(spec).expanduser().exists():
        return spec
    if os.sep in spec or (os.altsep and os.altsep in spec) or spec.startswith(("~", ".")):
        return Path(spec).expanduser().resolve().name
    return spec


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
    add_routes(app, served, limits)
    add_long_context_routes(app, served, max_chars=limits.max_chars)
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, headers=security_headers(), allowed_hosts=allowed_hosts)
    return app


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
