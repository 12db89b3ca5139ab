"""Attention maps of a real model by method: beyond the raw weights, what flows through them.

- ``raw``: the attention weights ``α``.
- ``rollout`` and ``flow``: every layer below, merged (:mod:`attnkit.inspect.rollout`).
- ``value``: value-weighted attention (Kobayashi et al., 2020), ``‖α_ij · f_h(x_j)‖`` with
  ``f_h(x) = (x W_V^h + b_V^h) W_O^h``: how much head ``h`` actually moves from token ``j``
  to token ``i``, weight times the norm of what ``j`` sends; and over all heads,
  ``‖Σ_h α_ij^h f_h(x_j)‖``. Weight on tokens that send little (often the first token)
  shrinks.
- ``grad``: ``α ⊙ ∂target/∂α``, the weights times the gradient of a target with respect to
  them: the log-probability of a target token at the last position (causal models), or the
  cosine between the text's sentence embedding and a target text's (encoders).

Shape letters: ``L`` layers, ``h`` heads, ``h_kv`` key/value heads, ``s`` tokens, ``d``
head dim, ``e`` model dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit.inspect.maps import LEVELS, AttentionMap, attention_map, resolve_heads, resolve_layer
from attnkit.inspect.names import METHODS
from attnkit.inspect.readouts import readout
from attnkit.inspect.rollout import attention_flow, attention_rollout

if TYPE_CHECKING:
    from attnkit.models import Model

DESCRIPTIONS = {
    "raw": "attention weight",
    "rollout": "attention rollout (layers below merged, residual kept)",
    "flow": "attention flow (maximum flow through the layers below)",
    "value": "value-weighted attention ‖α·f(x)‖",
    "grad": "gradient-weighted attention α·∂target/∂α",
}

# Query rows per step when summing value vectors over heads: bounds the [rows, s, e] buffer.
_SUM_CHUNK_ELEMENTS = 2**24


@dataclass(frozen=True)
class ValueWeighted:
    """Value-weighted attention of some layers.

    Attributes:
        heads: layer → ``[h, s, s]``, ``‖α_ij^h f_h(x_j)‖`` per head.
        summed: layer → ``[s, s]``, ``‖Σ_h α_ij^h f_h(x_j)‖``, the norm of the sum over heads.
        norms: layer → ``[h, s]``, ``‖f_h(x_j)‖``, what each key token sends through each head.
    """

    heads: dict[int, Tensor]
    summed: dict[int, Tensor]
    norms: dict[int, Tensor]


def method_map(
    model: Model,
    text: str,
    *,
    method: str = "raw",
    layer: int = -1,
    head: int | str | Sequence[int] | None = 0,
    level: str = "token",
    target: str | None = None,
    rows: range | slice | None = None,
) -> AttentionMap:
    """One layer's map of ``text`` by ``method``, as :func:`attnkit.inspect.attention_map`
    gives the raw weights.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        method: one of :data:`METHODS`.
        layer: the layer; negative counts from the end. Rollout and flow show what reaches
            this layer's outputs from the input tokens.
        head: a head index, several, or ``"all"``/``None`` (ignored by rollout and flow,
            which merge the heads).
        level: ``"token"``, or ``"word"`` (maps aggregated between words).
        target: for ``grad``, the target token (causal) or text (encoders).
        rows: for ``raw``, the query positions to keep (:func:`attnkit.inspect.attention_map`).

    Returns:
        :class:`attnkit.inspect.AttentionMap` with ``method`` set.

    Raises:
        ValueError: an unknown method or level, a missing target for ``grad``, rows with
            a method other than ``raw``, and the errors of the method.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if method == "grad" and target is None:
        raise ValueError("the grad method needs a target: a token (causal models) or a text (encoders)")
    if rows is not None and method != "raw":
        raise ValueError(f"rows are kept of the raw weights; the {method} method shows every row")
    layer = resolve_layer(layer, model.num_layers)
    heads = resolve_heads(head, model.num_heads)
    raw = attention_map(model, text, layer=layer, head=heads, rows=rows)
    if method == "raw":
        weights = raw.weights
    elif method == "rollout":
        weights, heads = rollout(model, text)[layer][None], []  # [1, s, s]
    elif method == "flow":
        weights, heads = flow(model, text, layer=layer)[None], []  # [1, s, s]
    elif method == "value":
        weights = value_weighted(model, text, layers=[layer]).heads[layer][heads]  # [h, s, s]
    else:
        assert target is not None  # checked above for the grad method
        weights = gradient_weighted(model, text, target, layers=[layer])[layer][heads]  # [h, s, s]
    amap = replace(raw, weights=weights, heads=heads, method=method)
    return amap.by_words() if level == "word" else amap


def rollout(model: Model, text: str, *, head_reduction: str = "mean", residual_weight: float = 0.5) -> Tensor:
    """Attention rollout of ``text`` up to every layer of ``model``.

    Returns:
        ``[L, s, s]`` (:func:`attnkit.inspect.rollout.attention_rollout`).

    Raises:
        ValueError: the model refuses the text, or an option out of range.
    """
    return attention_rollout(_all_weights(model, text), head_reduction=head_reduction, residual_weight=residual_weight)


