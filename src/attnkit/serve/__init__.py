"""``attnkit serve``: the attention viewer as a local web app (FastAPI), with a JSON API.

:func:`create_app` builds the app over models loaded once; :func:`background` runs it in a
thread (for notebooks, tests and benchmarks). Needs ``pip install 'attnkit[serve]'``.

One module per job: :mod:`~attnkit.serve.app` (the app, made and run),
:mod:`~attnkit.serve.bodies` (the JSON API's bodies), :mod:`~attnkit.serve.guard` (host,
body size and security headers around every request), :mod:`~attnkit.serve.limits` (what a
request may ask), :mod:`~attnkit.serve.admission` (a request's checks, and queueing its
work), :mod:`~attnkit.serve.routes` (the page, ``/api/info`` and ``/api/attention``),
:mod:`~attnkit.serve.served` (the models served, each with its batcher and queue),
:mod:`~attnkit.serve.runner` (what runs an admitted request),
:mod:`~attnkit.serve.long_context` (the long-context routes), :mod:`~attnkit.serve.batching`
and :mod:`~attnkit.serve.work_queue`.
"""

from attnkit.serve.app import background, create_app
from attnkit.serve.bodies import AttentionRequest
from attnkit.serve.guard import LOOPBACK_HOSTS
from attnkit.serve.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_WEIGHTS,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_WEIGHTS",
    "LOOPBACK_HOSTS",
    "AttentionRequest",
    "background",
    "create_app",
]
