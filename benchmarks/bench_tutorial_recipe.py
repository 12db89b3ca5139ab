"""The tutorial's recipe side by side: one attention map (last layer, head 0) of a
TinyLlama-shaped model, by the tutorial's code (transformers, eager attention,
``output_attentions=True``), by attnkit (only that map asked for, every other layer on the
fused path), and a plain transformers forward with sdpa attention as the floor; wall time
and peak memory of each, in float32 and bfloat16, at 7 and about 2,000 tokens.

The model has TinyLlama-1.1B's shape (transformers' ``LlamaConfig``: 22 layers, hidden size
2048, 32 heads, 4 key-value heads, feed-forward 5632, vocabulary 32000) and random weights,
written once into ``--cache`` (about 6.6 GB: one folder per dtype) with a word-level
tokenizer. Each contender runs in a process of its own, which loads the model, runs one
forward pass (short texts: then five more, and the median of those is the time), and
reports its peak resident set (``ru_maxrss``): a process's peak is all the memory it ever
held, weights included. Load time is reported apart. Each pass's processor time (every
thread of the process) is recorded beside its wall time: on a machine shared with other
work, wall time swings with the other load and processor time much less, so the table
gives the attnkit ÷ plain ratio of both. The results file is rewritten after every
contender, so a run stopped early keeps what it measured; ``--render`` rebuilds the table
from it without measuring anything.

Run alone: ``python benchmarks/bench_tutorial_recipe.py`` (the full configuration needs
about 18 GB of free memory for the tutorial's code at 2,000 tokens in float32, 6.6 GB of
disk, and half an hour or more on two cores: each process loads transformers or attnkit and
a 1.1B-parameter model, and a 2,000-token forward pass takes about a minute); a quick look
at a smaller model, in a few minutes:
``--layers 2 --hidden 256 --heads 8 --kv-heads 2 --ffn 704 --vocab 1000 --tokens 7,256``.
A configuration whose estimated peak exceeds the memory available now is skipped and
marked so in the table.

On a GPU: ``--device cuda`` (bfloat16, at 2,048, 8,192, 32,768 and 131,072 tokens by
default; ``--shape llama3-8b`` for Llama-3-8B's shape) writes the checkpoint on the card
and loads every contender there. Memory is then the peak that PyTorch's allocator handed
out beyond the loaded weights (``torch.cuda.max_memory_allocated``), time the median of
three passes after a first one (each between two synchronisations), and no contender
computes the logits (at 131,072 tokens those of every position alone are 8 GB in
bfloat16): the tutorial's code is ``model.model(ids, output_attentions=True)``, the floor
``model.model(ids)``. Where a contender would not fit the card (the tutorial's code keeps
every layer's maps: 112 GB at 8,192 tokens of TinyLlama's shape) the table says so and
why. ``--only`` and ``--lengths`` measure a subset, each run adding its rows to the results
of the same shape and card (``tutorial_recipe_cuda_SHAPE.json``), so that a short loan of
a GPU can run one part and the next loan another; ``--rows A:B`` has attnkit form those
query rows of its map only (the rows of a 131,072-token map on a card without room for
its 64 GiB). ``--quick --device cpu`` is a dry run of the same code on the CPU, in
seconds: a tiny shape at 7 and 64 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402
from benchmarks.random_llama import SHAPES, parameter_count, text_of, write_checkpoint  # noqa: E402

CONTENDERS = {
    "tutorial": "the tutorial's code (eager, output_attentions=True)",
    "attnkit": "attnkit, one map asked for",
    "plain": "transformers sdpa, no maps (the floor)",
}
DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")
# What a run measures unless told: on the CPU, float32 and bfloat16 at 7 and about 2,000
# tokens; on a GPU, bfloat16 at 2K to 128K tokens; a dry run (--quick), two short texts.
DEFAULT_TOKENS = {"cpu": "7,2000", "cuda": "2048,8192,32768,131072", "quick": "7,64"}
DEFAULT_DTYPES = {"cpu": "float32,bfloat16", "cuda": "bfloat16", "quick": "float32"}
# Passes timed after the first on a GPU (the first compiles and warms the card's kernels).
DEVICE_RUNS = 3
# Targets on a GPU: attnkit's one map within these of the plain forward's time, and its
# memory within the plain forward's plus this share of the map's bytes.
DEVICE_TIME_TARGET = 1.2
DEVICE_MAP_TARGET = 1.1
# Forward passes timed after the first one on texts up to this length (the median is the
# time: a 7-token pass takes about a second, which another process on a shared machine
# easily doubles, so one or two passes decide nothing); a longer text is timed once.
SHORT = 256
WARM_RUNS = 5


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--tokens",
        "--lengths",
        dest="tokens",
        default=None,
        help=f"text lengths in tokens, comma-separated (default {DEFAULT_TOKENS['cpu']}; "
        f"with --device cuda {DEFAULT_TOKENS['cuda']})",
    )
    parser.add_argument(
        "--dtypes",
        default=None,
        help=f"comma-separated, of float32,bfloat16 (default {DEFAULT_DTYPES['cpu']}; with --device cuda "
        f"{DEFAULT_DTYPES['cuda']})",
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where the contenders run (default cpu)")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="the model's shape (default tinyllama; tiny with --quick); --layers and the others below change it",
    )
    parser.add_argument("--quick", action="store_true", help="a dry run: the tiny shape at 7 and 64 tokens")
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help=f"the contenders to run, comma-separated, of {','.join(CONTENDERS)} (default all)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        metavar="A:B",
        help="the query rows of attnkit's map (from 0, negative from the end; default every row)",
    )
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--ffn", type=int, default=None)
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="folder for the random checkpoints (default: $XDG_CACHE_HOME or ~/.cache, then attnkit-benchmarks)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads in every child (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="write the results here instead of benchmarks/results/")
    parser.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: rebuild the table from the results file (benchmarks/results/, or --out) as it is, "
        "also after a run that was stopped early",
    )
    parser.add_argument(
        "--join",
        type=Path,
        metavar="RESULTS",
        help="with --render: add the rows of another run's results file (the same model shape) to the results "
        "file, replacing its rows of the same dtype and length; the notes say which rows came from which run",
    )
    parser.add_argument("--child", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", choices=DTYPES, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    return parser


def _row_slice(spec: str | None) -> slice | None:
    """``--rows A:B`` as a slice of the tokens; ``None`` for every row.

    Raises:
        ValueError: not ``A:B``.
    """
    if spec is None:
        return None
    start, colon, stop = spec.partition(":")
    if not colon:
        raise ValueError(spec)
    return slice(int(start) if start.strip() else None, int(stop) if stop.strip() else None)


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    mode = "quick" if args.quick else args.device
    shape = SHAPES[args.shape or ("tiny" if args.quick else "tinyllama")]
    for key, value in shape.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.tokens = args.tokens or DEFAULT_TOKENS[mode]
    args.dtypes = args.dtypes or DEFAULT_DTYPES[mode]
    try:
        args.token_counts = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens must be whole numbers separated by commas, got {args.tokens!r}")
    if not args.token_counts or min(args.token_counts) < 1:
        parser.error(f"--tokens must be at least 1, got {args.tokens!r}")
    args.contenders = list(CONTENDERS) if args.only is None else args.only.split(",")
    unknown = [c for c in args.contenders if c not in CONTENDERS]
    if unknown:
        parser.error(f"--only takes contenders of {', '.join(CONTENDERS)}, got {', '.join(unknown)}")
    try:
        args.row_slice = _row_slice(args.rows)
    except ValueError:
        parser.error(f"--rows takes the query rows as A:B (either side may be left out), got {args.rows!r}")
    args.dtype_names = args.dtypes.split(",")
    unknown = [d for d in args.dtype_names if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes must be of {', '.join(DTYPES)}, got {', '.join(unknown)}")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error(
            f"--hidden must be a multiple of --heads and --heads of --kv-heads, got {args.hidden}, {args.heads}, "
            f"{args.kv_heads}"
        )
    if args.join is not None and not args.render:
        parser.error("--join adds the rows of another run to the results when rendering them: give --render too")
    if args.join is not None and not args.join.is_file():
        parser.error(f"--join needs another run's results file, got {str(args.join)!r}, which is not a file")


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    _parser = arguments()
    _check(_parser, _parser.parse_args())


# --- one contender, in its own process ---------------------------------------------------


def child(args: argparse.Namespace) -> dict:
    """Load the model as ``args.child`` does, run its forward pass, and measure."""
    import torch

    from benchmarks.common import DeviceMemory

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    config = json.loads((args.folder / "config.json").read_text())
    text = text_of(args.length, int(config["vocab_size"]))
    # On the CPU every contender computes the logits, as the tutorial's code does; on a GPU
    # none does (those of every position of a long text would outweigh the map).
    logits = args.device == "cpu"
    start = time.perf_counter()
    if args.child == "attnkit":
        from attnkit import models

        model = models.load(args.folder, dtype=dtype, device=args.device)
        ids = model.tokenize(text).ids

        def forward() -> torch.Tensor:
            run = model.run(ids, return_weights=[-1], heads=[0], rows=args.row_slice, logits=logits)
            return run.attentions[-1][0, 0]
    else:
        hf, ids = _transformers_model(args, dtype, text)

        def forward() -> torch.Tensor:
            with torch.no_grad():
                if args.child == "tutorial":
                    return (hf if logits else hf.model)(ids, output_attentions=True).attentions[-1][0, 0]
                return hf(ids).logits if logits else hf.model(ids).last_hidden_state

    loaded = time.perf_counter()
    loading_peak = _process_peak(args.device)  # the count below restarts from what is held now
    memory = DeviceMemory(args.device)
    memory.begin()
    first, first_cpu, shape = _timed(forward, args.device)
    warm, warm_cpu = [], []
    runs = DEVICE_RUNS if args.device != "cpu" else WARM_RUNS if args.length <= SHORT else 0
    for _ in range(runs):
        seconds, processor, _ = _timed(forward, args.device)
        warm.append(seconds)
        warm_cpu.append(processor)
    tokens = int(ids.shape[1])
    rows = len(range(tokens)[args.row_slice]) if args.child == "attnkit" and args.row_slice else tokens
    width = int(config["vocab_size"] if logits else config["hidden_size"])
    expected = (rows, tokens) if args.child != "plain" else (1, tokens, width)
    if tokens != args.length or shape != expected:
        raise RuntimeError(f"{args.child} read {tokens} tokens and gave {shape}, expected {expected}")
    return {
        "tokens": tokens,
        "rows": rows,
        "load_s": loaded - start,
        "first_s": first,
        "warm_s": statistics.median(warm) if warm else None,
        "first_cpu_s": first_cpu,
        "warm_cpu_s": statistics.median(warm_cpu) if warm_cpu else None,
        "peak_bytes": max(loading_peak, _process_peak(args.device)),
        "beyond_weights_bytes": memory.peak(),
        "threads": torch.get_num_threads(),
    }


def _transformers_model(args: argparse.Namespace, dtype: object, text: str) -> tuple:
    """``(model, ids)`` of transformers on ``args.device``: eager attention for the
    tutorial's code, sdpa for the floor."""
    import transformers

    implementation = "eager" if args.child == "tutorial" else "sdpa"
    options: dict = {"dtype": dtype, "attn_implementation": implementation}
    if args.device != "cpu":
        options["device_map"] = args.device  # straight onto the card (accelerate)
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.folder, **options).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.folder)
    return hf, tokenizer(text, return_tensors="pt").input_ids.to(args.device)


