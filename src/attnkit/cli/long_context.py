"""``attnkit heads --stat sink|distance|retrieval`` and what ``attnkit inspect --long``
(:mod:`attnkit.cli.inspect_long`) shares with it: attention of a real model over a long text,
from per-head summaries streamed block by block (never the ``[s, s]`` map), and the retrieval
heads of a needle-in-a-haystack probe."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.common import (
    FORMATS,
    Status,
    command_errors,
    load_model_of,
    prepare_out,
    print_written,
)
from attnkit.cli.long_text import check_long_text, long_token_ids
from attnkit.viz.terminal import counted

# Statistics of `attnkit heads` that come from the long-context summaries.
LONG_STATISTICS = ("sink", "distance", "window", "entropy", "retrieval")
# Those that only a long-context run has (the others also name a short-text statistic).
LONG_ONLY_STATISTICS = ("sink", "window", "retrieval")
# Sides of the block-reduced map drawn by `attnkit inspect --long` (blocks per side at most).
MAP_SIDE = 256
# What `attnkit inspect --long --format` may name.
LONG_FORMATS = (*FORMATS, "html")
# The files of `attnkit inspect --long`: the viewer's long view (html), the head table and
# the top keys (json).
LONG_PAGE = "long_context.html"
LONG_TABLE = "long_context.json"
LONG_TOP_KEYS = "long_context_top.npz"


def add_long_arguments(parser: argparse.ArgumentParser, *, inspect: bool) -> None:
    """The options of long texts: ``--long``, ``--window``, ``--sink-tokens``,
    ``--max-tokens`` and, for ``inspect``, ``--file``; for ``heads``, ``--length`` and
    ``--depth`` of the needle probe."""
    group = parser.add_argument_group(
        "long texts",
        "--long streams exact per-head summaries block by block from the fused forward pass, without "
        "forming any [s, s] map: mass on the first tokens (sink), mean and quantiles of the attention "
        "distance, mass within --window tokens, entropy"
        + (
            ", the top --top keys of every query and a block-reduced map. --format names the files, "
            "and only those are written: json the head table (long_context.json) with the top keys "
            "(long_context_top.npz), html long_context.html (the viewer's long view of them all, "
            "tokens labelled as they read, or by their words with --level word), png or svg the "
            "block-reduced map of each layer's first head."
            if inspect
            else "."
        ),
    )
    group.add_argument("--long", action="store_true", help="summaries of a long text in bounded memory")
    group.add_argument("--window", type=int, default=256, metavar="W", help="distance counted as near (default: 256)")
    group.add_argument(
        "--sink-tokens", type=int, default=1, metavar="N", help="first tokens counted as the sink (default: 1)"
    )
    group.add_argument("--max-tokens", type=int, metavar="N", help="keep the first N tokens of the text")
    if inspect:
        group.add_argument(
            "--file",
            metavar="FILE",
            help="read the text from FILE (a regular file, UTF-8) instead of TEXT; only its start is read, as "
            "far as the tokens the run can take",
        )
    else:
        group.add_argument(
            "--length",
            type=int,
            default=1024,
            metavar="N",
            help="--stat retrieval: tokens of the probe (default: 1024)",
        )
        group.add_argument(
            "--depth",
            type=float,
            default=0.5,
            metavar="F",
            help="--stat retrieval: where the needle sits in the filler, 0 (start) to 1 (end) (default: 0.5)",
        )


def check_long_options(args: argparse.Namespace) -> None:
    """``--window``, ``--sink-tokens`` and ``--max-tokens``, before the model loads.

    Raises:
        CommandError: one of them below 1.
    """
    for name in ("window", "sink_tokens"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise CommandError(f"--max-tokens must be at least 1, got {args.max_tokens}")


def format_head_table(table: list[dict[str, Any]], *, window: int) -> str:
    """The head table as aligned text, one row per head."""
    header = (
        f"{'layer':>5} {'head':>4} {'sink':>6} {'dist':>8} {'median':>7} {'q90':>7} {f'<{window}':>7} {'entropy':>7}"
    )
    lines = [header]
    for row in table:
        lines.append(
            f"{row['layer']:>5} {row['head']:>4} {row['sink']:>6.3f} {row['distance']:>8.1f} "
            f"{row['distance_q50']:>7} {row['distance_q90']:>7} {row['within_window']:>7.3f} {row['entropy']:>7.2f}"
        )
    return "\n".join(lines)


def write_long_outputs(
    run: Any, out: Path, model: Any, *, block: int, formats: list[str], tokens: list[str]
) -> list[Path]:
    """The files ``formats`` names, and only those: with json ``long_context.json`` (the head
    table) and ``long_context_top.npz`` (each summarised layer's top keys and weights,
    ``top_keys_L`` and ``top_weights_L`` of ``[heads, s, k]``: arrays JSON would carry
    several times larger); with html the viewer's long view (``long_context.html``: reduced
    maps, top keys and summaries of every summarised head); with png or svg one
    block-reduced map (max over blocks) per summarised layer's first head."""
    written = []
    if "json" in formats:
        written += _write_long_json(run, out, model, block=block)
    if "html" in formats:
        from attnkit.viz.viewer.long_view import long_viewer_data, write_long_html

        data = long_viewer_data(run, tokens, model_name=model.name, causal=bool(model.causal))
        written.append(write_long_html(out / LONG_PAGE, data))
    pictures = [f for f in formats if f in ("png", "svg")]
    if pictures:
        from attnkit.viz.heatmap import plot_attention, save_figure

        for layer, summary in run.summaries.items():
            assert summary.block_max is not None  # asked for with map_block
            n = summary.block_max.shape[-1]
            labels = [str(i * block) for i in range(n)]
            fig = plot_attention(
                summary.block_max[0].float(),
                labels,
                labels,
                title=f"{model.name} layer {layer} head {summary.heads[0]}: max over {block}×{block} blocks",
                causal=model.causal,
            )
            for suffix in pictures:
                written.append(save_figure(fig, out / f"long_layer{layer}_head{summary.heads[0]}.{suffix}"))
    return written


