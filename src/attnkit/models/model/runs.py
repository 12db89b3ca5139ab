"""What the runs of a :class:`attnkit.models.Model` return: :class:`ModelRun` (one text's
pass), :class:`HookedRun` (a batch through the hook points), and :class:`RunStopped`.

Shape letters: ``b`` batch, ``s`` number of tokens, ``h`` query heads, ``h_sel`` selected
heads, ``n_r`` selected query rows, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnkit.deprecation import deprecated_aliases
from attnkit.nn import ActivationCache, StackOutput


def returned_float(t: Tensor) -> Tensor:
    """A run's logits or hidden states as it hands them out: half precision (bfloat16,
    float16) widened to float32, float32 and float64 as they are (a float64 model's
    outputs keep the precision it was loaded for)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@deprecated_aliases(hidden_states="last_hidden_state", removed_in="0.3")
@dataclass(frozen=True)
class ModelRun:
    """What one forward pass of :meth:`Model.run` produced.

    Attributes:
        ids: token ids ``[1, s]``.
        tokens: the ``s`` token strings (see :class:`attnkit.models.TokenizedText`).
        offsets: each token's ``(start, end)`` character span in the text; ``None`` when
            the run was given ids rather than text.
        logits: next-token logits ``[1, s, v]`` (a causal decoder), or ``None`` (an
            encoder, or a run without them); float32, or float64 for a float64 model
            (:func:`returned_float`), as is ``last_hidden_state``.
        last_hidden_state: the last layer's output ``[1, s, e]`` (after the final norm of
            a decoder that has one, what the head reads).
        attentions: layer index → weights ``[1, h_sel, n_r, s]`` float32 of the selected
            heads on the selected rows, for the layers asked for; rows are queries,
            columns keys. A :class:`LayerAttentions`: ``attentions[-1]`` is the last
            layer's.
        heads: the selected head indices, in the order of dimension 1 of every map.
        rows: the query positions of dimension 2 of every map, ``range(s)`` unless the
            run chose some (``rows=``).
        cache: the activations asked for with ``names_filter=``, by name
            (:mod:`attnkit.nn.hooks`), batch dimension 1, in the model's dtype.
    """

    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]] | None
    logits: Tensor | None
    last_hidden_state: Tensor
    attentions: dict[int, Tensor]
    heads: list[int]
    rows: range
    cache: Mapping[str, Tensor] = field(default_factory=dict)


@deprecated_aliases(hidden_states="last_hidden_state", removed_in="0.3")
@dataclass(frozen=True)
class HookedRun:
    """What :meth:`Model.run_with_hooks` produced.

    Attributes:
        last_hidden_state: the last hidden states ``[b, s, e]`` (after the final norm of
            a decoder that has one).
        cache: the activations asked for, by name.
        logits: next-token logits ``[b, s, v]`` (a causal decoder), or ``None`` (an encoder).
    """

    last_hidden_state: Tensor
    cache: ActivationCache
    logits: Tensor | None


@dataclass(frozen=True)
class ForwardPass:
    """What the one forward path of every run (:meth:`attnkit.models.Model.run`,
    ``run_batch``, ``run_with_hooks``) produced, before each run keeps its part.

    Attributes:
        out: the network's :class:`attnkit.nn.StackOutput`: the last hidden states
            ``[b, s, e]`` and the weights of the layers asked for.
        logits: next-token logits ``[b, s, v]``, or ``None`` (not asked for, or a network
            without a head on these states).
        cache: the activations asked for, by name.
    """

    out: StackOutput
    logits: Tensor | None
    cache: ActivationCache


class RunStopped(RuntimeError):
    """A :meth:`Model.run_batch` pass ended early because its ``stop`` said so."""


def self_attention_weights(out: StackOutput, layer: int) -> Tensor:
    """The self-attention weights of ``layer`` in a network's result, which were asked for."""
    weights = out.weights[layer]
    assert weights is not None, f"layer {layer}'s weights were asked for and not returned"
    return weights.self_attention
