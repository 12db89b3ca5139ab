"""A tiny random :class:`attnkit.nn.DecoderLM` behind the :mod:`attnkit.models` interface
(an :class:`attnkit.models.InspectableModel`, built on :mod:`tests.fake_models`), with a whitespace tokenizer, so that the app can
be tested without downloading a model.

Its weights are real softmax outputs of a real attnkit model (not made up), computed on
the fly in milliseconds.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

from attnkit.nn import DecoderLM, DecoderLMConfig
from tests.fake_models import FakeModel, Tokenized, words_of

VOCAB_SIZE = 64


class TinyModel(FakeModel):
    """Two layers, four heads, words as tokens (ids from a hash of the word)."""

    name = "tiny"
    num_layers = 2
    num_heads = 4
    num_kv_heads = 4
    max_length = 256

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.lm = DecoderLM(
            DecoderLMConfig(
                32, self.num_heads, 64, vocab_size=VOCAB_SIZE, num_layers=self.num_layers, positional="rotary"
            )
        ).eval()

    def tokenize(self, text: str) -> Tokenized:
        spans = words_of(text)
        ids = [zlib.crc32(word.encode()) % VOCAB_SIZE for word, _, _ in spans]
        return Tokenized(torch.tensor([ids], dtype=torch.long), [w for w, _, _ in spans], [(a, b) for _, a, b in spans])

    def token_string(self, token_id: int) -> str:
        return f"t{token_id}"

    def attention(self, ids: Tensor) -> dict[int, Tensor]:
        out = self.lm(ids, return_weights=True)
        return {layer: weights.self_attention for layer, weights in enumerate(out.weights)}  # [b, h, s, s] each
