"""``attnkit patch``: activation patching between a clean and a corrupted text — which
heads carry the difference."""

from __future__ import annotations

import argparse

from attnkit.cli import CommandError
from attnkit.cli.common import (
    Status,
    add_figure_arguments,
    add_model_argument,
    add_output_arguments,
    add_quiet_argument,
    figure_options,
    load_model,
    parse_formats,
    prepare_out,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "patch",
        help="which heads carry the difference between a clean and a corrupted text",
        description=(
            "Activation patching: run the corrupted text with one head's output z taken from the clean "
            "text, for every layer and head, and report the fraction of the difference restored — of the "
            "logit difference between --target and --wrong at the last position (causal models), or of "
            "the sentence-embedding cosine to the clean text (encoders). Both texts must have the same "
            "number of tokens. Prints the top heads and a layers × heads grid, and writes the grid as a "
            "picture and the numbers as JSON (effects[layer][head])."
        ),
    )
    parser.add_argument("--clean", required=True, metavar="TEXT", help="the clean text")
    parser.add_argument(
        "--corrupt", required=True, metavar="TEXT", help="the corrupted text, as many tokens as the clean one"
    )
    parser.add_argument(
        "--target", metavar="TOKEN", help='causal models: the clean continuation, leading space included (" Mary")'
    )
    parser.add_argument("--wrong", metavar="TOKEN", help="causal models: the corrupted continuation")
    add_model_argument(parser)
    parser.add_argument("--top", type=int, default=5, metavar="N", help="heads listed (default: 5)")
    add_output_arguments(parser, default_formats="png,json")
    add_figure_arguments(parser, scale=False)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.clean.strip() or not args.corrupt.strip():
        raise CommandError("--clean and --corrupt must be non-empty texts")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    formats = parse_formats(args.format)
    figure = figure_options(args)
    status = Status(args.quiet)
    out = prepare_out(args.out)
    # Every option is checked above, before PyTorch and the model load.
    from attnkit.inspect.interventions import activation_patching
    from attnkit.viz.attention_text import render_effects
    from attnkit.viz.export import write_effects
    from attnkit.viz.terminal import terminal_safe

    model = load_model(args.model, args.device, status=status)
    try:
        with status.step(f"patching {model.num_layers} layers × {model.num_heads} heads of {model.name}"):
            effects = activation_patching(model, args.clean, args.corrupt, target=args.target, wrong=args.wrong)
        print(terminal_safe(render_effects(effects, top=args.top)), end="", flush=True)
        with status.step(f"writing {', '.join(formats)}"):
            written = write_effects(effects, out, formats, **figure)
    except (ValueError, ImportError) as err:
        raise CommandError(str(err)) from None
    except OSError as err:
        raise CommandError(f"cannot write to --out {args.out}: {err.strerror or err}") from None
    print()
    for path in written:
        print(f"wrote {path}")
    return 0
