"""Test stand-ins for an :mod:`attnkit.models` model: implementations of
:class:`attnkit.models.InspectableModel`, what the code built on models (inspection,
surveys, the viewer, the web app) reads from one, without a real checkpoint.

A stand-in subclasses :class:`FakeModel` and gives:

- the class attributes ``name``, ``family``, ``num_layers``, ``num_heads``,
  ``num_kv_heads``, ``max_length``, ``causal``, as :class:`attnkit.models.Model` has them;
- :meth:`FakeModel.tokenize` (``text`` → :class:`Tokenized`) and
  :meth:`FakeModel.token_string` (an id → its token string, for runs given ids);
- :meth:`FakeModel.attention` (ids ``[b, s]`` → every layer's weights ``[b, h, s, s]``).

:meth:`FakeModel.run` and :meth:`FakeModel.run_batch` are shared: they check the input as the
real model does (an empty text, one longer than ``max_length``), pick the layers and heads
asked for, and hand back a :class:`Run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.functional.indices import normalize_rows


@dataclass
class Tokenized:
    """What :meth:`attnkit.models.Model.tokenize` returns, as far as stand-ins need it."""

    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]] | None
    special: list[bool] = field(default_factory=list)


@dataclass
class Run:
    """What :meth:`attnkit.models.Model.run` returns, as far as stand-ins need it."""

    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]] | None
    attentions: dict[int, Tensor]
    heads: list[int]
    rows: range


def words_of(text: str) -> list[tuple[str, int, int]]:
    """The whitespace-separated words of ``text`` with their ``(start, end)`` spans."""
    out, pos = [], 0
    for word in text.split():
        start = text.index(word, pos)
        pos = start + len(word)
        out.append((word, start, pos))
    return out


class FakeModel:
    """The shared part of every stand-in (see the module's docstring)."""

    name = "fake"
    family = "llama"
    num_layers = 1
    num_heads = 1
    num_kv_heads = 1
    max_length = 64
    causal = True

    def tokenize(self, text: str) -> Tokenized:
        raise NotImplementedError

    def token_string(self, token_id: int) -> str:
        raise NotImplementedError

    def attention(self, ids: Tensor) -> dict[int, Tensor]:
        """Every layer's weights ``[b, h, s, s]`` of ids ``[b, s]``."""
        raise NotImplementedError

    def run(
        self,
        text_or_ids: str | Tensor,
        *,
        return_weights: bool | Sequence[int] = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        rows: range | slice | None = None,
    ) -> Run:
        return self.run_batch([text_or_ids], return_weights=return_weights, heads=heads, logits=logits, rows=rows)[0]

    @torch.no_grad()
    def run_batch(
        self,
        inputs: Sequence[str | Tensor],
        *,
        return_weights: bool | Sequence[int] = True,
        heads: Sequence[int] | None = None,
        logits: bool = True,
        stop: Callable[[], bool] | None = None,
        rows: range | slice | None = None,
    ) -> list[Run]:
        """Every input in one pass, shorter ones padded at the end (a causal stand-in: the
        padding changes nothing before it); ``stop()`` is asked before the pass."""
        tokenized = [self._tokenized(item) for item in inputs]
        if stop is not None and stop():
            raise RuntimeError("the run was stopped")
        longest = max(t.ids.shape[1] for t in tokenized)
        ids = torch.zeros(len(tokenized), longest, dtype=torch.long)  # [b, s]
        for row, t in enumerate(tokenized):
            ids[row, : t.ids.shape[1]] = t.ids[0]
        maps = self.attention(ids)  # layer → [b, h, s, s]
        layers = range(self.num_layers) if return_weights is True else (return_weights or [])
        heads = list(range(self.num_heads)) if heads is None else list(heads)
        runs = []
        for row, t in enumerate(tokenized):
            n = t.ids.shape[1]
            kept = normalize_rows(rows, n)
            chosen = {
                layer: maps[layer][row : row + 1, heads, kept.start : kept.stop, :n] for layer in layers
            }  # [1, h_sel, n_r, n]
            runs.append(Run(t.ids, t.tokens, t.offsets, chosen, heads, kept))
        return runs

    def _tokenized(self, text_or_ids: str | Tensor) -> Tokenized:
        if isinstance(text_or_ids, str):
            if not text_or_ids.strip():
                raise ValueError("the text is empty")
            t = self.tokenize(text_or_ids)
        else:
            ids = text_or_ids if text_or_ids.ndim == 2 else text_or_ids[None]
            t = Tokenized(ids, [self.token_string(i) for i in ids[0].tolist()], None)
        if t.ids.shape[1] > self.max_length:
            raise ValueError(f"the text is {t.ids.shape[1]} tokens, more than {self.max_length}")
        return t
