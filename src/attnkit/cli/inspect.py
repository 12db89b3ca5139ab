"""``attnkit inspect``: attention in a real model, as in the tutorial's practical
example — between tokens or words, printed, drawn as a heatmap, saved as JSON, and as the
interactive viewer of every layer and head."""

from __future__ import annotations

import argparse

from attnkit.cli import CommandError
from attnkit.cli.common import (
    FORMATS,
    Status,
    add_figure_arguments,
    add_level_argument,
    add_model_argument,
    add_output_arguments,
    add_quiet_argument,
    add_size_argument,
    figure_options,
    load_model_of,
    parse_formats,
    parse_size,
    prepare_out,
)
from attnkit.cli.inspect_encoder_decoder import run_encoder_decoder
from attnkit.cli.inspect_long import run_long
from attnkit.cli.inspect_maps import run_maps
from attnkit.cli.inspect_plan import InspectOptions, parse_rows
from attnkit.cli.long_context import add_long_arguments
from attnkit.inspect.names import ATTENTION_KINDS, EXAMPLE_TEXT, FLOW_MAX_TOKENS, METHODS, VIEWER_MODES
from attnkit.models.model.kinds import ONE_TEXT, SOURCE_AND_TARGET, for_kind

# ``attnkit inspect`` adds to the shared formats the viewer page, of every layer and head.
INSPECT_FORMATS = (*FORMATS, "html")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show where each token attends in a real model",
        description=(
            "Run a real model on TEXT and show a layer's attention: the tokens, the keys "
            "each query token attends to most, a heatmap (query tokens as rows, key tokens as "
            "columns; values written in the cells of short texts, cells a causal model cannot "
            "attend to in grey), the weights as JSON, and with --format html one self-contained "
            "viewer page of every layer and head. Files estimated larger than --max-size are refused "
            "before anything runs. Status lines go to stderr (--quiet for none). "
            f'Defaults show the tutorial\'s example: "{EXAMPLE_TEXT}", SmolLM2, last layer, head 0. '
            "Models come from `attnkit models fetch NAME`."
        ),
    )
    parser.add_argument(
        "text", nargs="?", default=EXAMPLE_TEXT, metavar="TEXT", help=f'the text to run (default: "{EXAMPLE_TEXT}")'
    )
    add_model_argument(parser)
    add_chat_argument(parser)
    _add_map_arguments(parser)
    _add_encoder_decoder_arguments(parser)
    add_level_argument(parser)
    add_output_arguments(parser, default_formats="png,json", formats=INSPECT_FORMATS)
    add_size_argument(parser)
    add_figure_arguments(parser)
    add_quiet_argument(parser)
    add_long_arguments(parser, inspect=True)
    parser.set_defaults(func=run)


def add_chat_argument(parser: argparse.ArgumentParser) -> None:
    """``--chat``."""
    parser.add_argument(
        "--chat",
        action="store_true",
        help="read TEXT as a chat model reads it, in the model's chat template: TEXT is one user message, "
        'or a JSON list of messages such as \'[{"role": "user", "content": "Hi"}]\' (or a .json file of one); '
        "positions (--rows) count the template's tokens, and the html page shows each token's turn and role",
    )


def _add_map_arguments(parser: argparse.ArgumentParser) -> None:
    """``--layers``, ``--heads``, ``--top``, ``--method`` and ``--target``."""
    parser.add_argument(
        "--layers",
        "--layer",
        dest="layers",
        default=None,
        metavar="L[,L]|all",
        help="layers, from 0, negative from the end, comma-separated, or all: the printed maps, "
        "pictures and JSON show each (default: -1, the last); the html page shows these "
        "(default: all)",
    )
    parser.add_argument(
        "--heads",
        "--head",
        dest="heads",
        default=None,
        metavar="H[,H]|all",
        help="heads, from 0, comma-separated, or all; several heads are drawn as small multiples "
        "in one picture (default: 0; the html page: all)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        metavar="A:B",
        help="the query tokens (rows) to show, from A up to B (from 0, negative from the end; "
        "either side may be left out: --rows=-64: is the last 64, 100 alone is token 100): only these "
        "rows of the heads asked for are formed, beside a plain forward pass, so that a long "
        "text's map fits in memory; with the raw weights between tokens, not with --format html "
        "(default: every token)",
    )
    parser.add_argument("--top", type=int, default=3, metavar="K", help="keys shown per query token (default: 3)")
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="raw",
        help="what the maps show: raw attention weights; rollout or flow (every layer below merged, "
        f"heads merged; flow takes at most {FLOW_MAX_TOKENS} tokens); value (weights times the "
        "norm of what each key token sends through the head); grad (weights times the gradient "
        "of --target); with --format html, value and rollout are added to the page as "
        "colour modes beside the weights, in its Attention menu; flow and grad are not in the "
        "page, which shows the raw weights (default: raw)",
    )
    parser.add_argument(
        "--target",
        metavar="TOKEN|TEXT",
        help="for --method grad: the next token whose log-probability to explain, leading space "
        'included (" Paris"), or for an encoder a text whose sentence-embedding similarity to explain',
    )


