"""``attnkit patch``: activation patching between a clean and a corrupted text — which
heads, or which layers and positions, carry the difference."""

from __future__ import annotations

import argparse
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.common import (
    Status,
    add_figure_arguments,
    add_model_argument,
    add_output_arguments,
    add_quiet_argument,
    command_errors,
    figure_options,
    load_model_of,
    parse_formats,
    prepare_out,
    print_written,
)
from attnkit.inspect.names import BY, COMPONENTS, METRICS, PER_HEAD


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "patch",
        help="which heads, or layers and positions, carry the difference between a clean and a corrupted text",
        description=(
            "Activation patching: run the corrupted text with one activation taken from the clean text, and "
            "report the fraction of the difference restored, (patched - corrupted) / (clean - corrupted): of the "
            "logit difference between --target and --wrong at the last position, or of log p(--target) with "
            "--metric log-p (causal models), or of the sentence-embedding cosine to the clean text (encoders). "
            "By default each head's output z is patched at every position, for every layer and head; --by "
            "layer-position patches --component at one layer and one position, for every layer and position; "
            "--by position patches it at one position in every layer at once; --by dest-src patches one cell of "
            "the pattern, a destination's weight on one source, in --heads of every layer of --layers at once "
            "(destinations × sources). Both texts must have the same "
            "number of tokens. Prints the cells that restore most and the grid, and writes the grid as a picture "
            "(a diverging map centred on zero) and the numbers as JSON (effects[row][column])."
        ),
    )
    parser.add_argument("--clean", required=True, metavar="TEXT", help="the clean text")
    parser.add_argument(
        "--corrupt", required=True, metavar="TEXT", help="the corrupted text, as many tokens as the clean one"
    )
    parser.add_argument(
        "--target",
        metavar="TOKEN",
        help='causal models: the clean continuation, leading space included (" Mary"); encoder-decoders '
        "(T5, BART): the target text their decoder predicts after either source (each head's z is patched)",
    )
    parser.add_argument(
        "--wrong", metavar="TOKEN", help="causal models: the corrupted continuation (the logit difference)"
    )
    parser.add_argument(
        "--by",
        choices=BY,
        default="head",
        help="where each patch acts: one head's z at every position (layers × heads, the default); one layer "
        "at one position (layers × positions); one position in every layer at once (one row of positions); one "
        "(destination, source) cell of the pattern in --heads of --layers at once (positions × positions); one "
        "head's --component at one position (the heads of every layer × positions)",
    )
    parser.add_argument(
        "--component",
        choices=COMPONENTS,
        default=None,
        help="what is patched: the residual stream into a layer, between its blocks or out of it, the attention "
        "or MLP block's output, or each head's z, q, k, v or pattern (default: z by head, resid_pre by position; "
        "by head takes only the per-head ones; by position they are patched for every head at the query "
        "position)",
    )
    _add_where_arguments(parser)
    _add_sweep_arguments(parser)
    add_model_argument(parser)
    parser.add_argument("--top", type=int, default=5, metavar="N", help="cells listed (default: 5)")
    add_output_arguments(parser, default_formats="png,json")
    add_figure_arguments(parser, scale=False)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def _add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """``--every`` and ``--attribution``."""
    parser.add_argument(
        "--every",
        action="store_true",
        help="patch every block kind in one run: resid_pre, attn_out and mlp_out by layer and position, each "
        "head's z, q, k, v and pattern by head (every position) and by layer and position; prints and writes "
        "one grid for each (instead of --by and --component)",
    )
    parser.add_argument(
        "--attribution",
        action="store_true",
        help="attribution patching: each cell estimated to first order, (clean - corrupted activation) · "
        "gradient of the metric at the corrupted run, from one backward pass (causal models; --by head, "
        "layer-position or position)",
    )


