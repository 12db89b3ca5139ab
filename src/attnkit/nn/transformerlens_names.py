"""TransformerLens' hook names as aliases of attnkit's hook points, in one table.

A TransformerLens (TL) notebook names ``blocks.3.attn.hook_z`` where attnkit names
``decoder.layers.3.self_attn.z``; every place that takes a hook name (hooks, permanent
hooks, ``run_with_hooks``, caches and their ``names_filter``, cache lookups) accepts both.
Under a TL name the per-head activations have TL's layout, positions before heads
(``[b, s, h, d]``; ``result``: ``[b, s, h, e]``): a transposed view of attnkit's
``[b, h, s, d]``, no copy, so that TL's ``z[:, :, 3] = 0`` zeroes head 3 and a tensor a hook
returns in TL's layout is laid back into attnkit's. Under attnkit's names nothing changes.

:func:`get_act_name` is TL's ``utils.get_act_name``: the full TL name of a short one
(``get_act_name("z", 3) == "blocks.3.attn.hook_z"``). :func:`transformerlens_aliases` maps
the TL names of a model's points to the points.

Torch-free: names only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["TransformerLensHook", "TransformerLensName", "get_act_name", "transformerlens_aliases"]


@dataclass(frozen=True)
class TransformerLensName:
    """What a TL name stands for.

    Attributes:
        point: attnkit's name of the point.
        heads_second: whether the activation is per head, which TL lays out positions
            before heads: TL's tensor is attnkit's with dims 1 and 2 swapped.
    """

    point: str
    heads_second: bool


# TL's name inside a block → attnkit's names of that point inside a layer, the first that
# the model has (a rotary model's queries and keys before the rotation have points of their
# own; without a rotation TL's hook_q is the queries), and whether it is per head.
_IN_LAYER: dict[str, tuple[tuple[str, ...], bool]] = {
    "hook_resid_pre": (("resid_pre",), False),
    "hook_resid_mid": (("resid_mid",), False),
    "hook_resid_post": (("resid_post",), False),
    "hook_attn_out": (("attn_out",), False),
    "hook_mlp_out": (("mlp_out",), False),
    "attn.hook_q": (("self_attn.q_unrotated", "self_attn.q"), True),
    "attn.hook_k": (("self_attn.k_unrotated", "self_attn.k"), True),
    "attn.hook_v": (("self_attn.v",), True),
    "attn.hook_rot_q": (("self_attn.q",), True),
    "attn.hook_rot_k": (("self_attn.k",), True),
    "attn.hook_z": (("self_attn.z",), True),
    "attn.hook_result": (("self_attn.result",), True),
    "attn.hook_attn_scores": (("self_attn.scores",), False),
    "attn.hook_pattern": (("self_attn.pattern",), False),
    "mlp.hook_pre": (("ff.pre",), False),
    "mlp.hook_post": (("ff.post",), False),
    "ln1.hook_scale": (("self_attn_norm.scale",), False),
    "ln2.hook_scale": (("ff_norm.scale",), False),
}

# TL's names outside the blocks → the end of attnkit's name (after a stack's prefix).
_OUTSIDE: dict[str, str] = {
    "hook_embed": "embed",
    "ln_final.hook_scale": "final_norm.scale",
    "ln_final.hook_normalized": "final",
}

_IN_A_LAYER = re.compile(r"^(?P<stack>(?:.*\.)?)layers\.(?P<layer>\d+)\.(?P<local>.+)$")


def transformerlens_aliases(names: Iterable[str]) -> dict[str, TransformerLensName]:
    """TL's name → the point it stands for, over a model's point names (in module order).

    A model with one stack of layers has every alias; where two stacks would give one TL
    name (an encoder–decoder's encoder and decoder), the name is left out.
    """
    return dict(_aliases(tuple(names)))


@functools.lru_cache(maxsize=16)
def _aliases(names: tuple[str, ...]) -> tuple[tuple[str, TransformerLensName], ...]:
    known = set(names)
    found: dict[str, list[TransformerLensName]] = {}
    layers = dict.fromkeys((m["stack"], m["layer"]) for name in names if (m := _IN_A_LAYER.match(name)))
    for prefix, layer in layers:
        for tl_local, (candidates, per_head) in _IN_LAYER.items():
            points = [f"{prefix}layers.{layer}.{c}" for c in candidates]
            point = next((p for p in points if p in known), None)
            if point is not None:
                found.setdefault(f"blocks.{layer}.{tl_local}", []).append(TransformerLensName(point, per_head))
    for tl_name, end in _OUTSIDE.items():
        for name in names:
            if (name == end or name.endswith("." + end)) and _IN_A_LAYER.match(name) is None:
                found.setdefault(tl_name, []).append(TransformerLensName(name, False))
    return tuple((tl_name, aliases[0]) for tl_name, aliases in found.items() if len(aliases) == 1)


@dataclass(frozen=True)
class TransformerLensHook:
    """What a hook registered under a TL name receives as its ``hook`` argument, as TL's
    ``HookPoint``: :attr:`name` is the TL name and :meth:`layer` the layer index.

    Attributes:
        name: the TL name the hook was registered under.
        point: attnkit's name of the point.
        layer_index: the layer, or ``None`` outside the blocks.
    """

    name: str
    point: str
    layer_index: int | None

    def layer(self) -> int | None:
        """The layer index (TL's ``hook.layer()``)."""
        return self.layer_index


_ACT_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}
_LAYER_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
_ATTENTION_NAMES = {"k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores"}
_MLP_NAMES = {"pre", "post", "mid", "pre_linear"}
_SHORT_WITH_LAYER = re.compile(r"([a-z]+)(\d+)([a-z]?.*)")


def get_act_name(name: str, layer: int | str | None = None, layer_type: str | None = None) -> str:
    """TL's full hook name of a short one, as TransformerLens' ``utils.get_act_name``.

    ``get_act_name("z", 3)`` is ``"blocks.3.attn.hook_z"``, ``get_act_name("pre", 2)``
    ``"blocks.2.mlp.hook_pre"``, ``get_act_name("embed")`` ``"hook_embed"``,
    ``get_act_name("scale4ln1")`` ``"blocks.4.ln1.hook_scale"``,
    ``get_act_name("scale")`` ``"ln_final.hook_scale"``; a full name comes back as it is.
    Every attnkit call that takes a hook name takes these.

    Args:
        name: the activation (``"z"``, ``"pattern"``, ``"attn"``, ``"resid_pre"``), or the
            activation, layer and layer type run together (``"k6"``, ``"scale4ln1"``).
        layer: the layer index.
        layer_type: ``"attn"``, ``"mlp"``, ``"ln1"``, ``"ln2"`` (or TL's short forms
            ``"a"``, ``"m"``), where the name alone does not say.
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    short = _SHORT_WITH_LAYER.fullmatch(name)
    if short is not None:
        name, layer, layer_type = short[1], short[2], short[3]
    name = _ACT_ALIASES.get(name, name)
    if name in _ATTENTION_NAMES:
        layer_type = "attn"
    elif name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIASES:
        layer_type = _LAYER_TYPE_ALIASES[layer_type]
    parts = [] if layer is None else [f"blocks.{layer}"]
    if layer_type:
        parts.append(layer_type)
    parts.append(f"hook_{name}")
    full = ".".join(parts)
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full
