"""A stand-in for an :mod:`attnkit.models` model whose attention is known exactly, to test
what is built on that contract without a real checkpoint.

Words are tokens (a ``<s>`` token first). One layer, two heads:
head 0 attends to the previous token (query 0 to itself); head 1 is a perfect induction
head: a query attends to the token after the latest earlier occurrence of its own token,
and to the first token when there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

VOCAB = ["<s>", "<pad>"] + [f"w{i}" for i in range(18)]


class FakeBackend:
    def get_added_tokens_decoder(self) -> dict[int, str]:
        return {0: "<s>", 1: "<pad>"}


class FakeTokenizer:
    vocab_size = len(VOCAB)
    backend = FakeBackend()


@dataclass
class Tokenized:
    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[bool]


@dataclass
class Run:
    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]] | None
    attentions: dict[int, Tensor]
    heads: list[int]


class FakeModel:
    name = "fake"
    family = "llama"
    num_layers = 1
    num_heads = 2
    num_kv_heads = 2
    max_length = 64
    causal = True

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.words: dict[str, int] = {}

    def tokenize(self, text: str) -> Tokenized:
        tokens, offsets, ids, pos = ["<s>"], [(0, 0)], [0], 0
        for word in text.split():
            start = text.index(word, pos)
            pos = start + len(word)
            tokens.append("Ġ" + word if start else word)
            offsets.append((start, pos))
            ids.append(self.words.setdefault(word.lower(), 2 + len(self.words) % 18))
        return Tokenized(torch.tensor([ids]), tokens, offsets, [True] + [False] * (len(ids) - 1))

    def run(self, text_or_ids, *, attention=True, heads=None) -> Run:
        if isinstance(text_or_ids, str):
            if not text_or_ids.strip():
                raise ValueError("the text is empty")
            t = self.tokenize(text_or_ids)
        else:
            ids = text_or_ids
            t = Tokenized(ids, [VOCAB[i] for i in ids[0].tolist()], None, [])
        if t.ids.shape[1] > self.max_length:
            raise ValueError(f"the text is {t.ids.shape[1]} tokens, more than {self.max_length}")
        heads = list(range(self.num_heads)) if heads is None else heads
        weights = known_attention(t.ids[0])[heads][None]  # [1, h, s, s]
        return Run(t.ids, t.tokens, t.offsets, {0: weights}, heads)


def known_attention(ids: Tensor) -> Tensor:
    """``[2, s, s]``: the previous-token head and the induction head on ``ids``."""
    s = len(ids)
    w = torch.zeros(2, s, s)
    w[0, 0, 0] = 1
    w[0, torch.arange(1, s), torch.arange(s - 1)] = 1
    for i in range(s):
        earlier = [j for j in range(i) if ids[j] == ids[i]]
        w[1, i, earlier[-1] + 1 if earlier else 0] = 1
    return w
