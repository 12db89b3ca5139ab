"""Attention of a bridged model (:mod:`attnkit.models.families.bridge`): the attention function
attnkit registers in ``transformers``' ``AttentionInterface`` under the name
:data:`ATTENTION_NAME`, and the module each bridged layer's attention runs through.

``transformers`` 5 computes a layer's queries, keys and values itself (projections, per-head
norms, rotary encoding, its own KV cache), then calls the registered attention function
with them, its mask and the layer's options (``scaling``, ``sliding_window``, ``softcap``).
The function hands them to the layer's :class:`BridgedAttention`, a
:class:`attnkit.nn.MultiHeadAttention` without input projections: the same hook points
(``q``, ``k``, ``v``, ``scores``, ``pattern``, ``z``, ``result``), the same kernels, and the
weights formed only for the layers asked for. The output projection stays ``transformers``'
(``result`` is computed from it, by a forward hook).

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
positions, ``s_k`` key positions (cached ones included), ``d`` head dim, ``e`` model dim.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.nn.attention import AttentionConfig
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.weight_selection import WeightSelection

# The name of attnkit's function in transformers' AttentionInterface (``attn_implementation``).
ATTENTION_NAME = "attnkit"

# Keyword arguments transformers passes to attention functions that change nothing here:
# bookkeeping of its own cache and outputs.
_BOOKKEEPING = frozenset(
    {
        "use_cache",
        "output_router_logits",
        "output_attentions",
        "position_ids",
        "cache_position",
        "past_key_values",
        "past_key_value",
        "position_embeddings",
        "is_causal",
    }
)
# The options the bridge takes, with what each does.
_OPTIONS = frozenset({"dropout", "scaling", "sliding_window", "softcap"})


class BridgeRefused(ValueError):
    """What a bridged architecture does that the bridge cannot reproduce exactly."""


@dataclass(frozen=True)
class AttentionCall:
    """One call of the attention function during the probe forward
    (:func:`probing`): which module called, the shapes and the options it passed.

    Attributes:
        module: the ``transformers`` attention module.
        num_heads, num_kv_heads, head_dim: ``h``, ``h_kv``, ``d`` of its queries and keys.
        value_dim: the values' head dim.
        scale: ``scaling`` (``None``: ``1/√d``).
        window: ``sliding_window`` (``None``: none).
        softcap: ``softcap`` (``None``: none).
        causal: the module's ``is_causal``.
        output: what the function returned, ``[b, s_q, h, d]`` (to find the output
            projection that reads it).
    """

    module: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    value_dim: int
    scale: float | None
    window: int | None
    softcap: float | None
    causal: bool
    output: Tensor


@dataclass
class _Probe:
    calls: list[AttentionCall] = field(default_factory=list)


@dataclass(frozen=True)
class _WeightRequest:
    """The layers whose weights the current forward pass returns (each: every head's, or
    the part a :class:`attnkit.nn.WeightSelection` chooses), and where they go."""

    layers: Mapping[int, bool | WeightSelection]
    weights: dict[int, Tensor]


_PROBE: contextvars.ContextVar[_Probe | None] = contextvars.ContextVar("attnkit_bridge_probe", default=None)
_WEIGHTS: contextvars.ContextVar[_WeightRequest | None] = contextvars.ContextVar("attnkit_bridge_weights", default=None)


@contextlib.contextmanager
def probing() -> Iterator[list[AttentionCall]]:
    """Record every call of the attention function inside the block (the probe forward
    at load), computing each with attnkit's attention and no hook points."""
    probe = _Probe()
    token = _PROBE.set(probe)
    try:
        yield probe.calls
    finally:
        _PROBE.reset(token)


@contextlib.contextmanager
def returning_weights(layers: Collection[int] | Mapping[int, bool | WeightSelection]) -> Iterator[dict[int, Tensor]]:
    """Inside the block, the bridged attention of each layer in ``layers`` puts its weights
    ``[b, h, s_q, s_k]`` in the yielded dict (layer → weights), or for a layer mapped to a
    :class:`attnkit.nn.WeightSelection` those of its heads and rows alone: weights are
    handed back by the forward pass that formed them, never kept on a module."""
    request = _WeightRequest(layers if isinstance(layers, Mapping) else dict.fromkeys(layers, True), {})
    token = _WEIGHTS.set(request)
    try:
        yield request.weights
    finally:
        _WEIGHTS.reset(token)


