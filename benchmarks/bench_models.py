"""Real models: attnkit's SmolLM2 against Hugging Face ``transformers`` on the same weights,
in the same process and on the same threads.

- prefill of 1024 tokens, logits of the last position only (what generation needs; for
  transformers ``logits_to_keep=1``) and of every position;
- greedy decoding of 32 tokens from a short prompt (both produce the same tokens), as
  tokens per second;
- ``attnkit inspect`` on the notes' example, wall time of the whole command once the model
  is cached (a fresh process: imports, load, run, heatmap and JSON).

Run alone: ``python benchmarks/bench_models.py`` (``THREADS=N`` to change torch's threads,
``REPEAT=N`` for more rounds). The model is fetched first if needed.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import interleaved_times, markdown_table, matmul_gflops, write_results  # noqa: E402

PREFILL = 1024
NEW_TOKENS = 32
PROMPT = "Once upon a time"  # SmolLM2 continues it for more than 32 tokens without stopping


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


def main() -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["THREADS"]))
    repeat = int(os.environ.get("REPEAT", "5"))
    from transformers import AutoModelForCausalLM

    from attnkit import models

    models.fetch("smollm2")
    ours = models.load("smollm2")
    module = ours.module
    hf = {
        impl: AutoModelForCausalLM.from_pretrained(ours.path, attn_implementation=impl).eval()
        for impl in ("sdpa", "eager")
    }
    ids = torch.randint(0, ours.config.vocab_size, (1, PREFILL), generator=torch.Generator().manual_seed(0))
    prompt = ours.tokenize(PROMPT).ids
    matrices = [p for p in module.parameters() if p.ndim == 2]  # the tied head appears once
    mm = matmul_gflops()

    def generate_hf(impl: str):
        out = hf[impl].generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False
        )
        return out[0, prompt.shape[1] :].tolist()

    with torch.inference_mode():
        # The contenders compute the same thing: check before timing.
        ours_last = module.lm_head(module.hidden_states(ids)[:, -1])
        prefill_error = max(
            (ours_last - m(ids, use_cache=False, logits_to_keep=1).logits[:, -1]).abs().max().item()
            for m in hf.values()
        )
        tokens = list(ours.generate_ids(prompt, max_new_tokens=NEW_TOKENS))
        assert len(tokens) == NEW_TOKENS and all(generate_hf(impl) == tokens for impl in hf), "generations differ"

        prefill = interleaved_times(
            {
                "attnkit": lambda: module.lm_head(module.hidden_states(ids)[:, -1]),
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

    flops = _prefill_flops(ours, PREFILL)
    best_hf_decode = min(decode["hf_sdpa"], decode["hf_eager"])
    data = {
        "threads": torch.get_num_threads(),
        "repeat": repeat,
        "matmul_gflops": mm,
        "prefill_tokens": PREFILL,
        "prefill_max_abs_logit_difference": prefill_error,
        "prefill_last_logits_s": prefill,
        "prefill_all_logits_s": prefill_full,
        "prefill_speedup_vs_sdpa": prefill["hf_sdpa"] / prefill["attnkit"],
        "prefill_speedup_vs_eager": prefill["hf_eager"] / prefill["attnkit"],
        "prefill_fraction_of_mm": {k: flops / t / 1e9 / mm for k, t in prefill.items()},
        "decode_new_tokens": NEW_TOKENS,
        "decode_prompt": PROMPT,
        "decode_tokens_per_s": {k: NEW_TOKENS / t for k, t in decode.items()},
        "decode_speedup_vs_faster_hf": best_hf_decode / decode["attnkit"],
        "decode_weight_bytes_per_token": sum(w.numel() * w.element_size() for w in matrices),
        "inspect": what,
        "inspect_s": inspect_s,
    }
    for key in ("prefill_last_logits_s", "prefill_all_logits_s"):
        print(key, {k: f"{v:.3f} s" for k, v in data[key].items()})
    print("decode tok/s", {k: f"{v:.2f}" for k, v in data["decode_tokens_per_s"].items()})
    print(
        f"prefill speed-up: {data['prefill_speedup_vs_sdpa']:.2f}x vs sdpa, {data['prefill_speedup_vs_eager']:.2f}x vs "
        f"eager; decode {data['decode_speedup_vs_faster_hf']:.2f}x vs the faster HF; {what}: {inspect_s:.2f} s"
    )
    floor_tps = data["decode_tokens_per_s"]["floor"]
    rows = []
    for name, label in (("attnkit", "attnkit"), ("hf_sdpa", "transformers, sdpa"), ("hf_eager", "transformers, eager")):
        rows.append([
            label,
            f"{prefill[name] * 1e3:.0f}",
            f"{data['prefill_fraction_of_mm'][name]:.0%}",
            f"{prefill_full[name] * 1e3:.0f}",
            f"{data['decode_tokens_per_s'][name]:.1f}",
            f"{data['decode_tokens_per_s'][name] / floor_tps:.0%}",
        ])
    markdown = (
        "## Real models (`bench_models.py`)\n\n"
        f"SmolLM2-135M-Instruct, float32, {torch.get_num_threads()} threads, medians of {repeat} interleaved rounds; "
        f"the same weights in all three. Prefill: {PREFILL} random tokens, no cache (largest logit difference to "
        f"transformers {prefill_error:.1e}). Decoding: {NEW_TOKENS} greedy tokens after \"{PROMPT}\", identical in "
        f"all three, prompt included. `torch.mm` ceiling now: {mm:.0f} GFLOP/s.\n\n"
        + markdown_table(
            ["", "prefill ms (last logits)", "% of mm ceiling", "prefill ms (all logits)", "decode tokens/s",
             "% of decode floor"],
            rows,
        )
        + f"\n\nattnkit prefill: {data['prefill_speedup_vs_sdpa']:.2f}× transformers-sdpa, "
        f"{data['prefill_speedup_vs_eager']:.2f}× transformers-eager. Decoding: "
        f"{data['decode_speedup_vs_faster_hf']:.2f}× the faster transformers. {what}: {inspect_s:.2f} s.\n\n"
        f"Decode floor: reading every weight matrix once per token (one matrix-vector product each, "
        f"{data['decode_weight_bytes_per_token'] / 1e6:.0f} MB) runs at {floor_tps:.1f} tokens/s here; no float32 "
        "implementation can decode faster on this machine."
    )
    write_results("models", data, markdown)
    return data


if __name__ == "__main__":
    main()