def _add_encoder_decoder_arguments(parser: argparse.ArgumentParser) -> None:
    """``--decoder-text``, ``--attention`` and ``--max-new-tokens``."""
    encoder_decoder = parser.add_argument_group(
        "encoder-decoder models (T5, BART)",
        "TEXT is the source; the maps show one of the three kinds of attention, the decoder's with "
        "target tokens as rows (each the token its position produces) and, for cross-attention, "
        "source tokens as columns. --layers are then the decoder's layers (the encoder's for "
        "--attention encoder); the html page shows the three kinds, every layer of both stacks.",
    )
    encoder_decoder.add_argument(
        "--decoder-text",
        metavar="TEXT",
        help="the target the decoder reads (teacher forcing); without it the model generates the "
        "target greedily, and says so",
    )
    encoder_decoder.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        default=None,
        help="encoder (self-attention over the source), decoder (masked self-attention over the "
        "target) or cross (target tokens attending to source tokens; the default)",
    )
    encoder_decoder.add_argument(
        "--max-new-tokens",
        type=int,
        default=32,
        metavar="N",
        help="the most tokens to generate without --decoder-text (default: 32)",
    )


def run(args: argparse.Namespace) -> int:
    """``attnkit inspect``: the options that need no model, then the pipeline of the mode —
    ``--long`` (:mod:`attnkit.cli.inspect_long`), an encoder–decoder
    (:mod:`attnkit.cli.inspect_encoder_decoder`) or a model of one text
    (:mod:`attnkit.cli.inspect_maps`) — each of which plans, runs and writes."""
    if args.long:
        return run_long(args)
    options = _parse_options(args)
    # Every option that needs no model is checked above, before PyTorch and the model load.
    model = load_model_of(args, options.status)
    pipeline = for_kind(model, {ONE_TEXT: run_maps, SOURCE_AND_TARGET: run_encoder_decoder}, what="attnkit inspect")
    return pipeline(args, options, model)


def _parse_options(args: argparse.Namespace) -> InspectOptions:
    """The options of ``attnkit inspect`` that need no model, and the output folder.

    Raises:
        CommandError: one of them is wrong, or an option of ``--long`` without it.
    """
    if args.file is not None or args.max_tokens is not None:
        raise CommandError("--file and --max-tokens go with --long")
    status = Status(args.quiet)
    formats = parse_formats(args.format, INSPECT_FORMATS)
    limit = parse_size(args.max_size)
    figure = figure_options(args)
    _check_options(args)
    page_modes = [args.method] if "html" in formats and args.method in VIEWER_MODES else []
    return InspectOptions(formats, limit, figure, prepare_out(args.out), status, page_modes)


def _check_options(args: argparse.Namespace) -> None:
    """The options that need no model: a text, ``--top``, and ``--target`` with ``--method grad``.

    Raises:
        CommandError: one of them is wrong.
    """
    if not args.text.strip():
        raise CommandError("the text is empty")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    if args.method == "grad" and args.target is None:
        raise CommandError(
            '--method grad needs --target: the next token whose log-probability to explain (" Paris"), '
            "or for an encoder a text"
        )
    if args.method != "grad" and args.target is not None:
        raise CommandError(f"--target is only for --method grad, not --method {args.method}")
    if args.rows is not None:
        parse_rows(args.rows)
        if args.method != "raw" or args.level != "token" or "html" in parse_formats(args.format, INSPECT_FORMATS):
            raise CommandError(
                "--rows shows some rows of the raw weights between tokens: not with --method "
                f"{args.method}, --level {args.level} or --format html"
            )
