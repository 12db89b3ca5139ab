"""``attnkit pe``: pictures of the sinusoidal and rotary positional encodings."""

from __future__ import annotations

import argparse

from attnkit.cli import CommandError
from attnkit.cli.common import command_errors


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pe",
        help="draw the sinusoidal and rotary positional encodings",
        description=(
            "Draw the pictures of the positional-encoding tutorial (docs/positional-encoding.md): the sinusoidal encodings of positions 3 "
            "and 4 (alike) and 3 and 500 (different) across dimensions; dimensions 0, 10, 300 and 511 across "
            "positions (short and very long periods); and the similarity of two positions' encodings as a "
            "function of their distance, sinusoidal (PE·PE) against rotary (q·k of one vector rotated to both "
            "positions). Prints the files written and the numbers behind them."
        ),
    )
    parser.add_argument("--d-model", type=int, default=512, help="encoding dim (default: 512)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory for the PNG files")
    parser.add_argument(
        "--base",
        type=float,
        default=10000.0,
        help="the 10000 of the sinusoidal formula, also the rotary theta (default: 10000)",
    )
    parser.add_argument(
        "--pairs",
        type=_pairs,
        default=None,
        metavar="A:B,C:D",
        help="pairs of positions to compare (default: 3:4,3:500)",
    )
    parser.add_argument(
        "--dims",
        type=_ints,
        default=None,
        metavar="I,J,...",
        help="dimensions to draw across positions (default: 0,10,300,511, scaled to --d-model)",
    )
    parser.add_argument(
        "--max-position", type=int, default=200, help="last position of the per-dimension picture (default: 200)"
    )
    parser.add_argument(
        "--max-distance", type=int, default=1000, help="largest distance of the similarity picture (default: 1000)"
    )
    parser.add_argument(
        "--head-dim", type=int, default=None, help="rotary head dim (default: --d-model, the sinusoidal frequencies)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random vector the rotary curve rotates")
    parser.set_defaults(func=run)


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for part in text.split(","):
        a, sep, b = part.partition(":")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(a), int(b)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected pairs like 3:4,3:500, got {text!r}") from None
    return pairs


def run(args: argparse.Namespace) -> int:
    if args.d_model < 2 or args.d_model % 2:
        raise CommandError(
            f"--d-model must be even and at least 2 (each position is written as sine and cosine pairs), "
            f"got {args.d_model}"
        )
    from attnkit.viz.positional import NOTE_PAIRS, ROTARY_STARTS, draw_positional_pictures

    with command_errors(f"cannot write to {args.out}"):
        pictures = draw_positional_pictures(
            args.out,
            d_model=args.d_model,
            base=args.base,
            pairs=NOTE_PAIRS if args.pairs is None else args.pairs,
            dims=args.dims,
            max_position=args.max_position,
            max_distance=args.max_distance,
            head_dim=args.head_dim,
            seed=args.seed,
        )
    for path in pictures.files:
        print(f"wrote {path}")
    print(f"\nSinusoidal encoding, d_model = {args.d_model}:")
    for (a, b), similarity in pictures.pair_similarity.items():
        print(f"  cosine similarity of PE({a}) and PE({b}): {similarity:.4f}")
    for dim, period in pictures.periods.items():
        print(f"  dimension {dim}: period {period:,.1f} positions")
    print("Similarity by distance Δ (cosine):")
    distances = [d for d in (1, 10, 100, 1000) if d < len(pictures.sinusoidal)]
    print("  " + "".join(f"{'Δ=' + str(d):>10}" for d in distances))
    print("  " + "".join(f"{pictures.sinusoidal[d].item():>10.4f}" for d in distances) + "   sinusoidal")
    first = pictures.rotary[ROTARY_STARTS[0]]
    print("  " + "".join(f"{first[d].item():>10.4f}" for d in distances) + "   rotary")
    gap = max((curve - first).abs().max().item() for curve in pictures.rotary.values())
    starts = " and ".join(str(s) for s in ROTARY_STARTS)
    print(f"  rotary q·k from positions {starts}: largest difference {gap:.1e} (depends on Δ only)")
    return 0
