"""Encoder–decoders: attnkit's T5 and BART against Hugging Face ``transformers`` (sdpa
attention) on the same random weights, in the same process, on one thread.

Each family is a random 6 + 6-layer model of ``d_model`` 512 written by transformers itself
(T5: 8 heads of 64, feed-forward 2048, ReLU; BART: 8 heads, feed-forward 2048, GELU) with a
vocabulary of 32128, loaded by both from the same folder.

- prefill: the encoder over a source of 256 tokens and the decoder over a target of 64
  tokens (teacher forcing), logits of every target position;
- greedy decoding: 32 tokens, the encoder once and the decoder step by step against its
  KV cache (both produce the same tokens; transformers through a loop over its own
  ``past_key_values``, the same work as attnkit's ``stream``, without ``generate``'s
  bookkeeping), as tokens per second.

Run alone: ``python benchmarks/bench_encoder_decoder.py`` (``REPEAT=N`` rounds, default 5).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402


def arguments() -> argparse.ArgumentParser:
    return benchmark_parser(__doc__)


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import time  # noqa: E402

import torch  # noqa: E402

from benchmarks.common import interleaved_times, markdown_table, write_results  # noqa: E402

SOURCE, TARGET, NEW_TOKENS, VOCAB = 256, 64, 32, 32128


def _write(family: str, folder: Path) -> None:
    """A random 6 + 6-layer, d_model 512 checkpoint of ``family`` written by transformers."""
    import transformers

    torch.manual_seed(0)
    if family == "t5":
        config = transformers.T5Config(
            vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, decoder_start_token_id=0
        )
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.BartConfig(
            vocab_size=VOCAB,
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
            max_position_embeddings=512,
        )
        model = transformers.BartForConditionalGeneration(config)
    model.save_pretrained(folder)
    # attnkit reads a tokenizer with every checkpoint; the benchmark runs on ids only.
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")).save(str(folder / "tokenizer.json"))


def _greedy_hf(hf, source: torch.Tensor, start: int) -> list[int]:
    encoder = hf.get_encoder()(input_ids=source)
    step, past, out = torch.tensor([[start]]), None, []
    for _ in range(NEW_TOKENS):
        result = hf(encoder_outputs=encoder, decoder_input_ids=step, cache=past, use_cache=True)
        past = result.cache
        step = result.logits[:, -1].argmax(-1, keepdim=True)
        out.append(int(step))
    return out


def measure(family: str, repeat: int) -> dict:
    import transformers

    from attnkit import models

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / family
        _write(family, folder)
        ours = models.load(folder)
        hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    module = ours.module
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(4, VOCAB, (1, SOURCE), generator=generator)
    start = module.decoder_start_token_id
    target = torch.cat((torch.tensor([[start]]), torch.randint(4, VOCAB, (1, TARGET - 1), generator=generator)), 1)
    with torch.inference_mode():
        mine, theirs = module(source, target), hf(input_ids=source, decoder_input_ids=target).logits
        error = float((mine - theirs).abs().max() / theirs.abs().max())
        tokens_ours = [int(t) for t in module.stream(source, NEW_TOKENS)]
        tokens_hf = _greedy_hf(hf, source, start)
        prefill = interleaved_times(
            {
                "attnkit": lambda: module(source, target),
                "transformers": lambda: hf(input_ids=source, decoder_input_ids=target).logits,
            },
            repeat=repeat,
            clock=time.thread_time,
        )
        decode = interleaved_times(
            {
                "attnkit": lambda: [int(t) for t in module.stream(source, NEW_TOKENS)],
                "transformers": lambda: _greedy_hf(hf, source, start),
            },
            repeat=repeat,
            clock=time.thread_time,
        )
    return {
        "family": family,
        "logits_relative_error": error,
        "same_tokens": tokens_ours == tokens_hf,
        "prefill_ms": {name: t * 1e3 for name, t in prefill.items()},
        "prefill_speedup": prefill["transformers"] / prefill["attnkit"],
        "decode_tokens_per_s": {name: NEW_TOKENS / t for name, t in decode.items()},
        "decode_speedup": decode["transformers"] / decode["attnkit"],
    }


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(1)
    repeat = int(os.environ.get("REPEAT", "5"))
    loads = [os.getloadavg()[0]]  # the machine's one-minute load: other work on the shared cores
    results = []
    for family in ("t5", "bart"):
        results.append(measure(family, repeat))
        loads.append(os.getloadavg()[0])
    rows = [
        [
            r["family"],
            f"{r['prefill_ms']['attnkit']:.1f}",
            f"{r['prefill_ms']['transformers']:.1f}",
            f"{r['prefill_speedup']:.2f}x",
            f"{r['decode_tokens_per_s']['attnkit']:.1f}",
            f"{r['decode_tokens_per_s']['transformers']:.1f}",
            f"{r['decode_speedup']:.2f}x",
            f"{r['logits_relative_error']:.1e}",
            "yes" if r["same_tokens"] else "NO",
        ]
        for r in results
    ]
    table = markdown_table(
        [
            "model",
            "prefill attnkit (ms)",
            "prefill transformers (ms)",
            "ratio",
            "decode attnkit (tok/s)",
            "decode transformers (tok/s)",
            "ratio",
            "logits rel. error",
            "same tokens",
        ],
        rows,
    )
    markdown = (
        "## Encoder–decoders (T5, BART)\n\n"
        f"Random 6 + 6-layer models of d_model 512 (vocabulary {VOCAB}), one thread, against transformers "
        f"with sdpa attention on the same weights. Prefill: encoder over {SOURCE} source tokens and decoder "
        f"over {TARGET} target tokens; decode: {NEW_TOKENS} greedy tokens with the KV cache, the encoder once. "
        "Times are the CPU time of the one thread (medians of interleaved rounds). Ratios above 1 mean "
        "attnkit is faster.\n\n"
        + table
        + f"\n\nMeasured with {repeat} rounds on a {os.cpu_count()}-core machine at a load average of "
        f"{min(loads):.1f}–{max(loads):.1f} from other work (one-minute averages before and after each model)."
    )
    print(markdown)
    write_results(
        "encoder_decoder",
        {"results": results, "rounds": repeat, "load_average": loads},
        markdown,
        update_docs=args.update_docs,
    )


if __name__ == "__main__":
    main()
