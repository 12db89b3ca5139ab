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

On a GPU: ``--device cuda`` runs a random checkpoint of TinyLlama-1.1B's shape
(``--shape llama3-8b`` for Llama-3-8B's), written on the card by transformers, in bfloat16,
at 2,048 to 131,072 tokens. Memory is then the most PyTorch's allocator handed out beyond
the loaded weights (``torch.cuda.max_memory_allocated``), time the wall time between two
synchronisations; the results (``bench_long_context_cuda_SHAPE.*``) name the card. ``--only``
picks modes (``--only forward,summaries``) and ``--lengths`` lengths, each run adding its
cells to the earlier ones of the same shape and card, so that a short loan of a GPU can
measure a part. ``--quick --device cpu`` is a dry run of that code on the CPU: a tiny random
shape at 64 and 128 tokens.

``--only statistics`` measures instead every head's statistics of every layer against a plain
forward on a checkpoint of Llama-3-8B's shape, on ``--device`` (CUDA: the fused Triton kernel),
at 32K and 128K tokens by default (``benchmarks/long_context_statistics.py``):
``python benchmarks/bench_long_context.py --only statistics --device cuda --check``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS, benchmark_parser, markdown_table, write_results  # noqa: E402
from benchmarks.random_llama import SHAPES, text_of, write_checkpoint  # noqa: E402

LENGTHS = (2048, 8192, 32768)
# The lengths of a run on a GPU and of a dry run (--quick).
DEVICE_LENGTHS = (2048, 8192, 32768, 131072)
QUICK_LENGTHS = (64, 128)
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
        help=f"tokens, comma-separated (default {','.join(map(str, LENGTHS))}; with --device cuda "
        f"{','.join(map(str, DEVICE_LENGTHS))}; with --only statistics 32768,131072)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="a random checkpoint of this shape instead of --model (default on a GPU: tinyllama; with --only "
        "statistics: llama3-8b)",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="(default: bfloat16 on a GPU)")
    parser.add_argument(
        "--only",
        default=None,
        metavar="MODES",
        help=f"the modes to run, comma-separated, of {','.join(MODES)}; or statistics (below)",
    )
    parser.add_argument("--quick", action="store_true", help="a dry run: the tiny random shape at 64 and 128 tokens")
    parser.add_argument("--cache", type=Path, default=None, help="folder of the random checkpoints of the modes")
    parser.add_argument("--out", metavar="DIR", help="write the results here instead of benchmarks/results")
    parser.add_argument(
        "--recipe-budget",
        type=float,
        default=None,
        metavar="GIB",
        help="run the recipe only where its maps stay below this (default: 4; on a GPU the card's memory less 1)",
    )
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="children run at once (default: 1)")
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "MODE", "TOKENS"), help=argparse.SUPPRESS)
    statistics = parser.add_argument_group(
        "--only statistics", "every head's statistics against a plain forward on a random checkpoint"
    )
    statistics.add_argument(
        "--checkpoint", metavar="DIR", help="where the checkpoint is written once (default: a temp dir)"
    )
    statistics.add_argument("--check", action="store_true", help="first compare the kernel with float64 on the device")
    statistics.add_argument("--sweep", action="store_true", help="also time one layer under a few launch settings")
    return parser


