"""``attnkit inspect``: one layer's attention in a real model, as in the notes' practical
example — between tokens or words, printed, drawn as a heatmap, saved as JSON, and as the
interactive viewer of every layer and head."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli import CommandError
from attnkit.cli.common import (
    FORMATS,
    add_level_argument,
    add_model_argument,
    add_output_arguments,
    load_model,
    parse_formats,
)
from attnkit.inspect.maps import EXAMPLE_TEXT, attention_map

# ``attnkit inspect`` adds to the shared formats the viewer page, of every layer and head.
INSPECT_FORMATS = (*FORMATS, "html")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show where each token attends in a real model",
        description=(
            "Run a real model on TEXT and show one layer's attention: the tokens, the keys "
            "each query token attends to most, a heatmap in the notes' style (Blues, values "
            "annotated, query tokens as rows, key tokens as columns), the weights as JSON, and "
            "with --format html one self-contained viewer page of every layer and head. "
            f'Defaults reproduce the notes\' example: "{EXAMPLE_TEXT}", SmolLM2, last layer, head 0. '
            "Models come from `attnkit models fetch NAME`."
        ),
    )
    parser.add_argument("text", nargs="?", default=EXAMPLE_TEXT, metavar="TEXT",
                        help=f'the text to run (default: "{EXAMPLE_TEXT}")')
    add_model_argument(parser)
    parser.add_argument("--layer", type=int, default=-1, metavar="L",
                        help="layer, from 0; negative counts from the end (default: -1, the last)")
    parser.add_argument("--head", default="0", metavar="H|all", help='head, from 0, or "all" (default: 0)')
    parser.add_argument("--top", type=int, default=3, metavar="K", help="keys shown per query token (default: 3)")
    add_level_argument(parser)
    add_output_arguments(parser, default_formats="png,json", formats=INSPECT_FORMATS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnkit.viz.attention_text import render_map
    from attnkit.viz.export import write_map, write_viewer

    formats = parse_formats(args.format, INSPECT_FORMATS)
    if not args.text.strip():
        raise CommandError("the text is empty")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    model = load_model(args.model)
    try:
        amap = attention_map(model, args.text, layer=args.layer, head=args.head, level=args.level)
        print(render_map(amap, top=args.top), end="", flush=True)
        written = write_map(amap, Path(args.out), formats)
        if "html" in formats:
            written.append(write_viewer(model, args.text, Path(args.out), level=args.level))
    except (ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
    print()
    for path in written:
        print(f"wrote {path}")
    return 0