def _add_where_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metric``, ``--layers`` and ``--heads``."""
    parser.add_argument(
        "--metric",
        choices=METRICS,
        default=None,
        help="what is measured: logit-diff (--target minus --wrong, causal default), log-p (of --target), "
        "cosine (to the clean sentence embedding, encoders)",
    )
    parser.add_argument(
        "--layers",
        default=None,
        metavar="L[,L]|all",
        help="layers, from 0, negative from the end, comma-separated, or all (default: all)",
    )
    parser.add_argument(
        "--heads",
        default=None,
        metavar="H[,H]|all",
        help="--by dest-src: the heads whose pattern cell is patched, from 0, negative from the end, "
        "comma-separated, or all (default: all)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.clean.strip() or not args.corrupt.strip():
        raise CommandError("--clean and --corrupt must be non-empty texts")
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    if args.by in ("head", "head-position") and args.component is not None and args.component not in PER_HEAD:
        raise CommandError(
            f"--by {args.by} patches a per-head component ({', '.join(PER_HEAD)}); --component {args.component} is "
            "one vector per position: use --by layer-position or --by position"
        )
    _check_metric_tokens(args.metric, args.target, args.wrong)
    if args.heads is not None and args.by != "dest-src":
        raise CommandError(f"--heads chooses the heads of --by dest-src; --by {args.by} takes none")
    if args.by == "dest-src" and args.component not in (None, "pattern"):
        raise CommandError(f"--by dest-src patches cells of the pattern; it takes no --component {args.component}")
    if args.every and (args.component is not None or args.by != "head" or args.heads is not None):
        raise CommandError(
            "--every patches every block kind by layer, position and head: leave out --by, --component and --heads"
        )
    if args.attribution and args.by == "dest-src":
        raise CommandError("--attribution estimates grids by head, layer-position or position, not --by dest-src")
    formats = parse_formats(args.format)
    figure = figure_options(args)
    status = Status(args.quiet)
    out = prepare_out(args.out)
    # Every option is checked above, before PyTorch and the model load.
    from attnkit.cli.inspect_plan import parse_heads, parse_layers
    from attnkit.viz.attention_text import render_effects
    from attnkit.viz.export import write_effects
    from attnkit.viz.terminal import terminal_safe

    model = load_model_of(args, status)
    layers = parse_layers(args.layers, model.num_layers)
    heads = parse_heads(args.heads, model.num_heads)
    grid = {
        "head": f"{model.num_heads} heads",
        "dest-src": "destinations × sources",
        "head-position": f"{model.num_heads} heads × positions",
    }.get(args.by, "positions")
    if args.every:
        grid = "every block kind"
    with command_errors(f"cannot write to --out {args.out}"):
        with status.step(f"patching {len(layers or range(model.num_layers))} layers × {grid} of {model.name}"):
            grids = _patched_grids(args, model, layers, heads)
        written = []
        for number, effects in enumerate(grids):
            print(("\n" if number else "") + terminal_safe(render_effects(effects, top=args.top)), end="", flush=True)
            with status.step(f"writing {', '.join(formats)}"):
                written += write_effects(effects, out, formats, **figure)
    print_written(written)
    return 0


def _patched_grids(args: argparse.Namespace, model: Any, layers: list[int] | None, heads: list[int] | None) -> tuple:
    """The grids the options ask for: one of activation patching, or of attribution patching,
    or every block kind's (:data:`attnkit.inspect.patching_grids.EVERY`) by either."""
    from attnkit.inspect.interventions import activation_patching
    from attnkit.inspect.patching_grids import EVERY, attribution_patching, every_block_patching

    tokens = {"metric": args.metric, "target": args.target, "wrong": args.wrong}
    if not (args.every or args.attribution):
        by = {"by": args.by, "component": args.component}
        return (activation_patching(model, args.clean, args.corrupt, **by, **tokens, layers=layers, heads=heads),)
    sweep = attribution_patching if args.attribution else every_block_patching
    default = "z" if args.by in ("head", "head-position") else "resid_pre"
    pairs = EVERY if args.every else [(args.component or default, args.by)]
    return sweep(model, args.clean, args.corrupt, **tokens, layers=layers, grids=pairs).grids


def _check_metric_tokens(metric: str | None, target: str | None, wrong: str | None) -> None:
    """Refuse, before the model loads, tokens a named metric never takes, whatever the
    model (what a metric lacks, and whether it fits the model, depends on the model's kind:
    checked once it loads).

    Raises:
        CommandError: ``log-p`` with ``--wrong``, ``cosine`` with ``--target`` or ``--wrong``.
    """
    if metric == "log-p" and wrong is not None:
        raise CommandError("--metric log-p measures the --target token alone; leave out --wrong")
    if metric == "cosine" and (target is not None or wrong is not None):
        raise CommandError("--metric cosine compares sentence embeddings and takes no --target or --wrong")
