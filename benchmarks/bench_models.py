"""Real models: attnkit's SmolLM2 against Hugging Face ``transformers`` on the same weights,
in the same process and on the same threads.

- prefill of 1024 tokens, logits of the last position only (what generation needs; for
  transformers ``logits_to_keep=1``) and of every position;
- greedy decoding of 32 tokens from a short prompt (both produce the same tokens), as
  tokens per second;
- ``attnkit inspect`` on its default example ("The cat sat on the mat."), wall time of the whole command once the model
  is cached (a fresh process: imports, load, run, heatmap and JSON).

Everything is measured at 1 thread and at torch's default thread count (``THREADS=1,2``
to choose): on a shared machine whose cores are busy with other work, every parallel region
of a multi-threaded run waits for a descheduled thread, which inflates and scatters the
times; one thread is the stable comparison. The contenders always share the thread count.

Run alone: ``python benchmarks/bench_models.py`` (``REPEAT=N`` for more rounds). The model is
fetched first if needed.

``python benchmarks/bench_models.py --family NAME`` (a ``model_type`` of
``attnkit models families``) measures one family instead, on a random checkpoint that
``transformers`` writes with its own config class: 12 layers, ``hidden_size`` 768, 12 query
heads of 64 dims (4 key/value heads where the family groups them), vocabulary 32000, the
family's other settings at transformers' defaults. One thread; prefill of 512 random
tokens (last-position logits) and greedy decoding of 32 tokens after 16, attnkit against
transformers with sdpa attention, interleaved in one run: 15 rounds (``REPEAT=N`` for
another number), each running both back to back. A ratio is the median of the rounds' ratios
(:func:`benchmarks.common.paired_ratio`), the times shown are medians. Times are the CPU
time of the one thread (``time.thread_time``): on a shared machine, the time the thread
waits for a core is not the model's. ``--family all`` measures every family and writes the
table to ``benchmarks/results/models_families.md``, with every round's times in the JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402

_FAMILY_SIZES = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 2048,
}
# model_type → (transformers config class, settings beyond the shared sizes)
_FAMILY_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {"num_key_value_heads": 4}),
    "gpt2": ("GPT2Config", {"vocab_size": 32000, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 2048}),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.25}),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 4}),
    "qwen3": ("Qwen3Config", {"num_key_value_heads": 4, "head_dim": 64}),
    "mistral": ("MistralConfig", {"num_key_value_heads": 4}),
    "gemma2": ("Gemma2Config", {"num_key_value_heads": 4, "head_dim": 64}),
    "gemma3_text": ("Gemma3TextConfig", {"num_key_value_heads": 4, "head_dim": 64}),
    "phi3": ("Phi3Config", {"num_key_value_heads": 4, "pad_token_id": 0}),
    # Mixtures of experts: 8 or 16 experts of a quarter to a half of the dense width.
    "mixtral": (
        "MixtralConfig",
        {"num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 768},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {
            "num_key_value_heads": 4,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 768,
            "shared_expert_intermediate_size": 1536,
        },
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "num_key_value_heads": 4,
            "head_dim": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
        },
    ),
    # Latent attention (DeepSeek-V3's proportions, scaled down) and 16 sigmoid-routed experts.
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "num_key_value_heads": 12,
            "q_lora_rank": 384,
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
            "n_routed_experts": 16,
            "num_experts_per_tok": 4,
            "n_group": 4,
            "topk_group": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": 384,
            "first_k_dense_replace": 1,
        },
    ),
}


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--family",
        choices=[*sorted(_FAMILY_CONFIGS), "all"],
        help="measure one family (or all) on a random checkpoint instead of SmolLM2",
    )
    return parser


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    interleaved_samples,
    interleaved_times,
    markdown_table,
    matmul_gflops,
    paired_ratio,
    write_results,
)

PREFILL = 1024
NEW_TOKENS = 32
PROMPT = "Once upon a time"  # SmolLM2 continues it for more than 32 tokens without stopping
CONTENDERS = (("attnkit", "attnkit"), ("hf_sdpa", "transformers, sdpa"), ("hf_eager", "transformers, eager"))


def _prefill_flops(model, s: int) -> float:
    """Matmul FLOPs of one prefill with last-position logits: 2·s per layer weight, plus
    causal attention ``4·h·s²·d / 2`` per layer, plus the head on one position."""
    config = model.config
    per_layer = sum(p.numel() for p in model.module.decoder.layers[0].parameters() if p.ndim == 2)
    attention = 4 * config.num_heads * s * s * (config.hidden_size // config.num_heads) / 2
    return config.num_layers * (2 * s * per_layer + attention) + 2 * config.hidden_size * config.vocab_size


def _weights_pass(matrices: list[torch.Tensor]) -> None:
    for w in matrices:
        torch.nn.functional.linear(torch.ones(1, w.shape[1]), w)


def _time_command(argv: list[str], repeat: int) -> float:
    """Median wall time of a fresh ``attnkit`` process."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(ours, hf: dict, repeat: int) -> dict:
    """Every timing at the current thread count; the contenders interleaved."""
    module = ours.module
    ids = torch.randint(0, ours.config.vocab_size, (1, PREFILL), generator=torch.Generator().manual_seed(0))
    prompt = ours.tokenize(PROMPT).ids
    matrices = [p for p in module.parameters() if p.ndim == 2]  # the tied head appears once

    def generate_hf(impl: str) -> list[int]:
        out = hf[impl].generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False
        )
        return out[0, prompt.shape[1] :].tolist()

    mm = matmul_gflops()
    with torch.inference_mode():
        # The contenders compute the same thing: check before timing.
        ours_last = module.lm_head(module.last_hidden_state(ids)[:, -1])
        prefill_error = max(
            (ours_last - m(ids, use_cache=False, logits_to_keep=1).logits[:, -1]).abs().max().item()
            for m in hf.values()
        )
        tokens = list(ours.generate_ids(prompt, max_new_tokens=NEW_TOKENS))
        assert len(tokens) == NEW_TOKENS and all(generate_hf(impl) == tokens for impl in hf), "generations differ"
        prefill = interleaved_times(
            {
                "attnkit": lambda: module.lm_head(module.last_hidden_state(ids)[:, -1]),
                "hf_sdpa": lambda: hf["sdpa"](ids, use_cache=False, logits_to_keep=1),
                "hf_eager": lambda: hf["eager"](ids, use_cache=False, logits_to_keep=1),
            },
            repeat=repeat,
        )
        prefill_full = interleaved_times(
            {
                "attnkit": lambda: module(ids),
                "hf_sdpa": lambda: hf["sdpa"](ids, use_cache=False),
                "hf_eager": lambda: hf["eager"](ids, use_cache=False),
            },
            repeat=max(3, repeat // 2),
        )
        decode = interleaved_times(
            {
                "attnkit": lambda: list(ours.generate_ids(prompt, max_new_tokens=NEW_TOKENS)),
                "hf_sdpa": lambda: generate_hf("sdpa"),
                "hf_eager": lambda: generate_hf("eager"),
                # The least a token costs: one matrix-vector product per weight matrix
                # (the tied embedding as the head), i.e. reading every weight once.
                "floor": lambda: [_weights_pass(matrices) for _ in range(NEW_TOKENS)],
            },
            repeat=repeat,
        )
    flops = _prefill_flops(ours, PREFILL)
    return {
        "threads": torch.get_num_threads(),
        "matmul_gflops": mm,
        "prefill_max_abs_logit_difference": prefill_error,
        "prefill_last_logits_s": prefill,
        "prefill_all_logits_s": prefill_full,
        "prefill_speedup_vs_sdpa": prefill["hf_sdpa"] / prefill["attnkit"],
        "prefill_speedup_vs_eager": prefill["hf_eager"] / prefill["attnkit"],
        "prefill_fraction_of_mm": {k: flops / t / 1e9 / mm for k, t in prefill.items()},
        "decode_tokens_per_s": {k: NEW_TOKENS / t for k, t in decode.items()},
        "decode_speedup_vs_faster_hf": min(decode["hf_sdpa"], decode["hf_eager"]) / decode["attnkit"],
        "decode_weight_bytes_per_token": sum(w.numel() * w.element_size() for w in matrices),
    }


def _section(r: dict) -> str:
    """One thread count's table and ratios, in Markdown."""
    floor_tps = r["decode_tokens_per_s"]["floor"]
    rows = [
        [
            label,
            f"{r['prefill_last_logits_s'][name] * 1e3:.0f}",
            f"{r['prefill_fraction_of_mm'][name]:.0%}",
            f"{r['prefill_all_logits_s'][name] * 1e3:.0f}",
            f"{r['decode_tokens_per_s'][name]:.1f}",
            f"{r['decode_tokens_per_s'][name] / floor_tps:.0%}",
        ]
        for name, label in CONTENDERS
    ]
    return (
        f"### {r['threads']} thread{'s' if r['threads'] > 1 else ''}\n\n"
        f"`torch.mm` ceiling: {r['matmul_gflops']:.0f} GFLOP/s; largest prefill logit difference to transformers "
        f"{r['prefill_max_abs_logit_difference']:.1e}.\n\n"
        + markdown_table(
            [
                "",
                "prefill ms (last logits)",
                "% of mm ceiling",
                "prefill ms (all logits)",
                "decode tokens/s",
                "% of decode floor",
            ],
            rows,
        )
        + f"\n\nattnkit prefill: {r['prefill_speedup_vs_sdpa']:.2f}× transformers-sdpa, "
        f"{r['prefill_speedup_vs_eager']:.2f}× transformers-eager. Decoding: "
        f"{r['decode_speedup_vs_faster_hf']:.2f}× the faster transformers; the floor (every weight read once per "
        f"token, {r['decode_weight_bytes_per_token'] / 1e6:.0f} MB) runs at {floor_tps:.1f} tokens/s."
    )


FAMILY_PREFILL = 512
FAMILY_PROMPT = 16


def bench_family(family: str, repeat: int) -> dict:
    """attnkit against transformers (sdpa) on a random 12-layer, hidden-768 checkpoint of
    ``family``, one thread.

    Returns:
        The timings and ratios.
    """
    import transformers

    from attnkit import models

    class_name, settings = _FAMILY_CONFIGS[family]
    sizes = {} if family == "gpt2" else _FAMILY_SIZES
    no_special = {"bos_token_id": None, "eos_token_id": None}
    torch.manual_seed(0)
    config = getattr(transformers, class_name)(**(sizes | settings), **no_special)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        words = [f"w{i}" for i in range(config.vocab_size - 1)] + ["[UNK]"]
        _write_word_tokenizer(Path(folder) / "tokenizer.json", words)
        ours = models.load(folder)
        hf, implementation = _transformers_model(folder)
    module = ours.module
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, FAMILY_PREFILL), generator=generator)
    prompt = torch.randint(0, config.vocab_size, (1, FAMILY_PROMPT), generator=generator)

    def generate_hf() -> list[int]:
        out = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        return out[0, FAMILY_PROMPT:].tolist()

    with torch.inference_mode():
        ours_last = module.logits(module.last_hidden_state(ids)[:, -1])
        theirs_last = hf(ids, use_cache=False, logits_to_keep=1).logits[:, -1]
        error = ((ours_last - theirs_last).abs().max() / theirs_last.abs().max()).item()
        tokens = list(ours.generate_ids(prompt, max_new_tokens=NEW_TOKENS))
        assert tokens == generate_hf(), "attnkit and transformers generate different tokens"
        prefill = interleaved_samples(
            {
                "attnkit": lambda: module.logits(module.last_hidden_state(ids)[:, -1]),
                "hf_sdpa": lambda: hf(ids, use_cache=False, logits_to_keep=1),
            },
            repeat=repeat,
            clock=time.thread_time,
        )
        decode = interleaved_samples(
            {
                "attnkit": lambda: list(ours.generate_ids(prompt, max_new_tokens=NEW_TOKENS)),
                "hf_sdpa": generate_hf,
            },
            repeat=repeat,
            clock=time.thread_time,
        )
    return {
        "family": family,
        "threads": 1,
        "prefill_tokens": FAMILY_PREFILL,
        "decode_new_tokens": NEW_TOKENS,
        "transformers_attention": implementation,
        "prefill_relative_logit_difference": error,
        "prefill_s": {k: statistics.median(ts) for k, ts in prefill.items()},
        "decode_tokens_per_s": {k: NEW_TOKENS / statistics.median(ts) for k, ts in decode.items()},
        "prefill_ratio_vs_sdpa": paired_ratio(prefill["hf_sdpa"], prefill["attnkit"]),
        "decode_ratio_vs_sdpa": paired_ratio(decode["hf_sdpa"], decode["attnkit"]),
        "samples_s": {"prefill": prefill, "decode": decode},
    }


