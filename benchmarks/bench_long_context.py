"""Long-context summaries of a real model against a plain forward pass and the tutorial's
``output_attentions`` recipe: peak memory and time at 2K, 8K and 32K tokens.

Three ways to look at the attention of one long text, each in its own child process:

- ``forward``: the plain forward pass on the fused kernels, no weights, no logits (the
  baseline of the time ratio);
- ``summaries``: :func:`attnkit.inspect.long_context.long_context_summaries` over every head
  of every layer, which never forms an ``[s, s]`` map: every statistic of the global layers
  (sinks, distances, window mass, entropy, top-8 keys of every query) and the distance
  summaries of the sliding-window layers (mean, quantiles, window mass: Gemma 3's local
  layers), which only compute their window;
- ``recipe``: the tutorial's recipe, every layer's ``[h, s, s]`` weights at once
  (``output_attentions=True``; ``Model.run(return_weights=True)`` here). It is run only where
  its weights fit ``--recipe-budget``; past that the table gives the size it would need
  (layers × heads × s² × 4 bytes) instead of running out of memory.

Memory is the growth of the child's peak resident set (``VmHWM``) over what it held once
the model was loaded, so the weights are not counted. The logits of every position, which
neither of the first two computes, are ``s × vocab × 4`` bytes: listed beside. Time is the
child's processor time (one thread): on a shared machine the wall time also counts the time
spent waiting for a core, so the ratio is taken on processor time; wall times are saved too.
``--jobs 2`` runs two children at once (each still on one thread). The summaries' head
table (every head's sink, distances and window mass) is saved with the results.

Run: ``python benchmarks/bench_long_context.py`` (model ``gemma3`` when it is fetched,
``smollm2`` otherwise; the 32K row takes long on a CPU), or ``--lengths 256,512`` for a
quick look.

``--only statistics`` measures instead every head's statistics of every layer against a plain
forward on a checkpoint of Llama-3-8B's shape, on ``--device`` (CUDA: the fused Triton kernel),
at 32K and 128K tokens by default (``benchmarks/long_context_statistics.py``):
``python benchmarks/bench_long_context.py --only statistics --device cuda --check``.
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
# What the summaries compute on sliding-window layers: how far they look.
LOCAL_STATISTICS = ("distance", "window")
# The memory budget of the summaries beyond the weights.
BUDGET_GIB = 4.0


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--model", default=None, help="model name (default: gemma3 if fetched, else smollm2)")
    parser.add_argument(
        "--lengths",
        default=None,
        help=f"tokens, comma-separated (default {','.join(map(str, LENGTHS))}; with --only statistics 32768,131072)",
    )
    parser.add_argument(
        "--recipe-budget", type=float, default=4.0, metavar="GIB", help="run the recipe only below this (default: 4)"
    )
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="children run at once (default: 1)")
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "MODE", "TOKENS"), help=argparse.SUPPRESS)
    statistics = parser.add_argument_group(
        "--only statistics", "every head's statistics against a plain forward on a random checkpoint"
    )
    statistics.add_argument("--only", choices=("statistics",), default=None, help="run only this part")
    statistics.add_argument("--device", default="cpu", help="torch device (default cpu)")
    statistics.add_argument(
        "--shape", choices=("llama3-8b", "tiny"), default="llama3-8b", help="the checkpoint's sizes (default llama3-8b)"
    )
    statistics.add_argument(
        "--checkpoint", metavar="DIR", help="where the checkpoint is written once (default: a temp dir)"
    )
    statistics.add_argument("--check", action="store_true", help="first compare the kernel with float64 on the device")
    statistics.add_argument("--sweep", action="store_true", help="also time one layer under a few launch settings")
    statistics.add_argument("--out", metavar="DIR", help="write the results here instead of benchmarks/results")
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

    torch.set_num_threads(1)
    model = models.load(model_name)
    ids = model.tokenizer.encode(TEXT * (tokens // 20 + 1)).ids[0, :tokens]
    with torch.no_grad():
        model.run(ids[:16], return_weights=False, logits=False)  # warm up
    _reset_peak()
    before = _peak_kib()
    start, cpu_start = time.perf_counter(), time.process_time()
    heads = None
    if mode == "forward":
        model.run(ids, return_weights=False, logits=False)
    elif mode == "summaries":
        heads = long_context_summaries(model, ids, top_k=8, local_statistics=LOCAL_STATISTICS).head_table()
    else:
        model.run(ids, return_weights=True, logits=False)
    cell = {
        "seconds": time.process_time() - cpu_start,
        "wall_seconds": time.perf_counter() - start,
        "peak_growth_mib": (_peak_kib() - before) / 1024,
    }
    return cell if heads is None else {**cell, "heads": heads}


def run_cells(name: str, wanted: list[tuple[int, str]], *, jobs: int) -> dict[tuple[int, str], dict]:
    """Each ``(tokens, mode)`` of ``wanted`` measured in its own child process, ``jobs`` at once."""
    cells: dict[tuple[int, str], dict] = {}
    waiting = list(wanted)
    running: dict[tuple[int, str], subprocess.Popen] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            tokens, mode = waiting.pop(0)
            command = [sys.executable, __file__, "--cell", name, mode, str(tokens)]
            running[tokens, mode] = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        for key, child in list(running.items()):
            if child.poll() is None:
                continue
            out, _ = child.communicate()
            if child.returncode:
                raise SystemExit(f"{name} {key[0]} tokens {key[1]}: the child failed (exit {child.returncode})")
            cells[key] = json.loads(out.strip().splitlines()[-1])
            shown = {name: value for name, value in cells[key].items() if name != "heads"}
            print(f"{name} {key[0]} tokens {key[1]}: {shown}", flush=True)
            del running[key]
        time.sleep(0.5)
    return cells


def earlier_rows(name: str, measured: list[int]) -> list[dict]:
    """The rows of ``name`` at other lengths than ``measured`` from the results already saved,
    so that a long row measured alone joins the table of the shorter ones."""
    from benchmarks.common import RESULTS

    saved = RESULTS / "bench_long_context.json"
    if not saved.exists():
        return []
    data = json.loads(saved.read_text())
    if data.get("model") != name:
        return []
    return [row for row in data["rows"] if row["tokens"] not in measured]


def table_row(row: dict) -> list[str]:
    """One line of the Markdown table from a saved row."""
    forward, summaries, recipe = (row[mode] for mode in MODES)
    return [
        f"{row['tokens']:,}",
        _cell_text(forward),
        _cell_text(summaries),
        f"{summaries['seconds'] / forward['seconds']:.2f}x",
        "yes" if summaries["peak_growth_mib"] <= BUDGET_GIB * 1024 else "no",
        _cell_text(recipe)
        if recipe is not None
        else f"not run: its weights alone are {row['recipe_weights_gib']:,.1f} GiB",
        f"{row['all_logits_gib']:.1f} GiB",
    ]


def _cell_text(cell: dict) -> str:
    return f"{cell['seconds']:,.1f} s, {cell['peak_growth_mib']:,.0f} MiB"


def report(name: str, rows: list[dict]) -> str:
    """The Markdown section of ``rows`` (saved rows of model ``name``, shortest first)."""
    table = [table_row(row) for row in rows]
    return (
        f"## Long-context summaries ({name})\n\n"
        "Processor time (one thread) and the growth of the peak resident set over the loaded model. "
        "Summaries: every head; the global layers' sinks, distances, window mass, entropy and top-8 keys "
        "of every query, the sliding-window layers' distances and window mass. The recipe holds "
        "layers × heads × s² × 4 bytes of weights at once.\n\n"
        + markdown_table(
            [
                "tokens",
                "forward",
                "summaries",
                "time ratio",
                f"within weights + {BUDGET_GIB:.0f} GiB",
                "output_attentions recipe",
                "logits of every position",
            ],
            table,
        )
    )


def default_model() -> str:
    from attnkit import models

    try:
        models.load("gemma3")
    except (ValueError, OSError, KeyError):
        return "smollm2"
    return "gemma3"


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    if args.cell is not None:
        name, mode, tokens = args.cell
        print(json.dumps(run_cell(name, mode, int(tokens))))
        return
    if args.only == "statistics":
        from benchmarks import long_context_statistics

        long_context_statistics.run(args)
        return
    lengths = [int(x) for x in (args.lengths or ",".join(map(str, LENGTHS))).split(",")]
    from attnkit import models

    name = args.model or default_model()
    model = models.load(name)
    context, num_layers, num_heads, vocab = model.max_length, model.num_layers, model.num_heads, model.config.vocab_size
    del model  # the children load their own: this process holds no weights while they run
    chosen = [s for s in lengths if s <= context]
    for s in lengths:
        if s > context:
            print(f"{s} tokens: more than {name}'s context of {context}, skipped")
    recipe_gib = {s: num_layers * num_heads * s * s * 4 / 2**30 for s in chosen}
    # The longest first, so that with --jobs the slowest children start at once.
    wanted = [
        (s, mode)
        for s in sorted(chosen, reverse=True)
        for mode in MODES
        if mode != "recipe" or recipe_gib[s] <= args.recipe_budget
    ]
    cells = run_cells(name, wanted, jobs=args.jobs)
    rows = [
        {
            "tokens": s,
            **{mode: cells.get((s, mode)) for mode in MODES},
            "recipe_weights_gib": recipe_gib[s],
            "all_logits_gib": s * vocab * 4 / 2**30,
        }
        for s in chosen
    ]
    rows = sorted(rows + earlier_rows(name, chosen), key=lambda row: row["tokens"])
    markdown = report(name, rows)
    print(markdown)
    write_results("bench_long_context", {"model": name, "rows": rows}, markdown, update_docs=args.update_docs)


if __name__ == "__main__":
    main()
