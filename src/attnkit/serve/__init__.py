"""``attnkit serve``: the attention viewer as a local web app (FastAPI), with a JSON API.

:func:`create_app` builds the app over models loaded once; :func:`background` runs it in a
thread (for notebooks, tests and benchmarks). Needs ``pip install 'attnkit[serve]'``.
"""

from attnkit.serve.app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_WEIGHTS,
    LOOPBACK_HOSTS,
    AttentionRequest,
    background,
    create_app,
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
