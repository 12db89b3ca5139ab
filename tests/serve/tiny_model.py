"""A tiny random :class:`attnkit.nn.DecoderLM` behind the :mod:`attnkit.models` interface,
with a whitespace tokenizer, so that the app can be tested without downloading a model.

Its weights are real softmax outputs of a real attnkit model (not made up), computed on
the fly in milliseconds.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.nn import DecoderLM

VOCAB_SIZE = 64


@dataclass
class Tokenized:
    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]]


@dataclass
class Run:
    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]]
    attentions: dict[int, Tensor]
    heads: list[int]


class TinyModel:
    """Two layers, four heads, words as tokens (ids from a hash of the word)."""

    name = "tiny"
    family = "llama"
    num_layers = 2
    num_heads = 4
    max_length = 256
    causal = True

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.lm = DecoderLM(VOCAB_SIZE, 32, self.num_heads, self.num_layers, 64, positional="rotary").eval()

    def tokenize(self, text: str) -> Tokenized:
        tokens, offsets, pos = [], [], 0
        for word in text.split():
            start = text.index(word, pos)
            pos = start + len(word)
            tokens.append(word)
            offsets.append((start, pos))
        ids = [zlib.crc32(t.encode()) % VOCAB_SIZE for t in tokens]
        return Tokenized(torch.tensor([ids], dtype=torch.long), tokens, offsets)

    @torch.no_grad()
    def run(self, text: str, *, attention: bool | list[int] = True, heads: list[int] | None = None) -> Run:
        if not text.strip():
            raise ValueError("the text is empty")
        t = self.tokenize(text)
        if t.ids.shape[1] > self.max_length:
            raise ValueError(f"the text is {t.ids.shape[1]} tokens, more than {self.max_length}")
        out = self.lm(t.ids, return_weights=True)
        layers = range(self.num_layers) if attention is True else (attention or [])
        heads = list(range(self.num_heads)) if heads is None else list(heads)
        maps = {layer: out.weights[layer].self_attention[:, heads] for layer in layers}  # [1, h, s, s]
        return Run(t.ids, t.tokens, t.offsets, maps, heads)

    @torch.no_grad()
    def run_batch(
        self, texts: list[str], *, attention: bool | list[int] = True, heads: list[int] | None = None,
        logits: bool = True, stop=None,
    ) -> list[Run]:
        """Every text in one forward pass, shorter ones padded at the end (causal: the
        padding changes nothing before it); ``stop()`` is asked before the pass."""
        if stop is not None and stop():
            raise RuntimeError("the run was stopped")
        tokenized = [self.tokenize(text) for text in texts]
        longest = max(t.ids.shape[1] for t in tokenized)
        ids = torch.zeros(len(texts), longest, dtype=torch.long)  # [b, s]
        for row, t in enumerate(tokenized):
            ids[row, : t.ids.shape[1]] = t.ids[0]
        out = self.lm(ids, return_weights=True)
        layers = range(self.num_layers) if attention is True else (attention or [])
        heads = list(range(self.num_heads)) if heads is None else list(heads)
        runs = []
        for row, t in enumerate(tokenized):
            n = t.ids.shape[1]
            maps = {layer: out.weights[layer].self_attention[row : row + 1, heads, :n, :n] for layer in layers}
            runs.append(Run(t.ids, t.tokens, t.offsets, maps, heads))
        return runs