def _transformers_model(folder: str) -> tuple[object, str]:
    """The checkpoint in transformers with sdpa attention, or with eager attention for the
    families whose soft-capped scores transformers runs only there (Gemma 2)."""
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
        return model.eval(), "sdpa"
    except ValueError:
        return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval(), "eager"


def bench_families(families: list[str], repeat: int, *, update_docs: bool = False) -> dict:
    """:func:`bench_family` for each of ``families``, printed as it goes; every family
    together is written to ``results/models_families``."""
    rows = []
    load_before = os.getloadavg()[0]
    for family in families:
        r = bench_family(family, repeat)
        rows.append(r)
        print(
            f"{family}, 1 thread: prefill {FAMILY_PREFILL} tokens {r['prefill_s']['attnkit'] * 1e3:.0f} ms "
            f"vs {r['prefill_s']['hf_sdpa'] * 1e3:.0f} ms transformers-{r['transformers_attention']} "
            f"({r['prefill_ratio_vs_sdpa']:.2f}x); "
            f"decode {r['decode_tokens_per_s']['attnkit']:.1f} vs {r['decode_tokens_per_s']['hf_sdpa']:.1f} tokens/s "
            f"({r['decode_ratio_vs_sdpa']:.2f}x); relative logit difference {r['prefill_relative_logit_difference']:.1e}",
            flush=True,
        )
    load = {"start": load_before, "end": os.getloadavg()[0]}
    data = {"repeat": repeat, "load_average_1min": load, "families": rows}
    if len(families) > 1:
        table = markdown_table(
            [
                "family",
                "transformers attention",
                "prefill ms attnkit",
                "prefill ms transformers",
                "prefill ratio",
                "decode tok/s attnkit",
                "decode tok/s transformers",
                "decode ratio",
                "relative logit difference",
            ],
            [
                [
                    r["family"],
                    r["transformers_attention"],
                    f"{r['prefill_s']['attnkit'] * 1e3:.0f}",
                    f"{r['prefill_s']['hf_sdpa'] * 1e3:.0f}",
                    f"{r['prefill_ratio_vs_sdpa']:.2f}x",
                    f"{r['decode_tokens_per_s']['attnkit']:.1f}",
                    f"{r['decode_tokens_per_s']['hf_sdpa']:.1f}",
                    f"{r['decode_ratio_vs_sdpa']:.2f}x",
                    f"{r['prefill_relative_logit_difference']:.1e}",
                ]
                for r in rows
            ],
        )
        markdown = (
            "## Model families (`bench_models.py --family all`)\n\n"
            f"A random checkpoint of each family written by `transformers` (12 layers, hidden size 768, "
            f"vocabulary 32000), float32, one thread, attnkit against transformers with sdpa attention (eager where transformers has no sdpa path "
            f"for the family); "
            f"{repeat} interleaved rounds of the thread's CPU time, each running both back to back; a ratio is "
            f"the median of the rounds' ratios, a time the median of its rounds. Prefill: {FAMILY_PREFILL} "
            f"random tokens, last-position logits. Decoding: {NEW_TOKENS} greedy tokens after "
            f"{FAMILY_PROMPT}, the same tokens in both. A ratio above 1 means attnkit is faster.\n\n"
            + table
            + f"\n\nThe machine's load (1-minute load average, {os.cpu_count()} cores): "
            f"{load['start']:.1f} at the start, {load['end']:.1f} at the end. On this shared machine, a "
            "ratio over 15 rounds stayed within about ±0.02 (one standard deviation) across the windows "
            "of a 40-round run of the same code."
        )
        write_results("models_families", data, markdown, update_docs=update_docs)
    return data


