"""``attnkit inspect`` on a model of one text: plan (:func:`attnkit.cli.inspect_plan.plan_maps`)
→ run (the map of each chosen layer, and the viewer page) → write (the printed maps, their
pictures and JSON, the page)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnkit.cli.common import Status, command_errors, print_written
from attnkit.cli.inspect_plan import InspectOptions, MapsPlan, plan_maps, say_estimates


def run_maps(args: argparse.Namespace, options: InspectOptions, model: Any) -> int:
    """Plan, run and write ``attnkit inspect`` on ``model``."""
    plan = plan_maps(args, options, model)
    say_estimates(plan.estimates, plan.said, options.status)
    with command_errors(f"cannot write to --out {args.out}"):
        # Everything is computed and checked (finite weights) before any file is written.
        maps = _compute_maps(plan, model, options.status)
        page = _compute_page(plan, model, options)
        written = _write_maps(plan, maps, options)
        written += _write_page(plan, page, options.status)
    print_written(written, sizes=True)
    if plan.page is not None and plan.method != "raw" and not plan.page.modes:
        print(
            f"note: the viewer page shows the raw attention weights, not --method {plan.method}, "
            "which is in the terminal view above and the picture and JSON files"
        )
    return 0


def _compute_maps(plan: MapsPlan, model: Any, status: Status) -> list[Any]:
    """The map of each planned layer, each checked to be finite.

    Raises:
        ValueError: a map with NaN or infinite weights (naming its layer).
    """
    from attnkit.inspect.methods import method_map
    from attnkit.viz.export import check_map_finite

    maps = []
    for layer in plan.layers:
        with status.step(f"running {model.name} on {plan.tokens} tokens for layer {layer}"):
            amap = method_map(
                model,
                plan.text,
                method=plan.method,
                layer=layer,
                head=plan.heads,  # only these heads' weights are formed
                level=plan.level,
                target=plan.target,
                rows=plan.rows,
            )
        check_map_finite(amap)
        maps.append(amap)
    return maps


def _compute_page(plan: MapsPlan, model: Any, options: InspectOptions) -> tuple[Path, Any] | None:
    """The viewer page's path and data, computed and checked but not written (``None``
    without html)."""
    if plan.page is None:
        return None
    from attnkit.viz.export import viewer_page

    with options.status.step(f"computing {plan.page.name}"):
        return viewer_page(
            model,
            plan.text,
            options.out,
            level=plan.level,
            layers=plan.page.layers,
            heads=plan.page.heads,
            modes=plan.page.modes,
        )


def _write_maps(plan: MapsPlan, maps: list[Any], options: InspectOptions) -> list[Path]:
    """Print each map and write its files (all formats but html).

    Returns:
        The files written.
    """
    from attnkit.viz.attention_text import render_map
    from attnkit.viz.export import write_map
    from attnkit.viz.terminal import terminal_safe

    written: list[Path] = []
    files = [f for f in plan.formats if f != "html"]
    for amap in maps:
        print(terminal_safe(render_map(amap, top=plan.top)), end="", flush=True)
        if files:
            with options.status.step(f"writing {', '.join(files)} of layer {amap.layer}"):
                written += write_map(amap, options.out, files, **plan.figure)
    return written


def _write_page(plan: MapsPlan, page: tuple[Path, Any] | None, status: Status) -> list[Path]:
    """Write the viewer page computed by :func:`_compute_page`, if any."""
    if plan.page is None or page is None:
        return []
    from attnkit.viz.viewer import write_html

    with status.step(f"writing {plan.page.name}"):
        return [write_html(*page)]
