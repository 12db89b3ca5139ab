"""``attnkit explain``: attention computed step by step on a small example."""

from __future__ import annotations

import argparse
import json

from attnkit.cli import CommandError
from attnkit.inspect.names import EXAMPLE_QUERY


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show each step of attention on a small example",
        description=(
            "Print, step by step, what attention computes: the Q, K, V table, the scores "
            "q·kᵢ, the scaled scores, the softmax weights and the context vector, with the "
            "shape of each step. Without --input it uses the worked example "
            '"The cat sat on the mat" (d_model = 4) and explains the query "sat".'
        ),
    )
    parser.add_argument(
        "--query",
        default=None,
        metavar="TOKEN",
        help=f'query row to explain: a token, a row number, or "all" (default: "{EXAMPLE_QUERY}" for the example, else all)',
    )
    parser.add_argument(
        "--score",
        choices=["scaled_dot", "dot"],
        default="scaled_dot",
        help="scaled_dot divides by √d_k (Transformer); dot does not (Luong)",
    )
    parser.add_argument("--causal", action="store_true", help="each token may only attend to itself and earlier tokens")
    parser.add_argument(
        "--input",
        metavar="FILE",
        help='JSON file {"tokens": [...], "q": [[...]], "k": [[...]], "v": [[...]]}; '
        'add "query_tokens" when the queries are other tokens than the keys',
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnkit.inspect.explain import example_input, explain, load_input, resolve_queries
    from attnkit.viz.explain_text import render_explanation
    from attnkit.viz.terminal import json_terminal_safe, terminal_safe

    try:
        inputs = load_input(args.input) if args.input else example_input()
        query = args.query if args.query is not None else (None if args.input else EXAMPLE_QUERY)
        expl = explain(inputs, queries=resolve_queries(inputs, query), score=args.score, causal=args.causal)
    except ValueError as err:
        raise CommandError(str(err)) from None
    if args.json:
        print(json_terminal_safe(json.dumps(expl.to_dict(), ensure_ascii=False, indent=2)))
    else:
        print(terminal_safe(render_explanation(expl)), end="")
    return 0