class BridgedAttention(MultiHeadAttention):
    """The attention of one bridged layer: a :class:`attnkit.nn.MultiHeadAttention` whose
    queries, keys and values come from ``transformers`` (after its projections, norms and
    rotary encoding) and whose output goes back to it, through the same hook points and
    kernels as attnkit's own layers.

    It has no input projections: ``transformers`` computes them in its own code (fused in
    some architectures, followed by norms or clipping in others), so reading
    ``q_proj``, ``k_proj`` or ``v_proj`` raises :class:`BridgeRefused`. ``out_proj`` is the
    architecture's output projection, found by the probe.

    Args:
        call: what the probe saw this layer pass (:class:`AttentionCall`).
        embed_dim: the model dim ``e``.
        layer: the layer index, whose weights a run may ask for.
        label: the model's family label (``"bridge:olmo2"``), for messages.
        out_proj: the output projection (an ``nn.Linear`` reading ``[.., h · d]``), or
            ``None`` where the architecture has none attnkit can read.
    """

    def __init__(
        self, call: AttentionCall, *, embed_dim: int, layer: int, label: str, out_proj: nn.Linear | None
    ) -> None:
        config = AttentionConfig(
            embed_dim,
            call.num_heads,
            num_kv_heads=call.num_kv_heads,
            head_dim=call.head_dim,
            bias=False,
            scale=call.scale,
            softcap=call.softcap,
            window=call.window,
        )
        with torch.device("meta"):  # the projections it does not use take no memory
            super().__init__(config)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            delattr(self, name)
        # Not a submodule: the projection belongs to transformers' module tree.
        object.__setattr__(self, "_out_proj", out_proj)
        self.layer_index = layer
        self.label = label
        self.causal = call.causal

    @property
    def q_proj(self) -> nn.Linear:  # type: ignore[override]
        raise self._no_projection("q_proj", "W_Q")

    @property
    def k_proj(self) -> nn.Linear:  # type: ignore[override]
        raise self._no_projection("k_proj", "W_K")

    @property
    def v_proj(self) -> nn.Linear:  # type: ignore[override]
        raise self._no_projection("v_proj", "W_V")

    @property
    def out_proj(self) -> nn.Linear:  # type: ignore[override]
        projection = self.__dict__["_out_proj"]
        if projection is None:
            raise BridgeRefused(
                f"{self.label} layer {self.layer_index}: its output projection is not one linear map of the heads' "
                "outputs, so per-head results (result, W_O) are not available"
            )
        return projection

    @property
    def packable(self) -> bool:
        """Never: the projections are ``transformers``'."""
        return False

    def _no_projection(self, name: str, weight: str) -> BridgeRefused:
        return BridgeRefused(
            f"{self.label} computes its queries, keys and values in transformers' own code (projections, norms, "
            f"rotary encoding): {name} ({weight}) and points before the rotary encoding are not available; the "
            "hook points q, k and v hold them as attention receives them"
        )

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Attention as ``transformers`` asks for it, through this module's hook points.

        Args:
            q: queries ``[b, h, s_q, d]`` after the rotary encoding.
            k: keys ``[b, h_kv, s_k, d]``, ``s_k - s_q`` of them from ``transformers``' cache.
            v: values ``[b, h_kv, s_k, d]``.
            mask: ``transformers``' mask ``[b, 1, s_q, s_k']`` (bool ``True`` = may attend,
                or an additive float bias), or ``None`` for plain causal (or full) attention.

        Returns:
            The heads' outputs ``[b, s_q, h, d]``, as ``transformers`` reads them.

        Raises:
            BridgeRefused: a hook that replaced cached keys or values (``transformers``
                keeps its own cache), or a float mask of the wrong shape.
        """
        s_q, cached = q.shape[2], k.shape[2] - q.shape[2]
        q = self.q(q)
        k, v = _new_positions(self.k, k, cached, self.label), _new_positions(self.v, v, cached, self.label)
        boolean, bias = None, None
        if mask is not None:
            mask = mask[..., : k.shape[2]]  # [b, 1, s_q, s_k]
            if mask.dtype == torch.bool:
                boolean = mask
            else:
                bias = mask.to(q.dtype)
        causal = self.causal and mask is None and s_q > 1
        request = _WEIGHTS.get()
        wanted = False if request is None else request.layers.get(self.layer_index, False)
        # No attnkit KV cache here: transformers keeps its own.
        result = self._attend_step(
            q, k, v, mask=boolean, bias=bias, causal=causal, return_weights=wanted, kv_cache=None, position_bias=None
        )
        if wanted:
            assert request is not None and result.weights is not None
            request.weights[self.layer_index] = result.weights
        heads = self.z(result.output)  # [b, h, s_q, d]
        return heads.transpose(1, 2)  # [b, s_q, h, d]

    def result_hook(self, projection: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> Tensor:
        """A forward hook on the output projection: the ``result`` point, each head's share
        of the projection ``[b, h, s, e]`` (summed back, with the bias, if a hook replaced
        it)."""
        if not self.result.active:
            return output
        merged = inputs[0]  # [b, s, h · d]
        heads = merged.view(*merged.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)  # [b, h, s, d]
        return self._per_head_result(heads, output)


def _new_positions(point: nn.Module, t: Tensor, cached: int, label: str) -> Tensor:
    """The ``k`` or ``v`` point on the new positions of ``t [b, h_kv, s_k, d]`` (its last
    ``s_k - cached``), as attnkit's own layers call it."""
    if cached == 0:
        return point(t)
    new = t[:, :, cached:]
    replaced = point(new)
    if replaced is not new:
        raise BridgeRefused(
            f"a hook replaced {point.name or 'k or v'} while decoding with a cache; {label} keeps its keys and values "
            "in transformers' cache, which the bridge cannot change: hook them on a run without a cache"
        )
    return t