def _timed(forward, device: str) -> tuple[float, float, tuple[int, ...]]:
    """``(wall seconds, processor seconds, result shape)`` of one pass; on a GPU between two
    synchronisations. The result is dropped before the next pass."""
    import torch

    if device != "cpu":
        torch.cuda.synchronize(device)
    wall, processor = time.perf_counter(), time.process_time()
    shape = tuple(forward().shape)
    if device != "cpu":
        torch.cuda.synchronize(device)
    return time.perf_counter() - wall, time.process_time() - processor, shape


def _process_peak(device: str) -> int:
    """The process's peak: its resident set on the CPU (``ru_maxrss``), what PyTorch's
    allocator handed out at most on a GPU (weights included)."""
    if device == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    import torch

    return int(torch.cuda.max_memory_allocated(device))


# --- the checkpoint ----------------------------------------------------------------------


def shape_of(args: argparse.Namespace) -> dict:
    return {
        "layers": args.layers,
        "hidden": args.hidden,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "ffn": args.ffn,
        "vocab": args.vocab,
    }


def checkpoint(args: argparse.Namespace, dtype_name: str, log) -> Path:
    """The random checkpoint of the chosen shape in ``dtype_name``, written once (on the
    device the contenders run on)."""
    return write_checkpoint(
        args.cache, shape_of(args), dtype_name, tokens=max(args.token_counts), device=args.device, log=log
    )


