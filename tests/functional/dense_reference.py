"""Helpers of the kernel tests: the float64 reference (:mod:`tests.reference`, the one
definition of correctness), gradients against a fixed direction, and the largest tensor an
operator builds."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.reference import causal_allowed, dense_attention

__all__ = ["LargestStorage", "causal_allowed", "dense_attention", "grads"]


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
