"""``attnkit inspect --long``: parse → plan (:func:`attnkit.cli.inspect_plan.plan_long`) →
run (per-head summaries streamed block by block, never an ``[s, s]`` map) → write (the head
table, the top keys, the block-reduced maps, the long view page)."""

from __future__ import annotations

import argparse
from typing import Any

from attnkit.cli import CommandError
from attnkit.cli.common import (
    Status,
    command_errors,
    load_model_of,
    parse_formats,
    parse_size,
    prepare_out,
    print_written,
)
from attnkit.cli.inspect_plan import InspectOptions, LongPlan, plan_long, say_estimates
from attnkit.cli.long_context import LONG_FORMATS, check_long_options, format_head_table, write_long_outputs
from attnkit.cli.long_text import check_long_text
from attnkit.viz.terminal import counted


def run_long(args: argparse.Namespace) -> int:
    """Parse, plan, run and write ``attnkit inspect --long``."""
    options = _parse_options(args)
    model = load_model_of(args, options.status)
    plan = plan_long(args, options, model)
    say_estimates(plan.estimates, plan.said, options.status)
    with command_errors(f"cannot write to --out {args.out}"):
        run = _run(plan, model, options.status)
        print(format_head_table(run.head_table(), window=plan.window))
        with options.status.step("writing the summaries"):
            written = write_long_outputs(
                run, options.out, model, block=plan.block, formats=plan.formats, tokens=plan.labels
            )
    print_written(written, sizes=True)
    return 0


def _parse_options(args: argparse.Namespace) -> InspectOptions:
    """The options of ``--long`` that need no model, and the output folder.

    Raises:
        CommandError: one of them is wrong, or ``--rows`` or ``--chat`` (options of a text
            read whole).
    """
    if args.rows is not None or args.chat:
        raise CommandError("--rows and --chat are not for --long, which reads the text a window at a time")
    check_long_options(args)
    if args.top < 1:
        raise CommandError(f"--top must be at least 1, got {args.top}")
    formats = parse_formats(args.format, LONG_FORMATS)
    check_long_text(args.text, args.file)
    status = Status(args.quiet)
    limit = parse_size(args.max_size)
    return InspectOptions(formats, limit, {}, prepare_out(args.out), status)


def _run(plan: LongPlan, model: Any, status: Status) -> Any:
    """The long-context summaries of ``plan``'s layers and heads."""
    from attnkit.inspect.long_context import long_context_summaries

    what = f"{counted(len(plan.layers), 'layer')} of {model.name} over {counted(plan.ids.numel(), 'token')}"
    with status.step(f"summarising {what}"):
        return long_context_summaries(
            model,
            plan.ids,
            layers=plan.layers,
            heads=plan.heads,
            top_k=plan.top,
            sink_tokens=plan.sink_tokens,
            window=plan.window,
            map_block=plan.block,
            progress=lambda done, total: status.say(f"  {done}/{total} layers summarised"),
        )
