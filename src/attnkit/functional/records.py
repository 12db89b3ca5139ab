"""Typed records that attention calls hand back instead of storing state on modules."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class AttentionResult:
    """What one attention call computed.

    Attributes:
        output: ``[b, h, s_q, d_v]`` (or ``[s_q, d_v]`` for 2-D inputs).
        weights: post-softmax weights ``[b, h, s_q, s_k]`` (before dropout), zero on rows
            that could attend to nothing; ``None`` when they were not computed.
        lse: log-sum-exp of each query's scaled scores ``[b, h, s_q]`` (``-inf`` on fully
            masked rows), when the kernel provides it; enough to recompute any weight later.
    """

    output: Tensor
    weights: Tensor | None = None
    lse: Tensor | None = None
