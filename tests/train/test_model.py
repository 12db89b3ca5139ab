"""The toy-task models: greedy decoding with the KV cache equals decoding by recomputing
everything, and the attention maps line up with the tokens."""

from __future__ import annotations

import torch

from attnkit.train.model import DecoderOnlyTransformer, EncoderDecoderTransformer, build_model
from attnkit.train.tasks import make_task

SIZES = dict(d_model=32, heads=4, layers=2, ff=64, dropout=0.1)


def greedy_by_recomputation(model, inputs, length):
    """Decode by running the whole teacher-forced forward again for every new token."""
    out = torch.zeros(inputs.shape[0], 0, dtype=torch.long)
    for _ in range(length):
        # The forward reads target[:-1]; a dummy last token makes it predict one more.
        logits = model(inputs, torch.cat((out, torch.zeros_like(out[:, :1])), dim=1))  # [b, s + 1, v]
        out = torch.cat((out, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return out


def test_cached_greedy_decoding_equals_recomputation() -> None:
    torch.manual_seed(0)
    for task in (make_task("reverse", length=6, symbols=8), make_task("addition", digits=2)):
        model = build_model(task.vocab_size, decoder_only=task.decoder_only, **SIZES).eval()
        assert isinstance(model, DecoderOnlyTransformer if task.decoder_only else EncoderDecoderTransformer)
        inputs = task.sample(5, torch.Generator().manual_seed(1)).inputs
        with torch.no_grad():
            expected = greedy_by_recomputation(model, inputs, task.target_length)
        model.train()
        assert torch.equal(model.generate(inputs, task.target_length), expected)
        assert model.training  # generate() restores the mode it found


def test_attention_maps_have_one_row_per_target_token() -> None:
    torch.manual_seed(0)
    reverse = make_task("reverse", length=6, symbols=8)
    batch = reverse.sample(3, torch.Generator().manual_seed(0))
    maps = build_model(reverse.vocab_size, decoder_only=False, **SIZES).attention_maps(batch.inputs, batch.targets)
    assert maps.kind == "cross" and maps.weights.shape == (2, 3, 4, 7, 6) and torch.equal(maps.keys, batch.inputs)
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(2, 3, 4, 7))

    addition = make_task("addition", digits=2)
    batch = addition.sample(3, torch.Generator().manual_seed(0))
    lm = build_model(addition.vocab_size, decoder_only=True, **SIZES)
    maps = lm.attention_maps(batch.inputs, batch.targets)
    # Keys: <s>, the 6 input tokens, and the first 3 of the 4 target tokens.
    assert maps.kind == "self" and maps.weights.shape == (2, 3, 4, 4, 10)
    assert addition.tokens(maps.keys[0])[0] == "<s>" and torch.equal(maps.keys[:, 1:7], batch.inputs)
    # Causal: the row predicting target token i sees the keys up to input end + i.
    row_lengths = (maps.weights[0, 0, 0] > 0).sum(-1)
    assert row_lengths.tolist() == [7, 8, 9, 10]