# --- the parent: every cell, each contender in a child -----------------------------------


def available_bytes(device: str = "cpu") -> int | None:
    """The memory a child may have: on the CPU ``MemAvailable`` of /proc/meminfo (``None``
    where there is none); on a GPU the card's memory, less a gigabyte for PyTorch's own."""
    if device != "cpu":
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory) - 2**30
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def estimated_peak(args: argparse.Namespace, contender: str, dtype_name: str, tokens: int) -> int:
    """A generous estimate of a contender's peak: weights, the maps it keeps (every layer's
    for the tutorial's code; the rows asked of one head's, in float32, for attnkit), one
    layer's scores and weights while the tutorial's code computes them, the logits (on the
    CPU), the layer's activations, and a gigabyte for the rest."""
    size = 2 if dtype_name == "bfloat16" else 4
    one_layer = args.heads * tokens * tokens * size
    if contender == "tutorial":
        maps = args.layers * one_layer + 2 * one_layer
    elif contender == "attnkit":
        rows = len(range(tokens)[args.row_slice]) if args.row_slice else tokens
        maps = rows * tokens * 4
    else:
        maps = 0
    logits = tokens * args.vocab * 4 if args.device == "cpu" else 0
    activations = 4 * tokens * (args.hidden + args.ffn) * size
    return parameter_count(shape_of(args)) * size + maps + logits + activations + 2**30


