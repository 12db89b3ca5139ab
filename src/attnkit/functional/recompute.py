"""The autograd function that local attention (:mod:`attnkit.functional.local`) and ring
attention (:mod:`attnkit.distributed.ring`) share: a forward pass that returns
``(out, lse)`` and keeps nothing but its inputs, its output and the log-sum-exp, and a
backward pass that recomputes the attention blocks from them (FlashAttention's backward).

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k``
lengths, ``d``/``d_v`` head dims.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

_Plan = TypeVar("_Plan")


def recomputed_attention(
    forward: Callable[[_Plan, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
    backward: Callable[[_Plan, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]],
    plan: _Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
) -> tuple[Tensor, Tensor]:
    """``forward(plan, q, k, v)``, differentiable in ``q``, ``k`` and ``v`` through
    ``backward`` when a gradient is recorded (called directly otherwise).

    Args:
        forward: ``(plan, q, k, v) -> (out [b, h, s_q, d_v], lse [b, h, s_q])``.
        backward: ``(plan, dout, q, k, v, out, lse) -> (dq, dk, dv)``, each the shape of
            its input; ``dout`` is contiguous.
        plan: what both passes need besides the tensors (a block geometry, a ring of ranks).
        q: ``[b, h, s_q, d]``.
        k: ``[b, h_kv, s_k, d]``.
        v: ``[b, h_kv, s_k, d_v]``.

    Returns:
        ``(out, lse)``; ``lse`` is not differentiable.
    """
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _RecomputedAttention.apply(q, k, v, plan, forward, backward)
    return forward(plan, q, k, v)


class _RecomputedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, plan: Any, forward: Callable, backward: Callable) -> Any:
        out, lse = forward(plan, q, k, v)
        ctx.plan, ctx.backward = plan, backward
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: Tensor, _dlse: Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.backward(ctx.plan, dout.contiguous(), q, k, v, out, lse)
        return dq, dk, dv, None, None, None
