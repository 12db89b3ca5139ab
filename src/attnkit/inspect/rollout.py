"""Attention rollout and attention flow (Abnar & Zuidema, 2020): how much each output token
of a layer draws on each input token, through every layer below it.

Raw weights say where one head of one layer looks; but a layer's keys are themselves mixtures
of the layer below, and the residual connection carries each token past the attention.
Both methods first merge each layer's heads into one matrix that keeps the residual path,

    A_l = residual_weight · I + (1 - residual_weight) · reduce_heads(W_l), rows renormalised,

then combine the layers:

- **rollout** multiplies them from the first layer up: ``R_l = A_l · R_{l-1}``,
  ``R_0 = A_0``. Row ``i`` of ``R_l`` is the share of output ``i`` of layer ``l`` that comes
  from each input token, if attention mixed linearly.
- **flow** treats the layers as a graph: node ``(l, j)`` is token ``j`` entering layer
  ``l``; the edge from ``(l, j)`` to ``(l + 1, i)`` has capacity ``A_l[i, j]``. The flow
  from input ``j`` to output ``i`` is the maximum flow between those two nodes. It costs one
  maximum-flow problem per pair of tokens (solved by
  :func:`attnkit.inspect.layered_flow.layered_max_flows`), so it is limited to
  :data:`FLOW_MAX_TOKENS`.

Shape letters: ``L`` layers, ``h`` heads, ``s`` tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional.indices import normalize_index
from attnkit.inspect.names import FLOW_MAX_TOKENS

HEAD_REDUCTIONS = ("mean", "max", "min")


def layer_matrices(weights: Tensor, *, head_reduction: str = "mean", residual_weight: float = 0.5) -> Tensor:
    """Each layer's heads merged into one matrix with the residual path added.

    Args:
        weights: ``[L, h, s, s]`` attention of one text, queries as rows.
        head_reduction: ``"mean"``, ``"max"`` or ``"min"`` over the heads.
        residual_weight: the weight of the identity, in ``[0, 1]``.

    Returns:
        ``[L, s, s]`` float64, rows summing to 1.

    Raises:
        ValueError: weights not ``[L, h, s, s]``, an unknown reduction, a residual weight
            outside ``[0, 1]``.
    """
    if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be [layers, heads, s, s], got shape {list(weights.shape)}")
    if head_reduction not in HEAD_REDUCTIONS:
        raise ValueError(f"head_reduction must be one of {', '.join(HEAD_REDUCTIONS)}, got {head_reduction!r}")
    if not 0.0 <= residual_weight <= 1.0:
        raise ValueError(f"residual_weight must be in [0, 1], got {residual_weight}")
    w = weights.double()
    reduced = {"mean": lambda: w.mean(1), "max": lambda: w.amax(1), "min": lambda: w.amin(1)}[head_reduction]()
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)  # [s, s]
    a = residual_weight * eye + (1.0 - residual_weight) * reduced  # [L, s, s]
    return a / a.sum(-1, keepdim=True)


def attention_rollout(weights: Tensor, *, head_reduction: str = "mean", residual_weight: float = 0.5) -> Tensor:
    """Attention rollout up to every layer.

    Args:
        weights: ``[L, h, s, s]`` attention of one text.
        head_reduction: ``"mean"``, ``"max"`` or ``"min"`` over the heads.
        residual_weight: the weight of the identity in each layer's matrix.

    Returns:
        ``[L, s, s]`` float32: entry ``[l, i, j]`` is how much output ``i`` of layer ``l``
        draws on input token ``j``; rows sum to 1.

    Raises:
        ValueError: as :func:`layer_matrices`.
    """
    a = layer_matrices(weights, head_reduction=head_reduction, residual_weight=residual_weight)  # [L, s, s]
    rollouts = [a[0]]
    for layer in range(1, a.shape[0]):
        rollouts.append(a[layer] @ rollouts[-1])  # [s, s]
    return torch.stack(rollouts).float()  # [L, s, s]


def attention_flow(
    weights: Tensor, *, layer: int = -1, head_reduction: str = "mean", residual_weight: float = 0.5
) -> Tensor:
    """Attention flow from every input token to every output of one layer.

    Args:
        weights: ``[L, h, s, s]`` attention of one text, ``s <= FLOW_MAX_TOKENS``.
        layer: the layer whose outputs are the sinks (negative counts from the end).
        head_reduction: ``"mean"``, ``"max"`` or ``"min"`` over the heads.
        residual_weight: the weight of the identity in each layer's matrix.

    Returns:
        ``[s, s]`` float32: entry ``[i, j]`` is the maximum flow from input token ``j`` to
        output ``i`` of ``layer``.

    Raises:
        ValueError: more than :data:`FLOW_MAX_TOKENS` tokens, a layer out of range, or as
            :func:`layer_matrices`.
    """
    from attnkit.inspect.layered_flow import layered_max_flows

    a = layer_matrices(weights, head_reduction=head_reduction, residual_weight=residual_weight)  # [L, s, s]
    num_layers, s = a.shape[0], a.shape[-1]
    if s > FLOW_MAX_TOKENS:
        raise ValueError(
            f"attention flow solves one maximum-flow problem per pair of tokens and takes at most "
            f"{FLOW_MAX_TOKENS} tokens, got {s}; use rollout for longer texts"
        )
    layer = normalize_index(layer, num_layers, "layer", context=f"the weights have {num_layers} layers")
    # A pair without a path (a later token, in a causal model) has no flow: rollout, the
    # product of the same matrices, is zero there.
    connected = attention_rollout(weights, head_reduction=head_reduction, residual_weight=residual_weight)[layer] > 0
    pairs = connected.nonzero().numpy()  # [n, 2] rows (i, j)
    flow = torch.zeros(s, s, dtype=torch.float64)
    flow[connected] = torch.from_numpy(layered_max_flows(a[: layer + 1].cpu().numpy(), pairs))
    return flow.float()
