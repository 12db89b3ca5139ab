"""The definition of correctness: attention in float64, written as plainly as the formula
``softmax(q kᵀ · scale + bias, masked) v``, materialising every score. Every kernel and
module is tested against it.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` / ``s_k``
query / key length, ``d`` / ``d_v`` head dims.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    allowed: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out [b, h, s_q, d_v], weights [b, h, s_q, s_k], lse [b, h, s_q])`` in float64.

    ``allowed`` is a bool tensor broadcastable to ``[b, h, s_q, s_k]`` (True = may attend);
    a row with nothing allowed gets zero weights, a zero output and ``lse = -inf``. Keys and
    values of ``h_kv`` heads serve ``h / h_kv`` query heads each. Differentiable (no NaN in
    gradients).
    """
    q, k, v = q.double(), k.double(), v.double()
    h, h_kv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // h_kv, dim=1)  # the reference may copy per head
    v = v.repeat_interleave(h // h_kv, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias.double()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.amax(-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)
    total = exp.sum(-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    weights = exp / safe
    lse = torch.where(total > 0, torch.log(safe) + row_max, torch.full_like(total, float("-inf"))).squeeze(-1)
    return weights @ v, weights, lse


def naive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    allowed: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`dense_attention` without the log-sum-exp: ``(out, weights)`` in float64."""
    out, weights, _ = dense_attention(q, k, v, allowed=allowed, bias=bias, scale=scale)
    return out, weights


def causal_allowed(s_q: int, s_k: int) -> Tensor:
    """Bottom-right causal ``[s_q, s_k]``: query row i may see keys ``<= i + s_k - s_q``."""
    return torch.arange(s_k).view(1, -1) <= torch.arange(s_q).view(-1, 1) + (s_k - s_q)