def skip_reason(args: argparse.Namespace, contender: str, dtype_name: str, tokens: int) -> str | None:
    """Why a contender is not run, or ``None``: its estimated peak is over the memory there is."""
    need, free = estimated_peak(args, contender, dtype_name, tokens), available_bytes(args.device)
    if free is None or need <= free:
        return None
    if args.device == "cpu":
        return f"needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
    where = "GB on the card"
    if contender == "tutorial":
        size = 2 if dtype_name == "bfloat16" else 4
        maps = args.layers * args.heads * tokens * tokens * size
        return f"needs about {need / 1e9:.1f} GB (every layer's maps: {maps / 1e9:.1f} GB), {free / 1e9:.1f} {where}"
    return f"needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} {where}" + (
        "; fewer rows (--rows) fit" if contender == "attnkit" else ""
    )


def run_child(args: argparse.Namespace, contender: str, folder: Path, dtype_name: str, tokens: int) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        contender,
        "--folder",
        str(folder),
        "--dtype",
        dtype_name,
        "--length",
        str(tokens),
        "--device",
        args.device,
    ]
    if args.rows is not None:
        command.append(f"--rows={args.rows}")
    if args.threads:
        command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} ({dtype_name}, {tokens} tokens) failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_of(cell: dict) -> float:
    """The forward time a cell is compared by: the warm median, or the one pass."""
    return cell["warm_s"] if cell["warm_s"] is not None else cell["first_s"]


def processor_time_of(cell: dict) -> float | None:
    """The processor time of the same pass (or median) as :func:`time_of`; ``None`` in
    results recorded before processor time was."""
    if "first_cpu_s" not in cell:
        return None
    return cell["warm_cpu_s"] if cell["warm_s"] is not None else cell["first_cpu_s"]


def measure(args: argparse.Namespace, log, save) -> list[dict]:
    """Every cell, each contender in a child; ``save(rows)`` after each contender."""
    rows: list[dict] = []
    for dtype_name in args.dtype_names:
        folder = checkpoint(args, dtype_name, log)
        for tokens in args.token_counts:
            row: dict = {"dtype": dtype_name, "tokens": tokens, "contenders": {}}
            rows.append(row)
            for contender in args.contenders:
                reason = skip_reason(args, contender, dtype_name, tokens)
                if reason is not None:
                    row["contenders"][contender] = {"skipped": reason}
                    log(f"{dtype_name} {tokens} tokens {contender}: skipped, {reason}")
                else:
                    cell = {**run_child(args, contender, folder, dtype_name, tokens), "date": time.strftime("%Y-%m-%d")}
                    row["contenders"][contender] = cell
                    log(
                        f"{dtype_name} {tokens} tokens {contender}: {time_of(cell):.3f} s "
                        f"(processor {processor_time_of(cell):.3f} s), peak {cell['peak_bytes'] / 1e9:.2f} GB "
                        f"(load {cell['load_s']:.1f} s)"
                    )
                save(rows)
    return rows