def _write_long_json(run: Any, out: Path, model: Any, *, block: int) -> list[Path]:
    """``long_context.json`` (the head table) and ``long_context_top.npz`` (the top keys)."""
    import numpy as np

    data = {"model": model.name, "tokens": int(run.ids.numel()), "map_block": block, "heads": run.head_table()}
    path = out / LONG_TABLE
    path.write_text(json.dumps(data, indent=1))
    arrays = {}
    for layer, summary in run.summaries.items():
        arrays[f"top_keys_{layer}"] = summary.top_keys.cpu().numpy().astype(np.int32)
        arrays[f"top_weights_{layer}"] = summary.top_weights.float().cpu().numpy()
    top = out / LONG_TOP_KEYS
    np.savez_compressed(top, **arrays)
    return [path, top]


def run_heads_long(args: argparse.Namespace) -> int:
    """``attnkit heads --stat sink|distance|window|entropy|retrieval`` (or ``--long``): the
    heads ranked by one long-context statistic over TEXT or the start of ``--file``
    (:func:`attnkit.cli.long_text.long_token_ids`); retrieval runs the needle probe."""
    check_long_options(args)
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    stat = args.stat or "sink"
    if stat not in LONG_STATISTICS:
        raise CommandError(f"--long ranks heads by {', '.join(LONG_STATISTICS)}; got --stat {stat}")
    if stat == "retrieval":
        if not 0.0 <= args.depth <= 1.0:
            raise CommandError(f"--depth must be in [0, 1], got {args.depth}")
    elif args.text is None and args.file is None:
        raise CommandError(f"--stat {stat} reads a long text: give TEXT or --file FILE")
    elif args.text is not None and args.file is not None:
        raise CommandError("give either a TEXT or --file FILE")
    else:
        check_long_text(args.text, args.file)
    status = Status(args.quiet)
    out = prepare_out(args.out)
    model = load_model_of(args, status)
    with command_errors(f"cannot write to --out {args.out}"):
        if stat == "retrieval":
            from attnkit.inspect.retrieval_heads import needle_probe, retrieval_scores

            probe = needle_probe(model, length=args.length, depth=args.depth)
            with status.step(f"needle probe of {counted(probe.ids.numel(), 'token')} at depth {args.depth}"):
                scores = retrieval_scores(model, probe)
            print(f"{model.name} copied {scores.copied} of the needle's {scores.needle_tokens} tokens")
            print(f"{'layer':>5} {'head':>4} {'retrieval':>9}")
            for layer, head, score in scores.top(args.top):
                print(f"{layer:>5} {head:>4} {score:>9.3f}")
            data = {
                "model": model.name,
                "tokens": int(probe.ids.numel()),
                "depth": args.depth,
                "copied": scores.copied,
                "needle_tokens": scores.needle_tokens,
                "retrieval": {str(layer): row.tolist() for layer, row in zip(scores.layers, scores.scores)},
            }
        else:
            from attnkit.inspect.long_context import long_context_summaries

            ids = long_token_ids(model, args.text, args.file, args.max_tokens)
            with status.step(f"summarising every head of {model.name} over {counted(ids.numel(), 'token')}"):
                run = long_context_summaries(
                    model,
                    ids,
                    top_k=1,
                    sink_tokens=args.sink_tokens,
                    window=args.window,
                    progress=lambda done, total: status.say(f"  {done}/{total} layers summarised"),
                )
            key = {"window": "within_window"}.get(stat, stat)
            table = sorted(run.head_table(), key=lambda row: -float(row[key]))
            print(format_head_table(table[: args.top], window=args.window))
            data = {"model": model.name, "tokens": int(ids.numel()), "stat": stat, "heads": run.head_table()}
        path = out / f"heads_{stat}.json"
        path.write_text(json.dumps(data, indent=1))
    print_written([path])
    return 0
