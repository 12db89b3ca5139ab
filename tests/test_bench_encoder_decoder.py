"""benchmarks/bench_encoder_decoder.py's transformers contender: its greedy loop over
transformers' own KV cache (``cache=``, the keyword of transformers 5) gives the tokens
``generate`` gives, on a tiny T5 and a tiny BART (the benchmark's 6 + 6-layer models are run
by hand)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_encoder_decoder as bench

transformers = pytest.importorskip("transformers")


def _tiny(family: str):
    torch.manual_seed(0)
    if family == "t5":
        config = transformers.T5Config(
            vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4, decoder_start_token_id=0
        )
        return transformers.T5ForConditionalGeneration(config).eval()
    config = transformers.BartConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
    )
    return transformers.BartForConditionalGeneration(config).eval()


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_the_transformers_greedy_loop_decodes_with_its_kv_cache_as_generate(family: str) -> None:
    hf = _tiny(family)
    source = torch.randint(4, 64, (1, 7), generator=torch.Generator().manual_seed(0))
    start = hf.config.decoder_start_token_id
    with torch.inference_mode():
        tokens = bench._greedy_hf(hf, source, start)
        expected = hf.generate(
            source,
            decoder_input_ids=torch.tensor([[start]]),
            max_new_tokens=bench.NEW_TOKENS,
            min_new_tokens=bench.NEW_TOKENS,
            do_sample=False,
            num_beams=1,
            forced_eos_token_id=None,  # BART's generation config would force an end token last
        )
    assert tokens == expected[0, 1:].tolist()
