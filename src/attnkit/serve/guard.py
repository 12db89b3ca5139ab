"""The app's guard, outermost around every request: it refuses a ``Host`` that is not one of
the server's own names (DNS rebinding) and a body over the size limit, answers an
unexpected failure with a JSON 500, and adds the security headers (a content-security
policy that forbids other origins, no framing, no sniffing, no caching) to every response."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attnkit.serve.admission import http_error
from attnkit.viz.viewer import content_security_policy

logger = logging.getLogger("attnkit.serve")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


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


class Guard:
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
                    raise http_error(413, self._too_large_detail())
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


def security_headers() -> list[tuple[bytes, bytes]]:
    """The headers of every response: no framing, no sniffing, no referrer, no caching."""
    return [
        (b"content-security-policy", (content_security_policy(app=True) + "; frame-ancestors 'none'").encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cross-origin-resource-policy", b"same-origin"),
        (b"x-frame-options", b"DENY"),
        (b"cache-control", b"no-store"),
    ]