def ratios(row: dict) -> dict[str, float]:
    """attnkit ÷ plain in ``row``: time, processor time and memory, where both were measured."""
    plain, ours = row["contenders"].get("plain", {}), row["contenders"].get("attnkit", {})
    if "peak_bytes" not in plain or "peak_bytes" not in ours:
        return {}
    found = {"time": time_of(ours) / time_of(plain), "memory": ours["peak_bytes"] / plain["peak_bytes"]}
    ours_cpu, plain_cpu = processor_time_of(ours), processor_time_of(plain)
    if ours_cpu is not None and plain_cpu is not None:
        found["processor time"] = ours_cpu / plain_cpu
    return found


def markdown(data: dict) -> str:
    """The section of docs/benchmarks.md: the table of ``data`` (the results file) and what
    it shows."""
    if data.get("device", "cpu") != "cpu":
        return device_markdown(data)
    rows = data["rows"]
    headers = ["dtype", "tokens"]
    for contender in CONTENDERS:
        headers += [f"{contender} s", f"{contender} GB"]
    headers += ["attnkit ÷ plain, time", "attnkit ÷ plain, processor time", "attnkit ÷ plain, memory"]
    table = []
    for row in rows:
        cells = [row["dtype"], str(row["tokens"])]
        for contender in CONTENDERS:
            cell = row["contenders"].get(contender)
            if cell is None:
                cells += ["not run", "not run"]
            elif "skipped" in cell:
                cells += ["skipped", cell["skipped"]]
            else:
                cells += [f"{time_of(cell):.3f}", f"{cell['peak_bytes'] / 1e9:.2f}"]
        found = ratios(row)
        cells += [f"{found[key]:.2f}×" if key in found else "–" for key in ("time", "processor time", "memory")]
        table.append(cells)
    from benchmarks.common import markdown_table

    shape = data["shape"]
    threads = next((c["threads"] for r in rows for c in r["contenders"].values() if "threads" in c), "?")
    text = (
        "## The tutorial's recipe (bench_tutorial_recipe.py)\n\n"
        "One attention map (last layer, head 0) of a model of TinyLlama-1.1B's shape with random weights "
        f"({shape['layers']} layers, hidden {shape['hidden']}, {shape['heads']} heads, {shape['kv_heads']} key-value "
        f"heads, feed-forward {shape['ffn']}, vocabulary {shape['vocab']}). Each contender runs in its own process: "
        + "; ".join(f"**{name}**: {label}" for name, label in CONTENDERS.items())
        + ". Time: one forward pass after loading (texts up to "
        f"{SHORT} tokens: the median of {data.get('warm_runs', WARM_RUNS)} more); processor time: the same passes' "
        "time on every thread of the process, which other work on a shared machine lengthens far less than wall "
        "time; memory: the process's peak resident set (`ru_maxrss`), weights included. "
        f"{threads} threads. Target: attnkit within 1.1× the plain forward's time and 1.15× its memory.\n\n"
        + markdown_table(headers, table)
    )
    return text + "".join(f"\n\n{note}" for note in notes(data))


