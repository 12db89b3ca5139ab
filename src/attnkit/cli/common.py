"""What several commands share: the ``--model``, ``--level``, ``--out`` and ``--format``
arguments, and loading a model with its errors as command errors."""

from __future__ import annotations

import argparse
from typing import Any

from attnkit.cli import CommandError
from attnkit.inspect.maps import LEVELS

# Files that show the chosen layer and heads, or a survey's statistics.
FORMATS = ("png", "svg", "json")
DEFAULT_MODEL = "smollm2"
DEFAULT_OUT = "attnkit-out"

LEVEL_HELP = (
    "attention between tokens, or between the words of the text (whitespace and punctuation units; "
    "a word attends to another with the sum over the other's tokens, averaged over its own tokens) "
    "(default: token)"
)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model smollm2|minilm|PATH``."""
    parser.add_argument("--model", default=DEFAULT_MODEL, metavar="smollm2|minilm|PATH",
                        help="a fetched model, or a local folder with config.json and safetensors "
                             f"(default: {DEFAULT_MODEL})")


def add_level_argument(parser: argparse.ArgumentParser, *, help: str = LEVEL_HELP) -> None:
    """``--level token|word``."""
    parser.add_argument("--level", choices=LEVELS, default="token", help=help)


def add_output_arguments(
    parser: argparse.ArgumentParser, *, default_formats: str, formats: tuple[str, ...] = FORMATS
) -> None:
    """``--out DIR`` and ``--format FMT[,FMT]``."""
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"where to write files (default: {DEFAULT_OUT}/)")
    parser.add_argument("--format", default=default_formats, metavar="FMT[,FMT]",
                        help=f"files to write, any of {','.join(formats)} (default: {default_formats})")


def parse_formats(text: str, allowed: tuple[str, ...] = FORMATS) -> list[str]:
    """``"png,json"`` as ``["png", "json"]``.

    Args:
        text: the ``--format`` value.
        allowed: the formats the command writes.

    Raises:
        CommandError: an unknown or missing format.
    """
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in allowed]
    if unknown or not formats:
        raise CommandError(f"--format takes a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(formats))


def load_model(name: str) -> Any:
    """``attnkit.models.load(name)`` with its errors as command errors.

    Raises:
        CommandError: the model is unknown, not fetched (the message says how to fetch
            it), corrupt, or its dependencies are missing.
    """
    try:
        from attnkit import models

        return models.load(name)
    except (OSError, ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
