"""The ``--only statistics`` part of ``bench_long_context.py``: every head's long-context
statistics of every layer against a plain forward pass, on any device (a GPU above all), on
a checkpoint of Llama-3-8B's shape with random weights.

transformers writes the checkpoint itself (its ``LlamaConfig`` with Llama-3-8B's sizes: 32
layers, 32 query heads, 8 key/value heads, head dim 128, 131,072 positions as Llama 3.1;
random weights made on the device in bfloat16, ``save_pretrained``) with a word-level
``tokenizer.json``, once per ``--checkpoint`` folder; attnkit loads it in bfloat16. Random
weights measure time and memory, not what the statistics show.

For each length, in one process: a plain forward pass (``Model.run``, no weights, no logits)
and :func:`attnkit.inspect.long_context.long_context_summaries` with ``top_k=8`` over every
head of every layer, head table included (the whole inspection: its own forward pass and the
statistics), on the fused Triton kernel on CUDA (the torch engine elsewhere), each timed
between two synchronisations, alternating, after a warm-up that compiles the kernel (its
time is reported apart). *statistics* is the inspection's time beyond the forward pass. Up to
:data:`TORCH_ENGINE_UP_TO` tokens the torch engine is timed too. Memory is the peak beyond
what the loaded model held (``torch.cuda.max_memory_allocated`` on CUDA).

``--check`` first compares the kernel on the device with the torch engine in float64 on the
same inputs (bfloat16 and float32 queries and keys; causal, sliding-window, soft-capped and
bidirectional layers, grouped-query heads; every statistic), then the kernel's summaries of
two layers of the loaded model with float64 ones of the same queries and keys. ``--sweep``
times one layer at the first length under a few launch settings of the kernel.

    python benchmarks/bench_long_context.py --only statistics --device cuda --check
    python benchmarks/bench_long_context.py --only statistics --device cpu --shape tiny --lengths 64,128 --out DIR
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attnkit import models
from attnkit.inspect.long_context import LayerScoring, long_context_summaries, summarize_layer, summary_engine
from benchmarks.common import RESULTS, environment, markdown_table, write_results

# Model sizes of transformers' LlamaConfig.
SHAPES: dict[str, dict[str, int]] = {
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 4096,
    },
}
LENGTHS = (32768, 131072)
# The torch engine is timed up to this length (on a GPU it takes minutes beyond it).
TORCH_ENGINE_UP_TO = 32768
TOP_K = 8
# Largest error allowed by --check, relative to the largest reference value of each statistic,
# and the least share of queries whose top keys must agree (near ties may swap).
CHECK_TOLERANCE = 1e-4
CHECK_AGREEMENT = 0.999
CHECKED = ("sink", "distance", "within_window", "entropy", "distance_mass", "top_weights", "block_max", "block_mean")
IN_INPUT_DTYPE = ("top_weights", "block_max", "block_mean")
# Launch settings of --sweep: (rows, keys, warps, stages).
SWEEP = ((64, 64, 8, 2), (64, 64, 8, 3), (64, 64, 4, 2), (32, 64, 4, 2), (16, 64, 4, 2), (64, 128, 8, 2))
# Words of the checkpoint's tokenizer: those of the texts `attnkit heads --stat retrieval` uses.
RETRIEVAL_TEXTS = ("needle", "question", "filler")


def run(args: Any) -> dict:
    """The statistics part as ``bench_long_context.py`` parsed it: returns what it saved."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_long_context --only statistics: no CUDA device here; nothing measured")
        return {}
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else list(LENGTHS)
    for s in lengths:
        check_fits(s, args.shape)
    engine = summary_engine("auto", torch.empty(0, dtype=torch.bfloat16, device=device))
    data: dict = {
        "device": device_name(device),
        "engine": engine,
        "shape": args.shape,
        "dtype": "bfloat16",
        "lengths": lengths,
        "rows": [],
    }
    if args.check:
        data["check"] = check_kernel(device)
        print(json.dumps({"check": data["check"]}), flush=True)
    folder = write_checkpoint(args.shape, Path(args.checkpoint) if args.checkpoint else None, device)
    data["checkpoint"] = str(folder)
    start = time.perf_counter()
    model = models.load(folder, dtype=torch.bfloat16, device=device)
    data["load_seconds"] = time.perf_counter() - start
    if args.check:
        data["check_model"] = check_model(model, min(lengths[0], 4096))
        print(json.dumps({"check_model": data["check_model"]}), flush=True)
    data["first_call_seconds"] = warm_up(model, min(lengths[0], 1024))
    for s in lengths:
        row = measure(model, s, device, torch_engine=s <= TORCH_ENGINE_UP_TO)
        print(json.dumps(row), flush=True)
        data["rows"].append(row)
    if args.sweep:
        data["sweep"] = sweep(model, lengths[0], device)
    save(data, Path(args.out) if args.out else None, update_docs=args.update_docs)
    return data


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def write_checkpoint(shape: str, folder: Path | None, device: torch.device) -> Path:
    """The folder of a random checkpoint of ``shape`` written by transformers (kept when it
    is there already): ``folder``, or one in the system's temporary directory."""
    import tempfile

    import transformers
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as token_models

    from attnkit.inspect import retrieval_heads

    folder = folder or Path(tempfile.gettempdir()) / f"attnkit-bench-{shape}"
    if (folder / "config.json").exists():
        return folder
    sizes = SHAPES[shape]
    config = transformers.LlamaConfig(**sizes, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device), torch.no_grad():
            network = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    network.save_pretrained(folder)
    del network
    texts = [getattr(retrieval_heads, f"DEFAULT_{what.upper()}") for what in RETRIEVAL_TEXTS]
    from benchmarks.bench_long_context import TEXT

    words = sorted({word for text in (*texts, TEXT) for word in text.split()})
    vocabulary = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(words[: sizes["vocab_size"] - 1])}}
    tokenizer = Tokenizer(token_models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (folder / "tokenizer.json").write_text(tokenizer.to_str())
    return folder


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ids(model: models.Model, s: int) -> torch.Tensor:
    return torch.randint(1, model.config.vocab_size, (s,), generator=torch.Generator().manual_seed(s))


def warm_up(model: models.Model, s: int) -> float:
    """Seconds of a first forward and summaries of ``s`` tokens (compiling the kernel)."""
    device = next(model.module.parameters()).device
    ids = _ids(model, s)
    start = time.perf_counter()
    with torch.no_grad():
        model.run(ids, return_weights=False, logits=False)
    long_context_summaries(model, ids, top_k=TOP_K).head_table()
    _sync(device)
    return time.perf_counter() - start


def _timed(device: torch.device, fn: Any) -> tuple[float, float]:
    """Seconds of ``fn()`` between two synchronisations, and its peak memory in GiB beyond
    what was allocated before (CUDA; 0 elsewhere)."""
    _sync(device)
    base = 0
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30 if device.type == "cuda" else 0.0
    return seconds, peak


def measure(model: models.Model, s: int, device: torch.device, *, torch_engine: bool) -> dict:
    """One length: the plain forward and the whole inspection, alternating (two rounds up to
    :data:`TORCH_ENGINE_UP_TO` tokens, one beyond), and the torch engine's inspection."""
    ids = _ids(model, s)

    def forward() -> None:
        with torch.no_grad():
            model.run(ids, return_weights=False, logits=False)

    def inspection(engine: str) -> None:
        long_context_summaries(model, ids, top_k=TOP_K, engine=engine).head_table()

    times: dict[str, list[tuple[float, float]]] = {"forward": [], "inspection": []}
    for _ in range(2 if s <= TORCH_ENGINE_UP_TO else 1):
        times["forward"].append(_timed(device, forward))
        times["inspection"].append(_timed(device, lambda: inspection("auto")))
    row: dict = {"tokens": s}
    for what, samples in times.items():
        row[f"{what}_seconds"] = statistics.median(t for t, _ in samples)
        row[f"{what}_peak_gib"] = max(m for _, m in samples)
    row["statistics_seconds"] = row["inspection_seconds"] - row["forward_seconds"]
    row["statistics_ratio"] = row["statistics_seconds"] / row["forward_seconds"]
    if torch_engine:
        row["torch_engine_seconds"], row["torch_engine_peak_gib"] = _timed(device, lambda: inspection("torch"))
    return row


def _random_qk(h: int, h_kv: int, s: int, d: int, dtype: torch.dtype, device: torch.device, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = 2.5 * torch.randn(h, s, d, generator=g)
    k = torch.randn(h_kv, s, d, generator=g)
    return q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype)


def compare(got: Any, want: Any) -> dict:
    """Errors of summary ``got`` against ``want``: each statistic's largest error relative to
    the largest reference value, and the share of queries whose top keys are the same. The
    weights a summary keeps in the inputs' dtype (top weights, the block map) are allowed that
    dtype's rounding."""
    errors: dict = {}
    ok = True
    rounding = torch.finfo(got.top_weights.dtype).eps
    for name in CHECKED:
        a, b = getattr(got, name), getattr(want, name)
        if a is not None and b is not None:
            b = b.double().to(a.device)
            errors[name] = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))
            ok &= errors[name] <= max(CHECK_TOLERANCE, rounding if name in IN_INPUT_DTYPE else 0.0)
    same = (got.top_keys == want.top_keys.to(got.top_keys.device)).all(-1)
    errors["top_keys_agree"] = float(same.double().mean())
    errors["ok"] = bool(ok and errors["top_keys_agree"] >= CHECK_AGREEMENT)
    return errors


