"""``attnkit generate``: stream a continuation from attnkit's own SmolLM2 implementation."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli import CommandError
from attnkit.cli.common import MODEL_HELP, add_device_argument, add_model_source_arguments, load_model_of
from attnkit.viz.terminal import terminal_safe


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="continue a prompt with SmolLM2 (our LLaMA implementation, KV cache)",
        description=(
            "Continue PROMPT token by token and print each piece as soon as it is decoded. "
            "The model runs on attnkit's modules with a KV cache: the prompt is read once, then "
            "every step feeds one token. Greedy by default; --temperature above 0 samples."
        ),
    )
    parser.add_argument("prompt", metavar="PROMPT", help="the text to continue (no chat template is applied)")
    parser.add_argument(
        "--model", default="smollm2", metavar="NAME|PATH|ORG/NAME", help=f"{MODEL_HELP}; a decoder (default: smollm2)"
    )
    add_model_source_arguments(parser)
    add_device_argument(parser)
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, metavar="N", help="the most tokens to add (default: 64)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 = greedy (default); above 0 samples from softmax(logits / T)",
    )
    parser.add_argument(
        "--top-k", type=int, default=None, metavar="K", help="sample only from the K most likely tokens"
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        metavar="P",
        help="sample only from the most likely tokens whose probabilities first add up to P (nucleus sampling)",
    )
    parser.add_argument(
        "--no-stop-at-eos",
        dest="stop_at_eos",
        action="store_false",
        help="keep going after an end-of-sequence token (printed) up to --max-new-tokens",
    )
    parser.add_argument(
        "--seed", type=int, default=None, metavar="S", help="seed for sampling, for reproducible output"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load_model_of(args)
    printed = False
    try:
        pieces = model.generate(
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop_at_eos=args.stop_at_eos,
        )
        # Tokens are computed as they are printed: a step may still refuse (logits that
        # are not finite), after the ones before it were shown.
        for piece in pieces:
            sys.stdout.write(terminal_safe(piece))
            sys.stdout.flush()
            printed = True
    except ValueError as err:
        if printed:
            sys.stdout.write("\n")
        raise CommandError(str(err)) from None
    sys.stdout.write("\n")
    return 0