def _write_word_tokenizer(path: Path, words: list[str]) -> None:
    """A word-level ``tokenizer.json`` over ``words`` (the benchmark feeds ids, not text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[-1]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.write_text(backend.to_str())


def main(argv: list[str] | None = None) -> dict:
    parser = arguments()
    args = parser.parse_args(argv or [])
    if args.family:
        repeat = int(os.environ.get("REPEAT", "15"))
        families = sorted(_FAMILY_CONFIGS) if args.family == "all" else [args.family]
        return bench_families(families, repeat, update_docs=args.update_docs)
    repeat = int(os.environ.get("REPEAT", "5"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    default_threads = torch.get_num_threads()
    threads = sorted({int(n) for n in os.environ.get("THREADS", f"1,{default_threads}").split(",")})
    from transformers import AutoModelForCausalLM

    from attnkit import models

    models.fetch("smollm2")
    ours = models.load("smollm2")
    hf = {
        impl: AutoModelForCausalLM.from_pretrained(ours.path, attn_implementation=impl).eval()
        for impl in ("sdpa", "eager")
    }
    results = []
    for n in threads:
        torch.set_num_threads(n)
        results.append(_measure(ours, hf, repeat))
        r = results[-1]
        print(f"threads={n}")
        for key in ("prefill_last_logits_s", "prefill_all_logits_s"):
            print(" ", key, {k: f"{v:.3f} s" for k, v in r[key].items()})
        print("  decode tok/s", {k: f"{v:.2f}" for k, v in r["decode_tokens_per_s"].items()})
        print(
            f"  prefill {r['prefill_speedup_vs_sdpa']:.2f}x vs sdpa, {r['prefill_speedup_vs_eager']:.2f}x vs eager; "
            f"decode {r['decode_speedup_vs_faster_hf']:.2f}x vs the faster transformers",
            flush=True,
        )
    torch.set_num_threads(default_threads)

    with tempfile.TemporaryDirectory() as out:
        if importlib.util.find_spec("attnkit.cli.inspect") is not None:
            what = "`attnkit inspect` (default example, fresh process)"
            argv = [sys.executable, "-m", "attnkit.cli", "inspect", "--out", out]
        else:
            what = "`load` + `run` of the default example (fresh process)"
            code = "from attnkit import models; models.load('smollm2').run('The cat sat on the mat.')"
            argv = [sys.executable, "-c", code]
        _time_command(argv, 1)  # warm the page cache
        inspect_s = _time_command(argv, 3)
    print(f"{what}: {inspect_s:.2f} s")

    data = {
        "repeat": repeat,
        "prefill_tokens": PREFILL,
        "decode_new_tokens": NEW_TOKENS,
        "decode_prompt": PROMPT,
        "by_threads": results,
        "inspect": what,
        "inspect_threads": default_threads,
        "inspect_s": inspect_s,
    }
    markdown = (
        "## Real models (`bench_models.py`)\n\n"
        f"SmolLM2-135M-Instruct, float32, the same weights in attnkit and transformers; medians of {repeat} "
        f"interleaved rounds. Prefill: {PREFILL} random tokens, no cache. Decoding: {NEW_TOKENS} greedy tokens "
        f'after "{PROMPT}", identical in all three, prompt included. The decode floor is one matrix-vector '
        "product per weight matrix per token: no float32 implementation decodes faster on this machine. On a "
        "shared machine the multi-threaded figures swing with the other load; one thread is the stable "
        "comparison.\n\n"
        + "\n\n".join(_section(r) for r in results)
        + f"\n\n{what}, {default_threads} threads: {inspect_s:.2f} s (median of 3)."
    )
    write_results("models", data, markdown, update_docs=args.update_docs)
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