def run_cell(model_name: str, mode: str, tokens: int, *, device: str = "cpu", dtype: str | None = None) -> dict:
    """One measurement, in this (child) process: time and peak memory growth of ``mode``.
    ``model_name`` is a known name or a checkpoint folder; a random checkpoint reads the
    words ``w1 w2 ...``, a real model :data:`TEXT`. On the CPU ``seconds`` is processor
    time (one thread); on a GPU the wall time between two synchronisations."""
    import torch

    from attnkit import models
    from attnkit.inspect.long_context import long_context_summaries
    from benchmarks.common import DeviceMemory

    torch.set_num_threads(1)
    model = models.load(model_name, device=device, **({} if dtype is None else {"dtype": getattr(torch, dtype)}))
    if Path(model_name).is_dir():
        ids = model.tokenize(text_of(tokens, model.config.vocab_size)).ids[0]
    else:
        ids = model.tokenizer.encode(TEXT * (tokens // 20 + 1)).ids[0, :tokens]
    with torch.no_grad():
        model.run(ids[:16], return_weights=False, logits=False)  # warm up
    memory = DeviceMemory(device)
    memory.begin()
    start, cpu_start = time.perf_counter(), time.process_time()
    heads = None
    if mode == "forward":
        model.run(ids, return_weights=False, logits=False)
    elif mode == "summaries":
        heads = long_context_summaries(model, ids, top_k=8, local_statistics=LOCAL_STATISTICS).head_table()
    else:
        model.run(ids, return_weights=True, logits=False)
    peak = memory.peak()  # synchronises on a GPU: the wall time below is the work's
    wall = time.perf_counter() - start
    cell = {
        "seconds": time.process_time() - cpu_start if device == "cpu" else wall,
        "wall_seconds": wall,
        "peak_growth_mib": peak / 2**20,
    }
    return cell if heads is None else {**cell, "heads": heads}


def run_cells(
    name: str, wanted: list[tuple[int, str]], *, jobs: int, options: list[str] = ()
) -> dict[tuple[int, str], dict]:
    """Each ``(tokens, mode)`` of ``wanted`` measured in its own child process, ``jobs`` at once;
    ``options`` (``--device``, ``--dtype``) go to every child."""
    cells: dict[tuple[int, str], dict] = {}
    waiting = list(wanted)
    running: dict[tuple[int, str], subprocess.Popen] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            tokens, mode = waiting.pop(0)
            command = [sys.executable, __file__, "--cell", name, mode, str(tokens), *options]
            running[tokens, mode] = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        for key, child in list(running.items()):
            if child.poll() is None:
                continue
            out, _ = child.communicate()
            if child.returncode:
                raise SystemExit(f"{name} {key[0]} tokens {key[1]}: the child failed (exit {child.returncode})")
            cells[key] = json.loads(out.strip().splitlines()[-1])
            shown = {name: value for name, value in cells[key].items() if name != "heads"}
            print(f"{Path(name).name} {key[0]} tokens {key[1]}: {shown}", flush=True)
            del running[key]
        time.sleep(0.5)
    return cells


def earlier_rows(path: Path, model_name: str, card: str | None) -> list[dict]:
    """The rows saved in ``path`` by an earlier run of ``model_name`` (on the same ``card``),
    so that a run of some lengths or modes joins the table of the others."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if data.get("model") != model_name or data.get("card") != card:
        return []
    return data["rows"]


def merged(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """``earlier`` rows with the cells of ``rows`` put in (a mode measured again replaces the
    earlier cell; one not measured now keeps it), shortest first."""
    by_length = {row["tokens"]: dict(row) for row in earlier}
    for row in rows:
        old = by_length.get(row["tokens"], {})
        by_length[row["tokens"]] = {**old, **{k: v for k, v in row.items() if v is not None or k not in old}}
    return sorted(by_length.values(), key=lambda row: row["tokens"])


def table_row(row: dict) -> list[str]:
    """One line of the Markdown table from a saved row."""
    forward, summaries, recipe = (row.get(mode) for mode in MODES)
    both = forward is not None and summaries is not None
    return [
        f"{row['tokens']:,}",
        _cell_text(forward),
        _cell_text(summaries),
        f"{summaries['seconds'] / forward['seconds']:.2f}x" if both else "–",
        "–" if summaries is None else "yes" if summaries["peak_growth_mib"] <= BUDGET_GIB * 1024 else "no",
        _cell_text(recipe)
        if recipe is not None
        else f"not run: its weights alone are {row['recipe_weights_gib']:,.1f} GiB",
        f"{row['all_logits_gib']:.1f} GiB",
    ]


def _cell_text(cell: dict | None) -> str:
    if cell is None:
        return "not run"
    return f"{cell['seconds']:,.1f} s, {cell['peak_growth_mib']:,.0f} MiB"


def report(name: str, rows: list[dict], card: str | None = None) -> str:
    """The Markdown section of ``rows`` (saved rows of model ``name``, shortest first); on a
    GPU, ``card`` names it."""
    table = [table_row(row) for row in rows]
    if card is not None:
        heading = f"## Long-context summaries on a GPU: {card} ({name})\n\n"
        measured = (
            "Wall time between two synchronisations and the most PyTorch's allocator handed out beyond the loaded "
            "weights (`torch.cuda.max_memory_allocated`). "
        )
    else:
        heading = f"## Long-context summaries ({name})\n\n"
        measured = "Processor time (one thread) and the growth of the peak resident set over the loaded model. "
    return (
        heading
        + measured
        + "Summaries: every head; the global layers' sinks, distances, window mass, entropy and top-8 keys "
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


def _card_gib(device: str) -> float:
    """The memory of the card ``device``, in GiB."""
    import torch

    return torch.cuda.get_device_properties(device).total_memory / 2**30


def default_model() -> str:
    from attnkit import models

    try:
        models.load("gemma3")
    except (ValueError, OSError, KeyError):
        return "smollm2"
    return "gemma3"


def main(argv: list[str] | None = None) -> None:
    parser = arguments()
    args = parser.parse_args(argv)
    if args.cell is not None:
        name, mode, tokens = args.cell
        print(json.dumps(run_cell(name, mode, int(tokens), device=args.device, dtype=args.dtype)))
        return
    if args.only == "statistics":
        from benchmarks import long_context_statistics

        args.shape = args.shape or "llama3-8b"
        if args.shape not in long_context_statistics.SHAPES:
            parser.error(f"--only statistics takes --shape {' or '.join(long_context_statistics.SHAPES)}")
        long_context_statistics.run(args)
        return
    defaults = QUICK_LENGTHS if args.quick else LENGTHS if args.device == "cpu" else DEVICE_LENGTHS
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else list(defaults)
    modes = MODES if args.only is None else tuple(args.only.split(","))
    if any(mode not in MODES for mode in modes):
        parser.error(f"--only takes modes of {', '.join(MODES)}, got {args.only!r}")
    shape = args.shape or ("tiny" if args.quick else "tinyllama" if args.device != "cpu" else None)
    dtype = args.dtype or ("bfloat16" if args.device != "cpu" else None)
    from attnkit import models

    folder = Path()
    if shape is not None:
        cache = args.cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit-benchmarks"
        folder = write_checkpoint(cache, SHAPES[shape], dtype or "float32", tokens=max(lengths), device=args.device)
        name, label, results = str(folder), shape, f"bench_long_context_{args.device.split(':')[0]}_{shape}"
    else:
        name = label = args.model or default_model()
        results = "bench_long_context"
    if shape is not None:
        config = json.loads((folder / "config.json").read_text())
        context, num_layers = config["max_position_embeddings"], config["num_hidden_layers"]
        num_heads, vocab = config["num_attention_heads"], config["vocab_size"]
    else:
        model = models.load(name)
        context, num_layers, num_heads = model.max_length, model.num_layers, model.num_heads
        vocab = model.config.vocab_size
        del model  # the children load their own: this process holds no weights while they run
    budget = args.recipe_budget
    if budget is None:
        budget = BUDGET_GIB if args.device == "cpu" else _card_gib(args.device) - 1
    chosen = [s for s in lengths if s <= context]
    for s in lengths:
        if s > context:
            print(f"{s} tokens: more than {label}'s context of {context}, skipped")
    recipe_gib = {s: num_layers * num_heads * s * s * 4 / 2**30 for s in chosen}
    # The longest first, so that with --jobs the slowest children start at once.
    wanted = [
        (s, mode) for s in sorted(chosen, reverse=True) for mode in modes if mode != "recipe" or recipe_gib[s] <= budget
    ]
    options = ["--device", args.device] + ([] if dtype is None else ["--dtype", dtype])
    cells = run_cells(name, wanted, jobs=args.jobs, options=options)
    rows = [
        {
            "tokens": s,
            **{mode: cells.get((s, mode)) for mode in MODES},
            "recipe_weights_gib": recipe_gib[s],
            "all_logits_gib": s * vocab * 4 / 2**30,
        }
        for s in chosen
    ]
    card = None
    if args.device != "cpu":
        from benchmarks.common import device_name

        card = device_name(args.device)
    folder_out = Path(args.out) if args.out is not None else RESULTS
    rows = merged(earlier_rows(folder_out / f"{results}.json", label, card), rows)
    markdown = report(label, rows, card)
    print(markdown)
    data = {"model": label, "rows": rows, **({} if card is None else {"card": card, "dtype": dtype})}
    if args.out is None:
        write_results(results, data, markdown, update_docs=args.update_docs)
    else:
        folder_out.mkdir(parents=True, exist_ok=True)
        (folder_out / f"{results}.json").write_text(json.dumps(data, indent=2) + "\n")
        (folder_out / f"{results}.md").write_text(markdown.strip() + "\n")


if __name__ == "__main__":
    main()
