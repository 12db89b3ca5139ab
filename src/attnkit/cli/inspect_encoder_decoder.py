"""``attnkit inspect`` on an encoder–decoder: plan
(:func:`attnkit.cli.inspect_plan.plan_encoder_decoder`) → run (one run of the source and the
target, given or generated) → write (the maps of one kind of attention, the viewer page of
all three)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnkit.cli.common import command_errors, print_written
from attnkit.cli.inspect_plan import (
    EncoderDecoderPlan,
    InspectOptions,
    heads_of_each_kind,
    plan_encoder_decoder,
    say_estimates,
)
from attnkit.viz.terminal import terminal_safe


def run_encoder_decoder(args: argparse.Namespace, options: InspectOptions, model: Any) -> int:
    """Plan, run and write ``attnkit inspect`` on the encoder–decoder ``model``."""
    plan = plan_encoder_decoder(args, options, model)
    say_estimates(plan.estimates, plan.said, options.status)
    with command_errors(f"cannot write to --out {args.out}"):
        run = _run(plan, model, options)
        written = _write(plan, run, model, options)
    print_written(written, sizes=True)
    return 0


def _run(plan: EncoderDecoderPlan, model: Any, options: InspectOptions) -> Any:
    """One run of the source and the target (``--decoder-text``, or generated greedily, as
    a printed line says), keeping the layers and heads of ``plan``."""
    what = "the given target" if plan.target is not None else "a greedily generated target"
    with options.status.step(f"running {model.name} on {plan.source_tokens} source tokens and {what}"):
        run = model.run_encoder_decoder(
            plan.source,
            plan.target,
            encoder_layers=plan.stack_layers("encoder"),
            decoder_layers=plan.stack_layers("decoder"),
            heads=heads_of_each_kind(plan.heads, plan.kind, model.heads_per_kind),
            max_new_tokens=plan.new_tokens,
        )
    if run.generated:
        print(
            terminal_safe(
                f"no --decoder-text: {model.name} generated the target greedily "
                f"({len(run.target_tokens)} tokens): {run.target_text!r}"
            )
        )
    return run


def _write(plan: EncoderDecoderPlan, run: Any, model: Any, options: InspectOptions) -> list[Path]:
    """Print the map of each planned layer and write its files, then the viewer page.

    Returns:
        The files written.
    """
    from attnkit.inspect.encoder_decoder import encoder_decoder_map
    from attnkit.viz.attention_text import render_map
    from attnkit.viz.export import write_encoder_decoder_viewer, write_map

    written: list[Path] = []
    files = [f for f in plan.formats if f != "html"]
    for layer in plan.layers:
        amap = encoder_decoder_map(
            model, run, attention=plan.kind, layer=layer, heads=plan.map_heads, level=plan.level, method=plan.method
        )
        print(terminal_safe(render_map(amap, top=plan.top)), end="", flush=True)
        if files:
            with options.status.step(f"writing {', '.join(files)} of layer {layer}"):
                written += write_map(amap, options.out, files, **plan.figure)
    if "html" in plan.formats:
        with options.status.step("writing the viewer page of the encoder, decoder and cross-attention"):
            written.append(write_encoder_decoder_viewer(model, run, options.out, level=plan.level))
    return written
