"""``attnkit serve``: look at attention in the browser — a local web app over real models."""

from __future__ import annotations

import argparse
import ipaddress
import sys

from attnkit.cli import CommandError

DEFAULT_MODEL = "smollm2"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="a local web app: type a text, see its attention",
        description=(
            "Serve the attention viewer as a local web app: type a text, pick a model, layers and "
            "heads, and see the head, model and matrix views. Models load once, at start; fetch "
            "them first with `attnkit models fetch NAME`. Listens on 127.0.0.1 unless --host says "
            "otherwise. JSON API: POST /api/attention, GET /api/info (docs/viewer.md)."
        ),
    )
    parser.add_argument("--model", action="append", metavar="smollm2|minilm|PATH",
                        help="a model to serve; repeat to serve several, the first is the default "
                             f"(default: {DEFAULT_MODEL})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="longest text accepted, in tokens (default: 1024, or the model's context if shorter)")
    parser.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from attnkit.serve import DEFAULT_MAX_TOKENS, LOOPBACK_HOSTS, create_app
    except ImportError as err:
        raise CommandError(str(err)) from None
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0..65535, got {args.port}")
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    if max_tokens < 1:
        raise CommandError(f"--max-tokens must be at least 1, got {max_tokens}")
    names = args.model or [DEFAULT_MODEL]
    if len(set(names)) != len(names):
        raise CommandError(f"--model names a model twice: {names}")
    loopback = is_loopback(args.host)
    print(f"attnkit serve: loading {', '.join(names)}", file=sys.stderr, flush=True)
    try:
        from attnkit import models

        app = create_app(
            names, loader=models.load, max_tokens=max_tokens,
            # A page on another site could point a name it controls at 127.0.0.1 (DNS
            # rebinding); a local server only answers to its own names.
            allowed_hosts=[*LOOPBACK_HOSTS, args.host] if loopback else None,
        )
    except (OSError, ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
    if not loopback:
        print(f"attnkit serve: warning: listening on {args.host} lets other machines use this server",
              file=sys.stderr)
    print(f"attnkit serve: open http://{args.host}:{args.port}/ (Ctrl+C to stop)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
