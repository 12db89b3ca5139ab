"""The bridge: a model attnkit has no family for, run through ``transformers``' modules with
attnkit's attention function, against ``transformers``' own SDPA forward of the same weights,
in the same process and on the same threads.

For each architecture (``--arch``, default ``olmo2`` and ``mixtral``) a random checkpoint is
written by ``transformers`` with its own config class (8 layers, hidden size 512, 8 query
heads of 64 dims, 4 key/value heads, vocabulary 8000; Mixtral with 4 experts, 2 per token),
then timed on a text of ``LENGTH`` random tokens (default 512), float32, one thread,
interleaved rounds (``REPEAT``, default 9) of the thread's CPU time:

- ``transformers sdpa``: ``model(ids)``, logits of every position, no maps;
- ``bridge, plain run``: :meth:`attnkit.models.Model.run` with ``return_weights=False``;
- ``bridge, one layer's map``: ``run`` with ``return_weights=[-1]`` (the last layer's weights).

A ratio is the median over rounds of (bridge time / transformers time)
(:func:`benchmarks.common.paired_ratio`): below 1 means the bridge is faster. Results go to
``benchmarks/results/bridge.{json,md}``. Run alone: ``python benchmarks/bench_bridge.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402

_SIZES = {
    "vocab_size": 8000,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
_EXTRA = {"mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2}}


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--arch",
        action="append",
        help="a model_type without an attnkit family (repeatable; default olmo2 and mixtral)",
    )
    return parser


def _write(model_type: str, folder: Path) -> None:
    """A random checkpoint of ``model_type`` with a word-level tokenizer (the benchmark feeds ids)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **_SIZES, **_EXTRA.get(model_type, {}))
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    words = [f"w{i}" for i in range(_SIZES["vocab_size"] - 1)] + ["[UNK]"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[-1]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (folder / "tokenizer.json").write_text(backend.to_str())


def bench_arch(model_type: str, length: int, repeat: int) -> dict:
    """Time one architecture (module docstring)."""
    import torch
    import transformers

    from attnkit import models
    from benchmarks.common import interleaved_samples, paired_ratio

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"random-{model_type}"
        _write(model_type, folder)
        ours = models.load(folder)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    ids = torch.randint(0, _SIZES["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits
    got = ours.run(ids, return_weights=False).logits
    difference = float((got - expected).abs().max() / expected.abs().max())

    def transformers_sdpa() -> None:
        with torch.no_grad():
            hf(ids)

    samples = interleaved_samples(
        {
            "transformers_sdpa": transformers_sdpa,
            "bridge_plain": lambda: ours.run(ids, return_weights=False),
            "bridge_one_map": lambda: ours.run(ids, return_weights=[-1]),
        },
        repeat=repeat,
        clock=time.thread_time,
    )
    return {
        "arch": model_type,
        "family": ours.family,
        "tokens": length,
        "times_s": {name: statistics.median(ts) for name, ts in samples.items()},
        "samples_s": samples,
        "plain_ratio": paired_ratio(samples["bridge_plain"], samples["transformers_sdpa"]),
        "one_map_ratio": paired_ratio(samples["bridge_one_map"], samples["transformers_sdpa"]),
        "relative_logit_difference": difference,
    }


def main(argv: list[str] | None = None) -> dict:
    args = arguments().parse_args(argv or [])
    import torch

    from benchmarks.common import markdown_table, write_results

    torch.set_num_threads(1)
    length = int(os.environ.get("LENGTH", "512"))
    repeat = int(os.environ.get("REPEAT", "9"))
    rows = []
    for model_type in args.arch or ["olmo2", "mixtral"]:
        r = bench_arch(model_type, length, repeat)
        rows.append(r)
        t = r["times_s"]
        print(
            f"{r['family']}, {length} tokens, 1 thread: transformers sdpa {t['transformers_sdpa'] * 1e3:.0f} ms; "
            f"bridge plain {t['bridge_plain'] * 1e3:.0f} ms ({r['plain_ratio']:.2f}x), "
            f"with the last layer's map {t['bridge_one_map'] * 1e3:.0f} ms ({r['one_map_ratio']:.2f}x); "
            f"relative logit difference {r['relative_logit_difference']:.1e}",
            flush=True,
        )
    table = markdown_table(
        ["architecture", "transformers sdpa ms", "bridge plain ms", "ratio", "bridge + one map ms", "ratio"],
        [
            [
                r["family"],
                f"{r['times_s']['transformers_sdpa'] * 1e3:.0f}",
                f"{r['times_s']['bridge_plain'] * 1e3:.0f}",
                f"{r['plain_ratio']:.2f}x",
                f"{r['times_s']['bridge_one_map'] * 1e3:.0f}",
                f"{r['one_map_ratio']:.2f}x",
            ]
            for r in rows
        ],
    )
    markdown = (
        "## The bridge (`bench_bridge.py`)\n\n"
        f"A random checkpoint of each architecture written by `transformers` (8 layers, hidden size 512, "
        f"vocabulary 8000), float32, one thread, {length} tokens, {repeat} interleaved rounds of the thread's CPU "
        "time. A ratio is the median over rounds of the bridge's time over transformers' sdpa forward "
        "(below 1: the bridge is faster).\n\n" + table
    )
    data = {"repeat": repeat, "tokens": length, "architectures": rows}
    write_results("bridge", data, markdown, update_docs=args.update_docs)
    return json.loads(json.dumps(data))


if __name__ == "__main__":
    main(sys.argv[1:])
