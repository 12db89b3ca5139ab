"""The viewer as one self-contained HTML page: the template, script and style shipped in
``static/`` are inlined, the data is embedded as JSON, and a content-security policy in the
page lets it run its own script and style and nothing else — no request to any host, not
even its own, unless it is the app page of ``attnkit serve``, which may call back its API.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from attnkit import __version__
from attnkit.viz.files import write_text_atomic
from attnkit.viz.viewer.data import ViewerData

_PLACEHOLDER = re.compile(r"\{\{(CSP|VERSION|TITLE|MODE|CSS|DATA|JS)\}\}")
APP_TITLE = "attnkit attention viewer"


@dataclass(frozen=True)
class _Assets:
    template: str
    script: str
    style: str


@functools.cache
def _assets() -> _Assets:
    """The static files, read once."""
    static = resources.files("attnkit.viz.viewer").joinpath("static")
    assets = _Assets(
        static.joinpath("viewer.html").read_text(encoding="utf-8"),
        static.joinpath("viewer.js").read_text(encoding="utf-8"),
        static.joinpath("viewer.css").read_text(encoding="utf-8"),
    )
    # Inlined as they are, these would end their element early.
    assert "</script" not in assets.script.lower() and "</style" not in assets.style.lower()
    return assets


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(*, app: bool = False) -> str:
    """The page's content-security policy: nothing is allowed but the inline script and
    style (by hash, so no other script can run), the empty ``data:`` icon, and in app mode
    requests to the page's own origin.

    Args:
        app: the ``attnkit serve`` page, which calls its own API.

    Returns:
        The policy, for a ``<meta http-equiv>`` tag or a ``Content-Security-Policy`` header
        (a header should add ``frame-ancestors 'none'``, which a meta tag cannot carry).
    """
    assets = _assets()
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src {_sha256(assets.script)}",
            f"style-src {_sha256(assets.style)}",
            "img-src data:",
            "connect-src 'self'" if app else "connect-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )


def embed_json(text: str) -> str:
    """JSON text made safe inside a ``<script>`` element.

    ``<``, ``>`` and ``&`` only occur inside JSON strings, where their ``\\uXXXX`` escapes
    mean the same; without them a token ``</script>`` would end the element.
    """
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(data: ViewerData | None, *, app: bool = False, title: str | None = None) -> str:
    """The viewer page.

    Args:
        data: what to show; ``None`` only for the app page, which fetches it.
        app: the ``attnkit serve`` page: a text box and model, layer and head pickers that
            call ``POST api/attention``.
        title: the page's title (default ``"Attention: MODEL"``).

    Returns:
        One self-contained HTML document.

    Raises:
        ValueError: no data for an exported (non-app) page.
    """
    if data is None and not app:
        raise ValueError("an exported page needs data; only the app page (app=True) fetches its own")
    if title is None:
        title = f"Attention: {data.model_name}" if data is not None else APP_TITLE
    return render_page(data.to_json() if data is not None else "null", title=title, app=app)


def render_page(data_json: str, *, title: str, app: bool = False) -> str:
    """The viewer page around any data the script reads: :class:`ViewerData`'s JSON, or
    the long view's (:mod:`attnkit.viz.viewer.long_view`).

    Args:
        data_json: the data as JSON text (``"null"`` for the app page, which fetches it).
        title: the page's title.
        app: the ``attnkit serve`` page.

    Returns:
        One self-contained HTML document.
    """
    assets = _assets()
    values = {
        "CSP": html.escape(content_security_policy(app=app)),
        "VERSION": __version__,
        "TITLE": html.escape(title),
        "MODE": "app" if app else "file",
        "CSS": assets.style,
        "DATA": embed_json(data_json),
        "JS": assets.script,
    }
    # One pass over the template, so that placeholders inside the data stay as they are.
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], assets.template)


def write_html(path: str | Path, data: ViewerData) -> Path:
    """Write the viewer page for ``data`` to ``path`` (parent folders are created).

    Args:
        path: where to write, conventionally ``*.html``.
        data: what to show.

    Returns:
        The path written.
    """
    return write_text_atomic(path, render_html(data))
