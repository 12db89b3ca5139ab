"""Long-context summaries of a real model against a plain forward pass and the tutorial's
``output_attentions`` recipe: peak memory and time at 2K, 8K and 32K tokens.

Three ways to look at the attention of one long text, each in its own child process:

- ``forward``: the plain forward pass on the fused kernels, no weights, no logits (the
  baseline of the time ratio);
- ``summaries``: :func:`attnkit.inspect.long_context.long_context_summaries` over every layer
  and head (sinks, distances, window mass, entropy, top-8 keys of every query), which never
  forms an ``[s, s]`` map (sliding-window layers only compute their window);
- ``recipe``: the tutorial's recipe, every layer's ``[h, s, s]`` weights at once
  (``output_attentions=True``; ``Model.run(return_weights=True)`` here). It is run only where
  its weights fit ``--recipe-budget``; past that the table gives the size it would need
  (layers × heads × s² × 4 bytes) instead of running out of memory.

Memory is the growth of the child's peak resident set (``VmHWM``) over what it held once
the model was loaded, so the weights are not counted. The logits of every position, which
neither of the first two computes, are ``s × vocab × 4`` bytes: listed beside.

Run: ``python benchmarks/bench_long_context.py`` (model ``gemma3`` when it is fetched,
``smollm2`` otherwise; the 32K row takes long on a CPU), or ``--lengths 256,512`` for a
quick look.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser, markdown_table, write_results  # noqa: E402

LENGTHS = (2048, 8192, 32768)
TEXT = (
    "The river bends past the old mill, where farmers bring their grain each autumn. Children play by the "
    "water while the wheel turns slowly; the village keeps its market on Saturdays. "
)
MODES = ("forward", "summaries", "recipe")


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--model", default=None, help="model name (default: gemma3 if fetched, else smollm2)")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="tokens, comma-separated")
    parser.add_argument(
        "--recipe-budget", type=float, default=4.0, metavar="GIB", help="run the recipe only below this (default: 4)"
    )
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "MODE", "TOKENS"), help=argparse.SUPPRESS)
    return parser


def _peak_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def run_cell(model_name: str, mode: str, tokens: int) -> dict:
    """One measurement, in this (child) process: time and peak memory growth of ``mode``."""
    import torch

    from attnkit import models
    from attnkit.inspect.long_context import long_context_summaries

    model = models.load(model_name)
    ids = model.tokenizer.encode(TEXT * (tokens // 20 + 1)).ids[0, :tokens]
    with torch.no_grad():
        model.run(ids[:16], return_weights=False, logits=False)  # warm up
    _reset_peak()
    before = _peak_kib()
    start = time.perf_counter()
    if mode == "forward":
        model.run(ids, return_weights=False, logits=False)
    elif mode == "summaries":
        long_context_summaries(model, ids, top_k=8)
    else:
        model.run(ids, return_weights=True, logits=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_growth_mib": (_peak_kib() - before) / 1024}


def default_model() -> str:
    from attnkit import models

    try:
        models.load("gemma3")
    except (ValueError, OSError, KeyError):
        return "smollm2"
    return "gemma3"


def main() -> None:
    args = arguments().parse_args()
    if args.cell is not None:
        name, mode, tokens = args.cell
        print(json.dumps(run_cell(name, mode, int(tokens))))
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    from attnkit import models

    name = args.model or default_model()
    model = models.load(name)
    rows, table = [], []
    for s in lengths:
        if s > model.max_length:
            print(f"{s} tokens: more than {name}'s context of {model.max_length}, skipped")
            continue
        recipe_gib = model.num_layers * model.num_heads * s * s * 4 / 2**30
        logits_gib = s * model.config.vocab_size * 4 / 2**30
        cells = {}
        for mode in MODES:
            if mode == "recipe" and recipe_gib > args.recipe_budget:
                cells[mode] = None
                continue
            out = subprocess.run(
                [sys.executable, __file__, "--cell", name, mode, str(s)], check=True, capture_output=True, text=True
            )
            cells[mode] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{name} {s} tokens {mode}: {cells[mode]}", flush=True)
        forward, summaries, recipe = cells["forward"], cells["summaries"], cells["recipe"]
        rows.append({"tokens": s, **cells, "recipe_weights_gib": recipe_gib, "all_logits_gib": logits_gib})
        table.append(
            [
                str(s),
                f"{forward['seconds']:.1f} s, {forward['peak_growth_mib']:.0f} MiB",
                f"{summaries['seconds']:.1f} s, {summaries['peak_growth_mib']:.0f} MiB",
                f"{summaries['seconds'] / forward['seconds']:.2f}x",
                f"{recipe['seconds']:.1f} s, {recipe['peak_growth_mib']:.0f} MiB"
                if recipe is not None
                else f"not run: its weights alone are {recipe_gib:.2f} GiB, over --recipe-budget",
                f"{logits_gib:.2f} GiB",
            ]
        )
    markdown = (
        f"## Long-context summaries ({name})\n\n"
        "Peak memory is the growth over the loaded model. Summaries: every layer and head, top-8 keys.\n\n"
        + markdown_table(
            ["tokens", "forward", "summaries", "time ratio", "output_attentions recipe", "logits of every position"],
            table,
        )
    )
    print(markdown)
    write_results("bench_long_context", {"model": name, "rows": rows}, markdown, update_docs=args.update_docs)


if __name__ == "__main__":
    main()
