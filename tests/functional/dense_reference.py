"""The definition of correctness for the long-sequence kernels: dense attention in float64,
``softmax(q kᵀ · scale + bias, masked) v``, materialising every score. Plain on purpose."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def dense_attention(
    q: Tensor, k: Tensor, v: Tensor, *, allowed: Tensor | None = None, bias: Tensor | None = None, scale: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out [b, h, s_q, d_v], weights [b, h, s_q, s_k], lse [b, h, s_q])`` in float64;
    a row with nothing allowed gets zero weights, a zero output and ``lse = -inf``.
    Differentiable (no NaN in gradients)."""
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


def causal_allowed(s_q: int, s_k: int) -> Tensor:
    """Bottom-right causal ``[s_q, s_k]``: query row i may see keys ``<= i + s_k - s_q``."""
    return torch.arange(s_k).view(1, -1) <= torch.arange(s_q).view(-1, 1) + (s_k - s_q)


def grads(out: Tensor, inputs: list[Tensor], seed: int = 0) -> list[Tensor]:
    """Gradients of ``sum(out * r)`` for a fixed random ``r``; unused inputs get zeros."""
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    got = torch.autograd.grad((out * r).sum(), inputs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, got)]


class LargestStorage(TorchDispatchMode):
    """Records the largest storage (bytes) of any tensor an operator returns — forward and
    backward — to check that no ``[s_q, s_k]`` tensor is ever built."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0
        self.op = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().nbytes() > self.nbytes:
                self.nbytes, self.op = t.untyped_storage().nbytes(), func
        return out
