"""``attnkit serve``: look at attention in the browser — a local web app over real models."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys

from attnkit.cli import CommandError
from attnkit.cli.common import Status, add_device_argument, add_model_source_arguments, add_quiet_argument, load_model

DEFAULT_MODEL = "smollm2"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="a local web app: type a text, see its attention",
        description=(
            "Serve the attention viewer as a local web app: type a text, pick a model, layers and "
            "heads, and see the head, model and matrix views. Models load once, at start; fetch "
            "them first with `attnkit models fetch NAME`. Listens on 127.0.0.1 unless --host says "
            "otherwise, and answers only requests addressed to 127.0.0.1, localhost, ::1, the --host "
            "address or an --allow-host name. JSON API: POST /api/attention, GET /api/info (docs/viewer.md), "
            "POST /api/long/map and /api/long/block (docs/long-contexts.md)."
        ),
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME|PATH|ORG/NAME",
        help=f"a model to serve (a fetched name, a folder or a Hugging Face name); repeat to serve several, the first is the default (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host is NAME (this machine's name or address as other "
        "machines reach it); repeat for several",
    )
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    add_model_source_arguments(parser)
    add_device_argument(parser)
    add_quiet_argument(parser)
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="longest text accepted, in tokens (default: 1024, or the model's context if shorter)",
    )
    parser.add_argument(
        "--max-long-tokens",
        type=int,
        default=None,
        metavar="N",
        help="longest text of the long-context maps (Long text: on, POST /api/long/...), in tokens "
        "(default: the model's context)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=None,
        metavar="N",
        help="requests that may wait for one model (and as many long-context maps); more get 429 Too Many "
        "Requests (default: 32)",
    )
    parser.set_defaults(func=run)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` binds, as the socket library reads it: also the short IPv4
    forms (``"0"`` is 0.0.0.0, ``"127.1"`` is 127.0.0.1) and ``""`` (every address);
    ``None`` for a name."""
    host = host.strip("[]")
    if not host:
        return ipaddress.IPv4Address(0)
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    address = _address(host)
    return host == "localhost" or (address is not None and address.is_loopback)


def is_wildcard(host: str) -> bool:
    """Whether ``host`` is "every address" (``0.0.0.0``, ``::``, and the forms that bind
    it: ``""``, ``"0"``), never a request's Host."""
    address = _address(host)
    return address is not None and address.is_unspecified


def allowed_hosts(host: str, extra: list[str]) -> list[str]:
    """The ``Host`` names the server answers to: its loopback names, the address it listens
    on (unless that is a wildcard) and the ``--allow-host`` names.

    A page on another site could point a name it controls at this server's address (DNS
    rebinding); the server only answers to names it was given.
    """
    from attnkit.serve import LOOPBACK_HOSTS

    own = [] if is_wildcard(host) else [host.strip("[]")]
    return list(dict.fromkeys([*LOOPBACK_HOSTS, *own, *(name.strip("[]") for name in extra)]))


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from attnkit.serve import DEFAULT_MAX_QUEUE, DEFAULT_MAX_TOKENS, create_app
    except ImportError as err:
        raise CommandError(str(err)) from None
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0..65535, got {args.port}")
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    if max_tokens < 1:
        raise CommandError(f"--max-tokens must be at least 1, got {max_tokens}")
    if args.max_long_tokens is not None and args.max_long_tokens < 1:
        raise CommandError(f"--max-long-tokens must be at least 1, got {args.max_long_tokens}")
    max_queue = DEFAULT_MAX_QUEUE if args.max_queue is None else args.max_queue
    if max_queue < 1:
        raise CommandError(f"--max-queue must be at least 1, got {max_queue}")
    bad = [name for name in args.allow_host if not name or any(c in name for c in "/ *@") or name.count(":") == 1]
    if bad:
        raise CommandError(f"--allow-host takes a host name or address without port or wildcard, got {bad[0]!r}")
    names = args.model or [DEFAULT_MODEL]
    if len(set(names)) != len(names):
        raise CommandError(f"--model names a model twice: {names}")
    hosts = allowed_hosts(args.host, args.allow_host)
    status = Status(args.quiet)
    try:
        app = create_app(
            names,
            loader=lambda name: load_model(name, args.device, revision=args.revision, dtype=args.dtype, status=status),
            max_tokens=max_tokens,
            max_queue=max_queue,
            max_long_tokens=args.max_long_tokens,
            allowed_hosts=hosts,
        )
    except (OSError, ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
    if not is_loopback(args.host):
        print(
            f"attnkit serve: warning: listening on {args.host} lets other machines use this server; it answers "
            f"requests addressed to {', '.join(hosts)} (add names with --allow-host)",
            file=sys.stderr,
        )
    shown = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
    print(f"attnkit serve: open http://{shown}:{args.port}/ (Ctrl+C to stop)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host.strip("[]"), port=args.port, log_level="warning")
    return 0
