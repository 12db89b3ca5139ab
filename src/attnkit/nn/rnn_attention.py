"""Attention as it began, in RNN encoder–decoders: additive (Bahdanau) and
multiplicative (Luong) attention.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
length, ``s_k`` key length, ``d_q`` query dim, ``d_k`` key dim, ``d_v`` value dim, ``a``
the hidden size of the additive score.

Each module owns the weights of its score function and can be used two ways:

- on its own, RNN-style: a decoder state (the query) against the encoder states (keys and
  values) gives a context vector and the alignment weights — :meth:`AttentionScore.forward`;
- as the ``score=`` of :class:`attnkit.nn.MultiHeadAttention`, where :meth:`~AttentionScore.scores`
  compares every query head with its key head (``query_dim = key_dim = head dim``).

The softmax, masking and weighted sum are not repeated here: both uses go through
attnkit.functional with the module's score function.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attnkit.functional import reference_attention
from attnkit.functional.scores import additive_scores, dot_scores, general_scores
from attnkit.nn.records import AttentionContext

LuongKind = Literal["dot", "general", "concat"]


class AttentionScore(nn.Module):
    """Base of attention modules defined by a learned score function.

    Attributes:
        query_dim: ``d_q``.
        key_dim: ``d_k``.
    """

    query_dim: int
    key_dim: int

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Raw scores.

        Args:
            q: ``[b, h, s_q, d_q]``.
            k: ``[b, h_kv, s_k, d_k]``.

        Returns:
            ``[b, h, s_q, s_k]``, before masking and softmax.
        """
        raise NotImplementedError

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor | None = None, *, mask: Tensor | None = None
    ) -> AttentionContext:
        """Attend from decoder state(s) to encoder states.

        Args:
            query: ``[b, d_q]`` (one decoder state per batch entry) or ``[b, s_q, d_q]``.
            keys: encoder states ``[b, s_k, d_k]``.
            values: ``[b, s_k, d_v]``; the keys themselves when ``None`` (as in Bahdanau
                and Luong, where both are the encoder's hidden states).
            mask: bool ``[b, s_k]``, ``True`` for real keys, ``False`` for padding.

        Returns:
            :class:`AttentionContext` with context ``[b, d_v]`` (or ``[b, s_q, d_v]``) and
            weights ``[b, s_k]`` (or ``[b, s_q, s_k]``).

        Raises:
            ValueError: shapes that do not fit the module or each other.
            TypeError: a mask that is not boolean.
        """
        values = keys if values is None else values
        single = self._check(query, keys, values, mask)
        q = query[:, None, None] if single else query[:, None]  # [b, 1, s_q, d_q]
        k, v = keys[:, None], values[:, None]  # [b, 1, s_k, d_k], [b, 1, s_k, d_v]
        allowed = None if mask is None else mask[:, None, None, :]  # [b, 1, 1, s_k]
        # The reference kernel directly: the inputs are validated above, and unlike
        # attention()'s dot-product checks it lets d_q differ from d_k, as scores may.
        result = reference_attention(q, k, v, allowed=allowed, bias=None, scale=1.0, score=self.scores)
        assert result.weights is not None  # the reference kernel always returns them
        context, weights = result.output[:, 0], result.weights[:, 0]  # [b, s_q, d_v], [b, s_q, s_k]
        if single:
            return AttentionContext(context[:, 0], weights[:, 0])
        return AttentionContext(context, weights)

    def _check(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> bool:
        """Validate the RNN-style inputs; return True for a single query ``[b, d_q]``."""
        if query.ndim not in (2, 3) or query.shape[-1] != self.query_dim:
            raise ValueError(
                f"query must be [b, d_q] or [b, s_q, d_q] with d_q = {self.query_dim}, got {list(query.shape)}"
            )
        if keys.ndim != 3 or keys.shape[-1] != self.key_dim:
            raise ValueError(f"keys must be [b, s_k, d_k] with d_k = {self.key_dim}, got {list(keys.shape)}")
        if values.ndim != 3 or values.shape[:2] != keys.shape[:2]:
            raise ValueError(f"values must be [b, s_k, d_v] matching keys {list(keys.shape)}, got {list(values.shape)}")
        if query.shape[0] != keys.shape[0]:
            raise ValueError(
                f"query and keys must have the same batch size, got {list(query.shape)} and {list(keys.shape)}"
            )
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor (True = real key), got dtype {mask.dtype}")
            if mask.shape != keys.shape[:2]:
                raise ValueError(f"mask must be [b, s_k] = {list(keys.shape[:2])}, got {list(mask.shape)}")
        return query.ndim == 2


class AdditiveAttention(AttentionScore):
    """Bahdanau attention: ``score(q, k) = vᵀ tanh(W_q q + W_k k)``.

    A small feed-forward network judges each (query, key) pair; it works across different
    query and key sizes but has no matrix-product form, so it costs memory
    ``b · h · s_q · s_k · a``.

    Args:
        query_dim: ``d_q``.
        key_dim: ``d_k`` (default ``d_q``).
        hidden_dim: ``a`` (default ``d_q``).

    Raises:
        ValueError: a dim ``< 1``.
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None) -> None:
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        if min(query_dim, key_dim, hidden_dim) < 1:
            raise ValueError(
                f"dims must be >= 1, got query_dim={query_dim}, key_dim={key_dim}, hidden_dim={hidden_dim}"
            )
        self.query_dim, self.key_dim, self.hidden_dim = query_dim, key_dim, hidden_dim
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)  # W_q  [a, d_q]
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=False)  # W_k  [a, d_k]
        self.v = nn.Linear(hidden_dim, 1, bias=False)  # vᵀ  [1, a]

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """``vᵀ tanh(W_q q + W_k k)``: ``[b, h, s_q, d_q]``, ``[b, h_kv, s_k, d_k]`` → ``[b, h, s_q, s_k]``."""
        return additive_scores(q, k, self.query_proj.weight, self.key_proj.weight, self.v.weight[0])

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, hidden_dim={self.hidden_dim}"


class LuongAttention(AttentionScore):
    """Luong (multiplicative) attention with one of the paper's three scores:

    - ``"dot"``: ``qᵀ k`` (no weights; ``d_q = d_k``);
    - ``"general"``: ``qᵀ W k`` with ``W`` ``[d_q, d_k]``;
    - ``"concat"``: ``vᵀ tanh(W [q; k])`` with ``W`` ``[a, d_q + d_k]`` — additive attention
      with the two matrices side by side in one.

    Args:
        query_dim: ``d_q``.
        key_dim: ``d_k`` (default ``d_q``).
        kind: ``"dot"``, ``"general"`` or ``"concat"``.
        hidden_dim: ``a`` for ``"concat"`` (default ``d_q``).

    Raises:
        ValueError: an unknown kind, ``"dot"`` with ``d_q != d_k``, ``hidden_dim`` given
            for another kind than ``"concat"``, a dim ``< 1``.
    """

    def __init__(
        self, query_dim: int, key_dim: int | None = None, *, kind: LuongKind = "general", hidden_dim: int | None = None
    ) -> None:
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        if kind not in ("dot", "general", "concat"):
            raise ValueError(f'kind must be "dot", "general" or "concat", got {kind!r}')
        if kind != "concat" and hidden_dim is not None:
            raise ValueError(f'hidden_dim is only used by kind="concat", got kind={kind!r}')
        if kind == "dot" and query_dim != key_dim:
            raise ValueError(f'kind="dot" needs query_dim == key_dim, got {query_dim} and {key_dim}')
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        if min(query_dim, key_dim, hidden_dim) < 1:
            raise ValueError(
                f"dims must be >= 1, got query_dim={query_dim}, key_dim={key_dim}, hidden_dim={hidden_dim}"
            )
        self.query_dim, self.key_dim, self.kind = query_dim, key_dim, kind
        self.w: nn.Linear | None = None
        self.v: nn.Linear | None = None
        if kind == "general":
            self.w = nn.Linear(key_dim, query_dim, bias=False)  # W [d_q, d_k]: q · (W k)
        elif kind == "concat":
            self.w = nn.Linear(query_dim + key_dim, hidden_dim, bias=False)  # W [a, d_q + d_k]
            self.v = nn.Linear(hidden_dim, 1, bias=False)  # vᵀ [1, a]

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """``[b, h, s_q, d_q]``, ``[b, h_kv, s_k, d_k]`` → ``[b, h, s_q, s_k]``."""
        if self.kind == "dot":
            return dot_scores(q, k)
        assert self.w is not None  # "general" and "concat" build W
        if self.kind == "general":
            return general_scores(q, k, self.w.weight)
        # W [q; k] = W[:, :d_q] q + W[:, d_q:] k: the additive form, without concatenating
        # every (query, key) pair.
        assert self.v is not None  # "concat" builds v
        w = self.w.weight
        return additive_scores(q, k, w[:, : self.query_dim], w[:, self.query_dim :], self.v.weight[0])

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, kind={self.kind!r}"