def flow(
    model: Model, text: str, *, layer: int = -1, head_reduction: str = "mean", residual_weight: float = 0.5
) -> Tensor:
    """Attention flow of ``text`` to the outputs of one layer of ``model``.

    Returns:
        ``[s, s]`` (:func:`attnkit.inspect.rollout.attention_flow`).

    Raises:
        ValueError: more than :data:`attnkit.inspect.rollout.FLOW_MAX_TOKENS` tokens, a
            layer out of range, or an option out of range.
    """
    weights = _all_weights(model, text)
    return attention_flow(weights, layer=layer, head_reduction=head_reduction, residual_weight=residual_weight)


def value_weighted(model: Model, text: str, *, layers: Sequence[int] | None = None) -> ValueWeighted:
    """Value-weighted attention (Kobayashi et al., 2020) of ``text``, from each layer's
    actual values and output projection.

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        layers: layer indices (negative from the end); default all.

    Returns:
        :class:`ValueWeighted` (float32).

    Raises:
        ValueError: the model refuses the text, or a layer out of range.
    """
    layer_list = model.layer_indices(layers)
    run = model.run(
        text,
        return_weights=layer_list,
        names_filter=[model.hook_name("self_attn.v", i) for i in layer_list],
        logits=False,
    )
    heads, summed, norms = {}, {}, {}
    for i in layer_list:
        attn = model.module.self_attention(i)
        h, d = attn.num_heads, attn.head_dim
        v = run.cache[model.hook_name("self_attn.v", i)][0].double()  # [h_kv, s, d]
        v = v.repeat_interleave(h // v.shape[0], dim=0)  # [h, s, d]
        w_o = attn.out_proj.weight.double().view(-1, h, d).permute(1, 2, 0)  # [h, d, e]
        sent = v @ w_o  # [h, s, e]: f_h(x_j), what token j sends through head h
        alpha = run.attentions[i][0].double()  # [h, s, s]
        norms[i] = sent.norm(dim=-1)  # [h, s]
        heads[i] = (alpha * norms[i][:, None, :]).float()  # [h, s, s]
        summed[i] = _norm_of_head_sum(alpha, sent).float()  # [s, s]
        norms[i] = norms[i].float()
    return ValueWeighted(heads, summed, norms)


def gradient_weighted(
    model: Model, text: str, target: str, *, layers: Sequence[int] | None = None
) -> dict[int, Tensor]:
    """``α ⊙ ∂target/∂α`` for every head of some layers.

    The target is the log-probability of the token ``target`` after ``text`` (causal
    models), or the cosine between the sentence embeddings of ``text`` and of the text
    ``target`` (encoders), as the model's :func:`attnkit.inspect.readouts.readout` says. Each layer's weights are taken as given (the gradient does not
    flow on into the queries and keys that made them).

    Args:
        model: an :mod:`attnkit.models` model.
        text: the input.
        target: a single token (causal; leading space included, ``" Paris"``) or a text
            (encoders).
        layers: layer indices (negative from the end); default all.

    Returns:
        layer → ``[h, s, s]`` float32.

    Raises:
        ValueError: the model refuses the text, a target that is not a single token (the
            message says how it tokenises), a layer out of range.
    """
    layer_list = model.layer_indices(layers)
    ids = model.tokenize(text).ids
    value_of = readout(model).gradient_target(model, target)  # [1, s, e] → a scalar
    patterns: dict[int, Tensor] = {}

    def keep(layer: int):
        def hook(pattern: Tensor) -> Tensor:
            # A copy that z is then computed from, so that the gradient reaches it through
            # everything downstream, later layers' weights included.
            patterns[layer] = pattern.clone()
            return patterns[layer]

        return hook

    with torch.enable_grad():
        hooks = {model.hook_name("self_attn.pattern", i): keep(i) for i in layer_list}
        hidden = model.run_with_hooks(ids, hooks=hooks, logits=False).last_hidden_state  # [1, s, e]
        value = value_of(hidden)
        grads = torch.autograd.grad(value, [patterns[i] for i in layer_list])
    return {i: (patterns[i] * g)[0].detach().float() for i, g in zip(layer_list, grads)}


def _norm_of_head_sum(alpha: Tensor, sent: Tensor) -> Tensor:
    """``‖Σ_h α[h, i, j] sent[h, j]‖`` for every ``i, j``: ``alpha [h, s, s]``,
    ``sent [h, s, e]`` → ``[s, s]``, a few query rows at a time."""
    h, s, e = sent.shape
    rows = max(1, _SUM_CHUNK_ELEMENTS // (s * e))
    out = []
    for start in range(0, s, rows):
        mixed = torch.einsum("hij,hje->ije", alpha[:, start : start + rows], sent)  # [rows, s, e]
        out.append(mixed.norm(dim=-1))
    return torch.cat(out)


def _all_weights(model: Model, text: str) -> Tensor:
    """Every layer's weights of ``text``, ``[L, h, s, s]``."""
    run = model.run(text, return_weights=True, logits=False)
    return torch.cat([run.attentions[i] for i in range(model.num_layers)])
