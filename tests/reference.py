"""The definition of correctness: naive attention in float64, written as plainly as the
formula ``softmax(q kᵀ * scale + bias, masked) v``, one query head at a time."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def naive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    allowed: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Return ``(output [b, h, s_q, d_v], weights [b, h, s_q, s_k])`` in float64.

    ``allowed`` is a bool tensor broadcastable to ``[b, h, s_q, s_k]`` (True = may attend);
    a query with nothing allowed gets zero weights and a zero output.
    """
    q, k, v = q.double(), k.double(), v.double()
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = h // h_kv
    out = torch.zeros(b, h, s_q, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(b, h, s_q, s_k, dtype=torch.float64)
    full_allowed = (
        torch.ones(b, h, s_q, s_k, dtype=torch.bool) if allowed is None else allowed.expand(b, h, s_q, s_k)
    )
    full_bias = torch.zeros(b, h, s_q, s_k, dtype=torch.float64) if bias is None else bias.double().expand(b, h, s_q, s_k)
    for bi in range(b):
        for hi in range(h):
            kv_head = hi // group
            scores = q[bi, hi] @ k[bi, kv_head].T * scale + full_bias[bi, hi]
            scores = scores.masked_fill(~full_allowed[bi, hi], float("-inf"))
            for i in range(s_q):
                if torch.isfinite(scores[i]).any():
                    w = torch.softmax(scores[i], dim=-1)
                    weights[bi, hi, i] = w
                    out[bi, hi, i] = w @ v[bi, kv_head]
    return out, weights


def causal_allowed(s_q: int, s_k: int) -> Tensor:
    """Bottom-right causal mask ``[s_q, s_k]``: row i may see keys <= i + s_k - s_q."""
    rows = torch.arange(s_q).unsqueeze(1) + (s_k - s_q)
    return torch.arange(s_k).unsqueeze(0) <= rows
