"""A stand-in for an :mod:`attnkit.models` model whose attention is known exactly, to test
what is built on that contract without a real checkpoint (an
:class:`attnkit.models.InspectableModel`, built on :mod:`tests.fake_models`).

Words are tokens (a ``<s>`` token first). One layer, two heads:
head 0 attends to the previous token (query 0 to itself); head 1 is a perfect induction
head: a query attends to the token after the latest earlier occurrence of its own token,
and to the first token when there is none.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tests.fake_models import FakeModel as FakeModelProtocol
from tests.fake_models import Tokenized, words_of

VOCAB = ["<s>", "<pad>"] + [f"w{i}" for i in range(18)]


class FakeBackend:
    def get_added_tokens_decoder(self) -> dict[int, str]:
        return {0: "<s>", 1: "<pad>"}


class FakeTokenizer:
    vocab_size = len(VOCAB)
    backend = FakeBackend()


class FakeModel(FakeModelProtocol):
    name = "fake"
    num_layers = 1
    num_heads = 2
    num_kv_heads = 2
    max_length = 64

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.words: dict[str, int] = {}

    def tokenize(self, text: str) -> Tokenized:
        tokens, offsets, ids = ["<s>"], [(0, 0)], [0]
        for word, start, end in words_of(text):
            tokens.append("Ġ" + word if start else word)
            offsets.append((start, end))
            ids.append(self.words.setdefault(word.lower(), 2 + len(self.words) % 18))
        return Tokenized(torch.tensor([ids]), tokens, offsets, [True] + [False] * (len(ids) - 1))

    def token_string(self, token_id: int) -> str:
        return VOCAB[token_id]

    def attention(self, ids: Tensor) -> dict[int, Tensor]:
        return {0: torch.stack([known_attention(row) for row in ids])}  # [b, 2, s, s]


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