def check_kernel(
    device: torch.device,
    *,
    s: int = 3000,
    d: int = 128,
    heads: int = 8,
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32),
) -> list[dict]:
    """The kernel (``engine="triton"``) against the torch engine in float64 on the same
    inputs of each of ``dtypes``: ``heads`` query heads of the layers of :func:`check_layers`."""
    rows = []
    for dtype in dtypes:
        for seed, (what, scoring, group) in enumerate(check_layers(s, d)):
            q, k = _random_qk(heads, max(1, heads // group), s, d, dtype, device, seed)
            options: dict = dict(top_k=TOP_K, window=256, sink_tokens=4, map_block=s // 12)
            got = summarize_layer(q, k, scoring, engine="triton", **options)
            want = summarize_layer(q.double(), k.double(), scoring, engine="torch", **options)
            rows.append({"dtype": str(dtype).removeprefix("torch."), "layer": what, **compare(got, want)})
    return rows


def check_layers(s: int, d: int) -> list[tuple[str, LayerScoring, int]]:
    """(what, scoring, query heads per key/value head) of the layers :func:`check_kernel`
    compares (a group larger than the heads: one key/value head)."""
    scale = d**-0.5
    return [
        ("causal, 4 query heads per key head", LayerScoring(scale=scale), 4),
        ("causal, sliding window, soft-capped", LayerScoring(scale=scale, window=s // 5, softcap=8.0), 1),
        ("bidirectional, one key head", LayerScoring(scale=scale, causal=False), 64),
        ("bidirectional, window", LayerScoring(scale=scale, window=s // 7, causal=False), 2),
    ]


def check_model(model: models.Model, s: int) -> list[dict]:
    """The first and last layers of ``model`` over ``s`` tokens: the kernel's summaries (from
    the hooked queries and keys, as a real run takes them) against float64 ones."""
    layers = [0, model.num_layers - 1]
    run = long_context_summaries(model, _ids(model, s), layers=layers, top_k=TOP_K, keep_qk=True)
    rows = []
    for layer in layers:
        q, k = run.kept_qk[layer]
        want = summarize_layer(q.double(), k.double(), run.scorings[layer], top_k=TOP_K, engine="torch")
        rows.append({"layer": layer, **compare(run.summaries[layer], want)})
    return rows


def sweep(model: models.Model, s: int, device: torch.device) -> list[dict]:
    """One layer's statistics at ``s`` tokens (the last layer's queries and keys) under each
    launch setting of :data:`SWEEP`: seconds (median of three after one that compiles)."""
    from attnkit.inspect.long_context_triton import LaunchSettings, layer_statistics

    layer = model.num_layers - 1
    run = long_context_summaries(model, _ids(model, s), layers=[layer], top_k=1, keep_qk=True, statistics=("top",))
    q, k = run.kept_qk[layer]
    scoring = run.scorings[layer]
    heads = torch.arange(q.shape[0], device=device)
    rows_t = torch.arange(s, device=device)
    out = []
    for block_rows, block_keys, warps, stages in SWEEP:
        launch = LaunchSettings(block_rows, block_keys, warps, stages)

        def call() -> None:
            layer_statistics(
                q, k, heads, rows_t, factor=scoring.query_factor, softcap=scoring.softcap, causal=scoring.causal,
                window=scoring.window, top_k=TOP_K, sink_tokens=1, near=256, second_pass=True, histogram=True,
                map_block=None, launch=launch,
            )  # fmt: skip

        row: dict = {"block_rows": block_rows, "block_keys": block_keys, "num_warps": warps, "num_stages": stages}
        try:
            call()
            row["seconds"] = statistics.median(_timed(device, call)[0] for _ in range(3))
        except Exception as error:  # a setting that does not compile or fit: recorded, not fatal
            row["error"] = f"{type(error).__name__}: {error}"[:300]
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def report(data: dict) -> str:
    """The Markdown section of the statistics part."""
    rows = []
    for row in data["rows"]:
        torch_engine = row.get("torch_engine_seconds")
        rows.append(
            [
                f"{row['tokens']:,}",
                f"{row['forward_seconds']:.2f} s",
                f"{row['inspection_seconds']:.2f} s, {row['inspection_peak_gib']:.1f} GiB",
                f"{row['statistics_seconds']:.2f} s ({row['statistics_ratio']:.2f}x)",
                "not run" if torch_engine is None else f"{torch_engine:.1f} s",
            ]
        )
    text = (
        f"## Long-context statistics on {data['device']} ({data['shape']}, bfloat16, {data['engine']} engine)\n\n"
        "Every head of every layer: sinks, distances (mean and quantiles), window mass, entropy and top-8 keys "
        "of every query (`long_context_summaries(model, ids, top_k=8)` with its head table), on random weights "
        "written by transformers. The inspection includes its own forward pass; *statistics* is its time "
        "beyond the plain forward, and the ratio divides that by the forward's time. "
        f"First call (compiles the kernel): {data['first_call_seconds']:.1f} s.\n\n"
        + markdown_table(
            ["tokens", "plain forward", "whole inspection, peak beyond the weights", "statistics", "torch engine"],
            rows,
        )
    )
    checks = data.get("check", []) + data.get("check_model", [])
    if checks:
        worst = max(max(v for k, v in row.items() if k in CHECKED and k not in IN_INPUT_DTYPE) for row in checks)
        agree = min(row["top_keys_agree"] for row in checks)
        passed = "all pass" if all(row["ok"] for row in checks) else "SOME FAIL"
        text += (
            f"\n\nThe kernel against float64 (`--check`, {len(checks)} cases, {passed}): largest relative error "
            f"of the float64 statistics {worst:.1e}, top keys the same on at least {agree:.2%} of the queries."
        )
    return text


def save(data: dict, out: Path | None, *, update_docs: bool) -> None:
    """``long_context_statistics.{json,md}`` in ``out``, or in benchmarks/results."""
    name = "long_context_statistics"
    if out is None or out == RESULTS:
        write_results(name, data, report(data), update_docs=update_docs)
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"environment": environment(), **data}, indent=2) + "\n")
    (out / f"{name}.md").write_text(report(data) + "\n")


def check_fits(s: int, shape: str) -> None:
    """Refuse lengths past the shape's positions, before anything is written."""
    positions = SHAPES[shape]["max_position_embeddings"]
    if s > positions:
        raise SystemExit(f"--lengths: {s} tokens are more than the {positions} positions of --shape {shape}")
