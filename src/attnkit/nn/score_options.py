"""What an attention layer forms its scores with besides its queries, keys, mask and bias:
the score, its scale, logit soft-capping and a sliding window, applied the same way by each
path that forms them (the fused pass, the pattern alone for hooks and caches, the chosen rows'
weights).

Shape letters: ``b`` batch, ``h`` query heads, ``s_q`` query length, ``s_k`` key length,
``d`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import Tensor

from attnkit.functional.masks import INDEX_MAX, Mask, sliding_window
from attnkit.functional.scores import dot_scores, resolve_scale
from attnkit.nn.rnn_attention import AttentionScore

Score = Literal["scaled_dot", "dot"] | AttentionScore
ScoreCall = Literal["scaled_dot", "dot"] | Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ScoreOptions:
    """The options of :class:`attnkit.nn.MultiHeadAttention` that shape its scores, as
    values (a cache that computes a pattern later keeps them: changing the module's
    afterwards does not change it).

    Attributes:
        score: ``"scaled_dot"``, ``"dot"`` or a score module (additive, Luong).
        scale: multiplies the scores; ``None``: ``1/√d`` for ``"scaled_dot"``, 1 otherwise.
        softcap: soft-caps the scaled scores to ``softcap · tanh(scores / softcap)``.
        window: each query sees the ``window`` keys ending at its own position.
    """

    score: Score
    scale: float | None
    softcap: float | None
    window: int | None

    def scale_for(self, head_dim: int) -> float:
        """The scale of the scores of heads of ``head_dim``: the given one, or ``1/√d`` for
        ``"scaled_dot"`` (as :func:`attnkit.functional.attention` forms it), 1 otherwise."""
        return resolve_scale(self.scale, head_dim) if self.scale is not None or self.score == "scaled_dot" else 1.0

    def score_and_scale(self, head_dim: int) -> tuple[ScoreCall, float]:
        """The ``score`` and ``scale`` a functional call takes: with ``softcap``, a score
        function of the scaled, capped scores (:func:`softcapped_scores`) and a scale of 1."""
        score: ScoreCall = self.score.scores if isinstance(self.score, AttentionScore) else self.score
        scale = self.scale_for(head_dim)
        if self.softcap is None:
            return score, scale
        return partial(softcapped_scores, scale=scale, softcap=self.softcap), 1.0

    def windowed(self, mask: Mask | Tensor | None, s_q: int, s_k: int) -> Mask | Tensor | None:
        """``mask`` joined by the sliding window once there are more than ``window`` keys."""
        if self.window is None or s_k <= self.window:
            return mask
        return with_window(mask, self.window, s_q, s_k)


def softcapped_scores(q: Tensor, k: Tensor, *, scale: float, softcap: float) -> Tensor:
    """``softcap · tanh(q·k · scale / softcap)``, ``[b, h, s_q, s_k]``.

    The queries take ``scale / softcap`` before the product: one pass over ``[b, h, s_q, d]``
    instead of two over ``[b, h, s_q, s_k]`` (Gemma 2 scales and divides the scores; the
    results differ from its order of operations in the last bits only)."""
    return torch.tanh(dot_scores(q * (scale / softcap), k)) * softcap


def with_window(mask: Mask | Tensor | None, window: int, s_q: int, s_k: int) -> Mask | Tensor:
    """``mask`` and a sliding window that keeps the ``window`` keys ending at each query."""
    # Keys later than the query are the causal mask's business, not the window's.
    recent = sliding_window(window - 1, INDEX_MAX)
    if mask is None:
        return recent
    if isinstance(mask, Mask):
        return mask & recent
    return mask & recent.to_dense(s_q, s_k, device=mask.device)