def notes(data: dict) -> list[str]:
    """What the table shows beyond its cells: the machine's load, bfloat16 against float32,
    cells not reached, and the device."""
    found = []
    load = data.get("load_average_1min")
    if load:
        found.append(
            f"The machine's load (1-minute load average, {data.get('cores', '?')} cores): {load['start']:.1f} at the "
            f"start of this run and {load['end']:.1f} at its end."
        )
    for run in data.get("joined_runs", []):
        rows = ", ".join(f"{dtype_name} at {tokens} tokens" for dtype_name, tokens in run["rows"])
        load = run.get("load_average_1min")
        found.append(
            f"Measured in another run ({run.get('date') or 'date unknown'}"
            + (f"; load {load['start']:.1f} at its start and {load['end']:.1f} at its end" if load else "")
            + f"): {rows}. The ratios within a row compare contenders of the same run."
        )
    plain = {
        (row["dtype"], row["tokens"]): row["contenders"]["plain"]
        for row in data["rows"]
        if "peak_bytes" in row["contenders"].get("plain", {})
    }
    slower = []
    for (dtype_name, tokens), cell in plain.items():
        base = plain.get(("float32", tokens))
        if dtype_name == "bfloat16" and base is not None:
            ours, theirs = processor_time_of(cell), processor_time_of(base)
            by = (ours / theirs) if ours is not None and theirs is not None else time_of(cell) / time_of(base)
            slower.append(f"{by:.1f}× at {tokens} tokens")
    if slower:
        capability = data.get("cpu_capability")
        found.append(
            "bfloat16 against float32 on the CPU, the plain forward's "
            + ("processor " if all(processor_time_of(c) is not None for c in plain.values()) else "")
            + "time, bfloat16 ÷ float32: "
            + ", ".join(slower)
            + " (rows measured minutes apart on a shared machine: a looser comparison than attnkit ÷ plain within a "
            "row). A short text's pass is bound by reading the weights, which bfloat16 halves; a longer text's by "
            "the matrix products, which PyTorch runs natively in bfloat16 on the CPU only with AVX-512 BF16 or AMX "
            "instructions"
            + (f" (this machine's `torch.backends.cpu.get_cpu_capability()`: {capability})" if capability else "")
            + ". Without them every product converts its operands to float32 and back: bfloat16 then halves the "
            "weights' memory and multiplies a longer text's time, for the three contenders alike, and float32 is "
            "the faster choice for long texts."
        )
    found += target_notes(data["rows"])
    missing = [
        f"{row['dtype']} at {row['tokens']} tokens ({', '.join(c for c in CONTENDERS if c not in row['contenders'])})"
        for row in data["rows"]
        if any(c not in row["contenders"] for c in CONTENDERS)
    ]
    missing += [
        f"{dtype_name} at {tokens} tokens"
        for dtype_name in data.get("dtypes", [])
        for tokens in data.get("tokens", [])
        if not any(row["dtype"] == dtype_name and row["tokens"] == tokens for row in data["rows"])
    ]
    if missing:
        found.append(f"Not measured (the run was stopped before them): {'; '.join(missing)}.")
    found.append(
        "Every figure here is the CPU's; bfloat16 on CUDA, where it is the native precision, has a table of its "
        "own (`--device cuda`), with the card it ran on."
    )
    return found


def target_notes(rows: list[dict]) -> list[str]:
    """Whether attnkit met the targets (1.1× the plain forward's time, 1.15× its memory) in
    the rows where both ran, by processor time and by wall time."""
    measured = [(row, ratios(row)) for row in rows if ratios(row)]
    if not measured:
        return []

    def missed(key: str, limit: float) -> list[str]:
        return [
            f"{row['dtype']} at {row['tokens']} tokens ({found[key]:.2f}×)"
            for row, found in measured
            if key in found and round(found[key], 2) > limit  # as the table shows it
        ]

    by_processor, by_wall, by_memory = missed("processor time", 1.1), missed("time", 1.1), missed("memory", 1.15)
    sentences = [
        "Targets: memory "
        + (f"above 1.15× in {', '.join(by_memory)}" if by_memory else "within 1.15× in every row measured")
        + "; processor time "
        + (f"above 1.1× in {', '.join(by_processor)}" if by_processor else "within 1.1× in every row measured")
        + "; wall time "
        + (f"above 1.1× in {', '.join(by_wall)}" if by_wall else "within 1.1× in every row measured")
        + "."
    ]
    if by_wall and not by_processor:
        sentences.append(
            "Where only the wall time is above, the processes' own work was within the target and the difference is "
            "the time they waited for the machine's other work."
        )
    return [" ".join(sentences)]


def map_bytes(row: dict) -> int:
    """The bytes of the map attnkit was asked for in ``row``: its rows × keys × 4 (float32)."""
    cell = row["contenders"].get("attnkit", {})
    return 4 * cell.get("rows", row["tokens"]) * row["tokens"]