def attnkit_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The function attnkit registers in ``transformers``' ``AttentionInterface``: the
    layer's :class:`BridgedAttention` computes it (during the probe forward, attnkit's
    attention without hook points).

    Args:
        module: the ``transformers`` attention module that calls it.
        query: ``[b, h, s_q, d]``; key, value: ``[b, h_kv, s_k, d]``.
        attention_mask: ``[b, 1, s_q, s_k]`` bool or additive, or ``None``.
        kwargs: ``scaling``, ``sliding_window``, ``softcap``, ``dropout`` and
            ``transformers``' bookkeeping; anything else is refused.

    Returns:
        ``(output [b, s_q, h, d], None)``.

    Raises:
        BridgeRefused: an option attnkit does not reproduce (attention sinks, a position
            bias), or a module that the bridge did not probe.
    """
    unknown = sorted(
        name for name, value in kwargs.items() if name not in _OPTIONS | _BOOKKEEPING and value is not None
    )
    if unknown:
        raise BridgeRefused(
            f"{type(module).__name__} passes {', '.join(unknown)} to its attention function, which attnkit does not "
            "reproduce"
        )
    if kwargs.get("dropout"):
        raise BridgeRefused(
            f"{type(module).__name__} asks for attention dropout {kwargs['dropout']} (training mode); the bridge runs "
            "models in evaluation mode only"
        )
    probe = _PROBE.get()
    if probe is not None:
        return _probe_call(probe, module, query, key, value, attention_mask, kwargs), None
    bridged = module.__dict__.get("_attnkit_bridge")
    if not isinstance(bridged, BridgedAttention):
        raise BridgeRefused(
            f"attn_implementation={ATTENTION_NAME!r} runs only in models loaded by attnkit.models.load, got a call "
            f"from {type(module).__name__}"
        )
    for name, expected in (
        ("scaling", bridged.scale),
        ("sliding_window", bridged.window),
        ("softcap", bridged.softcap),
    ):
        if kwargs.get(name) != expected:
            raise BridgeRefused(
                f"{bridged.label} layer {bridged.layer_index} passed {name}={kwargs.get(name)!r} where the probe saw "
                f"{expected!r}: its attention options change between calls, which the bridge does not follow"
            )
    return bridged.attend(query, key, value, attention_mask), None


def _probe_call(
    probe: _Probe,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    kwargs: dict[str, Any],
) -> Tensor:
    """Record one call of the probe forward and compute it with a plain attention module of
    the same options."""
    if query.shape[-1] != key.shape[-1] or value.shape[-1] != key.shape[-1]:
        raise BridgeRefused(
            f"{type(module).__name__} gives queries, keys and values of different head dims "
            f"({query.shape[-1]}, {key.shape[-1]}, {value.shape[-1]}), which attnkit's heads do not take"
        )
    call = AttentionCall(
        module=module,
        num_heads=query.shape[1],
        num_kv_heads=key.shape[1],
        head_dim=query.shape[-1],
        value_dim=value.shape[-1],
        scale=kwargs.get("scaling"),
        window=kwargs.get("sliding_window"),
        softcap=kwargs.get("softcap"),
        causal=bool(getattr(module, "is_causal", True)),
        output=query.new_empty(0),
    )
    plain = BridgedAttention(call, embed_dim=query.shape[1] * query.shape[-1], layer=-1, label="probe", out_proj=None)
    output = plain.attend(query, key, value, attention_mask)  # [b, s_q, h, d]
    probe.calls.append(AttentionCall(**{**call.__dict__, "output": output}))
    return output
