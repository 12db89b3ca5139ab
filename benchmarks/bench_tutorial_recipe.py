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

CONTENDERS = {
    "tutorial": "the tutorial's code (eager, output_attentions=True)",
    "attnkit": "attnkit, one map asked for",
    "plain": "transformers sdpa, no maps (the floor)",
}
DTYPES = ("float32", "bfloat16")
# Forward passes timed after the first one on texts up to this length (the median is the
# time: a 7-token pass takes about a second, which another process on a shared machine
# easily doubles, so one or two passes decide nothing); a longer text is timed once.
SHORT = 256
WARM_RUNS = 5


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tokens", default="7,2000", help="text lengths in tokens, comma-separated (default 7,2000)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of float32,bfloat16")
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
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


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        args.token_counts = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens must be whole numbers separated by commas, got {args.tokens!r}")
    if not args.token_counts or min(args.token_counts) < 1:
        parser.error(f"--tokens must be at least 1, got {args.tokens!r}")
    args.dtype_names = args.dtypes.split(",")
    unknown = [d for d in args.dtype_names if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes must be of {', '.join(DTYPES)}, got {', '.join(unknown)}")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error(
            f"--hidden must be a multiple of --heads and --heads of --kv-heads, got {args.hidden}, {args.heads}, "
            f"{args.kv_heads}"
        )
    if max(args.token_counts) >= args.vocab:
        parser.error(f"--tokens must stay below --vocab ({args.vocab}): the text is the words w1, w2, ...")
    if args.join is not None and not args.render:
        parser.error("--join adds the rows of another run to the results when rendering them: give --render too")
    if args.join is not None and not args.join.is_file():
        parser.error(f"--join needs another run's results file, got {str(args.join)!r}, which is not a file")


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    _parser = arguments()
    _check(_parser, _parser.parse_args())


def text_of(length: int) -> str:
    """A text of ``length`` tokens of the word-level tokenizer."""
    return " ".join(f"w{i}" for i in range(1, length + 1))


# --- one contender, in its own process ---------------------------------------------------


def child(args: argparse.Namespace) -> dict:
    """Load the model as ``args.child`` does, run its forward pass, and measure."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    text = text_of(args.length)
    start = time.perf_counter()
    if args.child == "attnkit":
        from attnkit import models

        model = models.load(args.folder, dtype=dtype)
        ids = model.tokenize(text).ids

        def forward() -> torch.Tensor:
            return model.run(ids, return_weights=[-1], heads=[0]).attentions[-1][0, 0]
    else:
        import transformers

        implementation = "eager" if args.child == "tutorial" else "sdpa"
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            args.folder, dtype=dtype, attn_implementation=implementation
        ).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.folder)
        ids = tokenizer(text, return_tensors="pt").input_ids

        def forward() -> torch.Tensor:
            with torch.no_grad():
                if args.child == "tutorial":
                    return hf(ids, output_attentions=True).attentions[-1][0, 0]
                return hf(ids).logits

    loaded = time.perf_counter()
    processor = time.process_time()
    result = forward()
    first = time.perf_counter() - loaded
    first_cpu = time.process_time() - processor
    warm, warm_cpu = [], []
    if args.length <= SHORT:
        for _ in range(WARM_RUNS):
            again, processor = time.perf_counter(), time.process_time()
            forward()
            warm.append(time.perf_counter() - again)
            warm_cpu.append(time.process_time() - processor)
    tokens = int(ids.shape[1])
    expected = (tokens, tokens) if args.child != "plain" else (1, tokens, args_vocab(folder=args.folder))
    if tokens != args.length or tuple(result.shape) != expected:
        raise RuntimeError(f"{args.child} read {tokens} tokens and gave {tuple(result.shape)}, expected {expected}")
    return {
        "tokens": tokens,
        "load_s": loaded - start,
        "first_s": first,
        "warm_s": statistics.median(warm) if warm else None,
        "first_cpu_s": first_cpu,
        "warm_cpu_s": statistics.median(warm_cpu) if warm_cpu else None,
        "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "threads": torch.get_num_threads(),
    }


def args_vocab(folder: Path) -> int:
    """The vocabulary size of the checkpoint in ``folder``."""
    return int(json.loads((folder / "config.json").read_text())["vocab_size"])


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
    """The random TinyLlama-shaped checkpoint in ``dtype_name``, written once."""
    shape = shape_of(args)
    name = "tinyllama-shaped-" + "-".join(f"{k}{v}" for k, v in shape.items()) + f"-{dtype_name}"
    folder = args.cache / name
    done = folder / "written.json"
    if done.is_file():
        return folder
    import torch
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tokenizer_models

    log(f"writing {folder} (once) …")
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=2048 if max(args.token_counts) <= 2048 else max(args.token_counts),
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype_name))
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    del model
    words = [f"w{i}" for i in range(args.vocab - 1)] + ["[UNK]"]
    tokenizer = Tokenizer(tokenizer_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.save_pretrained(partial)
    (partial / "written.json").write_text(json.dumps(shape) + "\n")
    os.replace(partial, folder)
    return folder


# --- the parent: every cell, each contender in a child -----------------------------------


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, or ``None`` where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def estimated_peak(args: argparse.Namespace, contender: str, dtype_name: str, tokens: int) -> int:
    """A generous estimate of a contender's peak: weights, the maps it keeps (every layer's
    for the tutorial's code), one layer's scores and weights while they are computed, the
    logits, and a gigabyte for the rest."""
    size = 2 if dtype_name == "bfloat16" else 4
    d = args.hidden // args.heads
    params = args.vocab * args.hidden * 2 + args.layers * (
        args.hidden * (args.heads + 2 * args.kv_heads) * d + args.hidden * args.hidden + 3 * args.hidden * args.ffn
    )
    one_layer = args.heads * tokens * tokens * size
    kept = (args.layers if contender == "tutorial" else 1) * one_layer
    return params * size + kept + 2 * one_layer + tokens * args.vocab * 4 + 2**30


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
    ]
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
            for contender in CONTENDERS:
                need, free = estimated_peak(args, contender, dtype_name, tokens), available_bytes()
                if free is not None and need > free:
                    row["contenders"][contender] = {
                        "skipped": f"needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
                    }
                    log(f"{dtype_name} {tokens} tokens {contender}: skipped, {row['contenders'][contender]['skipped']}")
                else:
                    cell = run_child(args, contender, folder, dtype_name, tokens)
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
        "Every figure here is the CPU's: the script runs on the CPU only, and no GPU was at hand for this run, so "
        "bfloat16 on CUDA, where it is the native precision, is not in the table."
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


def results_file(args: argparse.Namespace) -> Path:
    from benchmarks.common import RESULTS

    return (args.out if args.out is not None else RESULTS) / "tutorial_recipe.json"


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

        from benchmarks.common import environment as environment_now

        environment = environment_now()
        data = {
            "shape": shape_of(args),
            "dtypes": args.dtype_names,
            "tokens": args.token_counts,
            "warm_runs": WARM_RUNS,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(),
            "complete": False,
            "rows": [],
        }
        load_start = os.getloadavg()[0]

        def save(rows: list[dict]) -> None:
            data["rows"] = rows
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