def device_ratios(row: dict) -> dict[str, float]:
    """On a GPU, where attnkit and the floor both ran: attnkit's time ÷ the floor's, and the
    memory attnkit took beyond the floor's, as a share of its map's bytes."""
    plain, ours = row["contenders"].get("plain", {}), row["contenders"].get("attnkit", {})
    if "beyond_weights_bytes" not in plain or "beyond_weights_bytes" not in ours:
        return {}
    extra = ours["beyond_weights_bytes"] - plain["beyond_weights_bytes"]
    return {"time": time_of(ours) / time_of(plain), "map": extra / map_bytes(row)}


def device_markdown(data: dict) -> str:
    """The section of docs/benchmarks.md of a run on a GPU: time and memory beyond the
    weights of each contender at each length, attnkit against the floor, and the targets."""
    from benchmarks.common import markdown_table

    headers = ["dtype", "tokens", "map GB"]
    for contender in CONTENDERS:
        headers += [f"{contender} s", f"{contender} GB"]
    headers += ["attnkit ÷ plain, time", "attnkit − plain, ÷ map"]
    table = []
    for row in data["rows"]:
        cells = [row["dtype"], f"{row['tokens']:,}", f"{map_bytes(row) / 1e9:.2f}"]
        for contender in CONTENDERS:
            cell = row["contenders"].get(contender)
            if cell is None:
                cells += ["not run", "not run"]
            elif "skipped" in cell:
                cells += ["skipped", cell["skipped"]]
            else:
                cells += [f"{time_of(cell):.3f}", f"{cell['beyond_weights_bytes'] / 1e9:.2f}"]
        found = device_ratios(row)
        cells += [f"{found['time']:.2f}×", f"{found['map']:.2f}×"] if found else ["–", "–"]
        table.append(cells)
    shape = data["shape"]
    dates = sorted({c["date"] for r in data["rows"] for c in r["contenders"].values() if "date" in c})
    text = (
        f"## The tutorial's recipe on a GPU: {data['card']} (bench_tutorial_recipe.py --device {data['device']})\n\n"
        f"One attention map (last layer, head 0) of a model with random weights ({shape['layers']} layers, hidden "
        f"{shape['hidden']}, {shape['heads']} heads, {shape['kv_heads']} key-value heads, feed-forward {shape['ffn']}, "
        f"vocabulary {shape['vocab']}), loaded on the card. "
        + "; ".join(f"**{name}**: {label}" for name, label in CONTENDERS.items())
        + f". Time: the median of {data.get('warm_runs', DEVICE_RUNS)} passes after a first one, each between two "
        "synchronisations; memory (GB): the most PyTorch's allocator handed out during the passes beyond the loaded "
        "weights (`torch.cuda.max_memory_allocated`). No contender computes the logits. Map GB: the float32 map "
        "attnkit was asked for (rows × keys × 4 bytes). "
        f"Targets: attnkit within {DEVICE_TIME_TARGET}× the plain forward's time, and its memory within the plain "
        f"forward's plus {DEVICE_MAP_TARGET}× the map's bytes (the last column). torch {data.get('torch', '?')}"
        + (f"; measured {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "") if dates else "")
        + ".\n\n"
        + markdown_table(headers, table)
    )
    missed = [
        f"{row['dtype']} at {row['tokens']:,} tokens"
        for row in data["rows"]
        if (found := device_ratios(row))
        and (round(found["time"], 2) > DEVICE_TIME_TARGET or round(found["map"], 2) > DEVICE_MAP_TARGET)
    ]
    measured = [row for row in data["rows"] if device_ratios(row)]
    if measured:
        text += "\n\nTargets: " + (
            f"missed in {', '.join(missed)}." if missed else "met in every row where attnkit and the floor both ran."
        )
    sliced = [
        f"{cell['rows']:,} of {row['tokens']:,} at {row['tokens']:,} tokens"
        for row in data["rows"]
        if (cell := row["contenders"].get("attnkit", {})).get("rows", row["tokens"]) != row["tokens"]
    ]
    if sliced:
        text += " Rows of attnkit's map asked (--rows): " + "; ".join(sliced) + "."
    return text


def results_file(args: argparse.Namespace) -> Path:
    """``tutorial_recipe.json`` on the CPU; on a GPU ``tutorial_recipe_cuda_SHAPE.json``, one
    file per shape (``custom`` for one given by --layers and the others)."""
    from benchmarks.common import RESULTS

    folder = args.out if args.out is not None else RESULTS
    if args.device == "cpu":
        return folder / "tutorial_recipe.json"
    label = next((name for name, dims in SHAPES.items() if dims == shape_of(args)), "custom")
    return folder / f"tutorial_recipe_{args.device}_{label}.json"


def merged_rows(earlier: list[dict], new: list[dict]) -> list[dict]:
    """The rows of an earlier run of the same shape on the same card with the cells measured
    now put in (a cell measured again replaces the earlier one), sorted by dtype and length."""
    rows = {(row["dtype"], row["tokens"]): {**row, "contenders": dict(row["contenders"])} for row in earlier}
    for row in new:
        key = (row["dtype"], row["tokens"])
        rows.setdefault(key, {"dtype": row["dtype"], "tokens": row["tokens"], "contenders": {}})
        rows[key]["contenders"].update(row["contenders"])
    order = {name: i for i, name in enumerate(DTYPES)}
    return sorted(rows.values(), key=lambda row: (order.get(row["dtype"], len(order)), row["tokens"]))


def joined(data: dict, other: dict, source: str) -> dict:
    """``data`` (a results file, without its environment) with the rows of ``other`` (another
    run's results file) added, replacing the rows of the same dtype and length.

    Raises:
        ValueError: the two runs measured models of different shapes.
    """
    if other.get("shape") != data.get("shape"):
        raise ValueError(f"{source} measured the shape {other.get('shape')}, these results {data.get('shape')}")
    keys = {(row["dtype"], row["tokens"]) for row in other["rows"]}
    rows = [row for row in data["rows"] if (row["dtype"], row["tokens"]) not in keys] + other["rows"]
    order = {name: i for i, name in enumerate(DTYPES)}
    rows.sort(key=lambda row: (order.get(row["dtype"], len(order)), row["tokens"]))
    run = {
        "rows": sorted([list(key) for key in keys], key=lambda key: (order.get(key[0], len(order)), key[1])),
        "date": other.get("environment", {}).get("date"),
        "load_average_1min": other.get("load_average_1min"),
    }
    return {**data, "rows": rows, "joined_runs": [*data.get("joined_runs", []), run]}


def _earlier_rows(path: Path, data: dict) -> list[dict]:
    """The rows of the results in ``path`` when they measured the same shape on the same card."""
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    same = saved.get("shape") == data["shape"] and saved.get("card") == data["card"]
    return saved.get("rows", []) if same else []


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    _check(parser, args)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    path = results_file(args)
    if args.render:
        if not path.is_file():
            parser.error(f"--render needs the results file {path}, which does not exist: run the benchmark first")
        data = json.loads(path.read_text())
        environment = data.pop("environment", {})
        if args.join is not None:
            try:
                data = joined(data, json.loads(args.join.read_text()), str(args.join))
            except ValueError as error:
                parser.error(str(error))
            path.write_text(json.dumps({"environment": environment, **data}, indent=2) + "\n")
    else:
        if args.cache is None:
            args.cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit-benchmarks"
        args.cache.mkdir(parents=True, exist_ok=True)
        import torch

        from benchmarks.common import device_name
        from benchmarks.common import environment as environment_now

        environment = environment_now()
        data = {
            "shape": shape_of(args),
            "dtypes": args.dtype_names,
            "tokens": args.token_counts,
            "warm_runs": WARM_RUNS if args.device == "cpu" else DEVICE_RUNS,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(),
            "complete": False,
            "rows": [],
        }
        earlier: list[dict] = []
        if args.device != "cpu":
            data |= {"device": args.device, "card": device_name(args.device), "torch": torch.__version__}
            earlier = _earlier_rows(path, data)
        load_start = os.getloadavg()[0]

        def save(rows: list[dict]) -> None:
            data["rows"] = merged_rows(earlier, rows) if earlier else rows
            data["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0]}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"environment": environment, **data}, indent=2) + "\n")

        def log(text: str) -> None:
            print(text, file=sys.stderr, flush=True)

        save(measure(args, log, save))
        data["complete"] = True
        save(data["rows"])
    text = markdown(data)
    print(text)
    path.with_suffix(".md").write_text(text + "\n")
    if args.update_docs and args.out is None:
        from benchmarks.common import rebuild_report

        rebuild_report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
