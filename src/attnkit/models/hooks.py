"""Named activations of attnkit's real models: read them (a cache) or replace them (hooks)
during a forward pass.

:meth:`attnkit.models.Model.run` takes ``cache=[names]``; :meth:`attnkit.models.Model.hooks`
installs functions that read or replace activations; :meth:`attnkit.models.Model.hook_names`
lists the names. A run that asks for neither takes the fused path of :mod:`attnkit.nn` and
pays nothing for them. A run that does goes through the written-out forward passes of
:func:`attnkit.models.llama.forward_with_hooks` and :func:`attnkit.models.bert.forward_with_hooks`,
which call the same modules in the same order, so that hooks returning their input leave
the results bit for bit the same.

Names, for layer ``i`` (shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value
heads, ``s`` tokens, ``d`` head dim, ``e`` model dim):

==============================  ================  ===================================================
name                            shape             what
==============================  ================  ===================================================
``layers.i.resid_pre``          ``[b, s, e]``     the residual stream into the layer
``layers.i.attn.q``             ``[b, h, s, d]``  queries per head (after the rotation, LLaMA)
``layers.i.attn.k``             ``[b, h_kv, s, d]``  keys per key/value head (after the rotation)
``layers.i.attn.v``             ``[b, h_kv, s, d]``  values per key/value head
``layers.i.attn.pattern``       ``[b, h, s, s]``  attention weights, queries as rows
``layers.i.attn.z``             ``[b, h, s, d]``  each head's output, before the output projection
``layers.i.attn_out``           ``[b, s, e]``     the attention block's output (after the projection)
``layers.i.resid_mid``          ``[b, s, e]``     the residual stream after attention (normalised, BERT)
``layers.i.mlp_out``            ``[b, s, e]``     the feed-forward block's output
``layers.i.resid_post``         ``[b, s, e]``     the residual stream out of the layer (normalised, BERT)
``final``                       ``[b, s, e]``     the last hidden states (after the final norm, LLaMA)
==============================  ================  ===================================================

A hook is a function of the activation that returns ``None`` (it only reads) or a tensor
that replaces it. A replaced ``pattern`` is multiplied with the values to give ``z``; a
replacement may change the batch size (to run variants of one text side by side) but not
the other dimensions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from torch import Tensor

from attnkit.functional import attention
from attnkit.nn import MultiHeadAttention

HookFn = Callable[[Tensor], "Tensor | None"]

# The per-layer names, in the order a forward pass meets them.
LAYER_HOOKS = (
    "resid_pre",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.pattern",
    "attn.z",
    "attn_out",
    "resid_mid",
    "mlp_out",
    "resid_post",
)


def hook_names(num_layers: int) -> list[str]:
    """Every hook name of a model with ``num_layers`` layers, in forward order."""
    return [f"layers.{i}.{name}" for i in range(num_layers) for name in LAYER_HOOKS] + ["final"]


@dataclass
class HookPoints:
    """The hooks and cache of one forward pass: called at every named activation.

    Attributes:
        hooks: name → functions applied in order; each returns ``None`` or a replacement.
        cache_names: names whose (possibly replaced) activation to keep.
        weights_layers: layers whose attention pattern is computed even without a hook
            on it (the weights a run was asked for).
        cache: what was kept, filled during the pass.
    """

    hooks: Mapping[str, list[HookFn]]
    cache_names: Collection[str] = ()
    weights_layers: Collection[int] = ()
    cache: dict[str, Tensor] = field(default_factory=dict)

    def __call__(self, name: str, activation: Tensor) -> Tensor:
        """The activation after the hooks of ``name``, recorded if asked for."""
        for fn in self.hooks.get(name, ()):
            replaced = fn(activation)
            if replaced is not None:
                if not isinstance(replaced, Tensor) or replaced.shape[1:] != activation.shape[1:]:
                    got = list(replaced.shape) if isinstance(replaced, Tensor) else type(replaced).__name__
                    raise ValueError(
                        f"hook on {name!r} must return None or a tensor shaped like its input "
                        f"[b, {', '.join(map(str, activation.shape[1:]))}], got {got}"
                    )
                activation = replaced
        if name in self.cache_names:
            self.cache[name] = activation
        return activation

    def wants_pattern(self, layer: int) -> bool:
        """Whether layer ``layer`` must materialise its attention weights."""
        name = f"layers.{layer}.attn.pattern"
        return layer in self.weights_layers or name in self.hooks or name in self.cache_names


def attention_block(attn: MultiHeadAttention, x: Tensor, hook: HookPoints, layer: int, *, causal: bool) -> Tensor:
    """Self-attention of one layer, step by step, with its hook points.

    Args:
        attn: the layer's attention module.
        x: its input ``[b, s, e]`` (already normalised in a pre-norm layer).
        hook: the pass's hook points.
        layer: the layer's index, for the names.
        causal: whether each token sees only itself and earlier tokens.

    Returns:
        The block's output ``[b, s, e]`` (before the residual sum).
    """
    prefix = f"layers.{layer}.attn."
    s = x.shape[1]
    # The projections and rotation of the fused path (packed into one product when it is).
    q, k, v = attn._self_projections(x, None, 0)  # [b, h, s, d], [b, h_kv, s, d] x 2
    q, k, v = hook(prefix + "q", q), hook(prefix + "k", k), hook(prefix + "v", v)
    if hook.wants_pattern(layer):
        result = attention(q, k, v, causal=causal, score=attn.score, return_weights=True)
        pattern = hook(prefix + "pattern", result.weights)  # [b, h, s, s]
        z = result.output if pattern is result.weights else pattern @ _repeat_kv(v, attn.num_heads)  # [b, h, s, d]
    else:
        z = attention(q, k, v, causal=causal, score=attn.score)  # [b, h, s, d]
    z = hook(prefix + "z", z)
    return attn.out_proj(z.transpose(1, 2).reshape(z.shape[0], s, attn.num_heads * attn.head_dim))  # [b, s, e]


def _repeat_kv(v: Tensor, num_heads: int) -> Tensor:
    """``[b, h_kv, s, d]`` → ``[b, h, s, d]``: each key/value head serves ``h / h_kv``
    consecutive query heads."""
    return v.repeat_interleave(num_heads // v.shape[1], dim=1)
