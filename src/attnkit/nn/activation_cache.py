"""The activations one forward pass recorded, by hook name (:mod:`attnkit.nn.hooks`), and
what a residual-stream analysis computes from them: the stream after each layer, its
decomposition into the blocks that wrote it, each head's share, the final norm applied to
any of these (the logit lens) and their direct contribution to a logit.

The largest entries, each attention layer's ``scores`` and ``pattern`` ``[b, h, s, s_k]``
and its per-head ``result`` ``[b, h, s, e]``, are computed when first read, from tensors
the forward pass recorded (the layer's queries and keys, or its heads' outputs): a
:class:`DeferredActivations`. A forward pass that keeps them then costs about what one
without them costs, and a cache of SmolLM2 at 1,024 tokens holds 2.9 GB less until its
patterns are read. What a read returns is what the forward pass would have recorded, bit
for bit: the same function computes it from the same tensors.

Shape letters: ``k`` stacked components, ``b`` batch, ``s`` positions, ``e`` model dim,
``h`` heads, ``v`` vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class _Hooked(Protocol):
    """What the cache needs of its model (an :class:`attnkit.nn.HookedModule`)."""

    def hook_name(self, name: str, layer: int | None = None) -> str: ...

    def hook_names(self) -> list[str]: ...

    def get_submodule(self, target: str) -> nn.Module: ...


@dataclass(eq=False)
class DeferredActivations:
    """Activations of one module that a cache computes when one of them is first read,
    from tensors recorded during the forward pass.

    Args:
        compute: returns the activations, in the order of the points that recorded them
            (:func:`attnkit.nn.hooks.record_on_read`); called without autograd.
        inputs: the tensors ``compute`` reads. Changed in place after the forward pass
            (an optimizer step on a weight, an edit of a cached tensor), they no longer
            give what the pass would have recorded: reading then raises.
        what: what is computed, for that error (``"decoder.layers.3.self_attn scores and
            pattern"``).
    """

    compute: Callable[[], Sequence[Tensor]]
    inputs: Sequence[Tensor]
    what: str
    versions: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.versions = _versions(self.inputs)

    def run(self) -> Sequence[Tensor]:
        """The activations.

        Raises:
            RuntimeError: an input changed in place since the forward pass.
        """
        if _versions(self.inputs) != self.versions:
            raise RuntimeError(
                f"the {self.what} of this cache are computed when first read, from tensors recorded in the "
                "forward pass (queries, keys, head outputs, the output projection's weight), and one of them "
                "was changed in place since; read these entries before changing cached tensors or weights, "
                "or run the forward pass again"
            )
        with torch.no_grad():
            return self.compute()


def computable_later(*tensors: Tensor) -> bool:
    """Whether a cache may compute activations from ``tensors`` when first read rather than
    now: none carries autograd history that gradients would need (under
    :func:`torch.no_grad`, or none requires them), and none is an inference tensor (made
    under :func:`torch.inference_mode`), which keeps no version counter to tell whether it
    changed since."""
    if any(tensor.is_inference() for tensor in tensors):
        return False
    return not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors))


def _versions(tensors: Sequence[Tensor]) -> tuple[int, ...]:
    """torch's version counters of ``tensors``: each in-place change of a tensor (or of a
    view of its memory) increments its counter."""
    return tuple(tensor._version for tensor in tensors)


@dataclass(frozen=True)
class _OnRead:
    """A cache entry not computed yet: the ``index``-th activation of ``deferred``."""

    deferred: DeferredActivations
    index: int


class ActivationCache(MutableMapping[str, Tensor]):
    """Hook name → the activation recorded there (after any hook that replaced it), as
    :meth:`attnkit.nn.HookedModule.run_with_cache` returns it.

    Besides full names, ``cache["pattern", 3]`` looks a point up by the end of its name
    and its layer (:meth:`attnkit.nn.HookedModule.hook_name`). Entries recorded by
    :meth:`record_on_read` are computed when first read (by ``cache[name]``, ``.get``,
    ``.items()``, ``.values()``) and kept; :meth:`unread` names those not computed yet.
    The residual-stream helpers read a pre-norm model with one stack
    (:class:`attnkit.nn.DecoderLM`, the LLaMA checkpoints), where the stream is the sum of
    the embeddings and of every block's output; they need the names they combine in the
    cache (``run_with_cache()`` keeps them all).

    Args:
        model: the module whose names these are.
    """

    def __init__(self, model: _Hooked) -> None:
        self.model = model
        self._entries: dict[str, Tensor | _OnRead] = {}

    def __getitem__(self, key: str | tuple[str, int | None]) -> Tensor:
        if isinstance(key, tuple):
            name, layer = key
            key = self.model.hook_name(name, layer)
        entry = self._entries[key]
        if isinstance(entry, _OnRead):
            return self._compute(entry)
        return entry

    def __setitem__(self, key: str, value: Tensor) -> None:
        self._entries[key] = value

    def __delitem__(self, key: str) -> None:
        del self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            try:
                key = self.model.hook_name(*key)
            except ValueError:
                return False
        return key in self._entries

    def __repr__(self) -> str:
        return f"ActivationCache({list(self._entries)})"

    def __getstate__(self) -> dict[str, object]:
        """What pickling (``torch.save``, a copy) keeps: every entry computed."""
        return {"model": self.model, "_entries": {name: self[name] for name in self._entries}}

    def record_on_read(self, names: Mapping[str, int], deferred: DeferredActivations) -> None:
        """Keep entries that ``deferred`` computes when one of them is first read.

        Args:
            names: name → the index of its activation among those ``deferred`` computes.
            deferred: the computation, shared by these names.
        """
        for name, index in names.items():
            self._entries[name] = _OnRead(deferred, index)

    def unread(self) -> list[str]:
        """The names recorded by :meth:`record_on_read` and not computed yet."""
        return [name for name, entry in self._entries.items() if isinstance(entry, _OnRead)]

    def _compute(self, entry: _OnRead) -> Tensor:
        """Run ``entry``'s computation once and keep every entry of this cache it gives."""
        values = entry.deferred.run()
        for name, other in self._entries.items():
            if isinstance(other, _OnRead) and other.deferred is entry.deferred:
                self._entries[name] = values[other.index]
        return values[entry.index]

    @property
    def num_layers(self) -> int:
        """The number of layers of the model's stack."""
        indices = [int(m.group(1)) for name in self.model.hook_names() if (m := _LAYER_INDEX.search(name))]
        return 1 + max(indices, default=-1)

    def accumulated_resid(self, layer: int | None = None, *, incl_mid: bool = False) -> tuple[Tensor, list[str]]:
        """The residual stream as it enters each layer, then as it leaves the last.

        Args:
            layer: stop before this layer (its ``resid_pre`` is the last entry); ``None``
                for every layer and the stream out of the last.
            incl_mid: also the stream between each layer's attention and MLP.

        Returns:
            ``(stack [k, b, s, e], labels)``, labels such as ``"0_pre"``, ``"0_mid"``,
            ``"final_post"``.

        Raises:
            KeyError: a name the cache did not keep.
        """
        end = self.num_layers if layer is None else layer
        parts, labels = [], []
        for i in range(end):
            parts.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if incl_mid:
                parts.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        if layer is None:
            parts.append(self["resid_post", self.num_layers - 1])
            labels.append("final_post")
        elif layer < self.num_layers:
            parts.append(self["resid_pre", layer])
            labels.append(f"{layer}_pre")
        return torch.stack(parts), labels

    def decompose_resid(self, layer: int | None = None) -> tuple[Tensor, list[str]]:
        """The residual stream split into what wrote it: the embeddings, then each layer's
        attention and MLP output. The parts sum to the stream entering ``layer`` (the
        stream out of the last layer for ``None``).

        Returns:
            ``(stack [k, b, s, e], labels)``: ``"embed"``, ``"0_attn_out"``,
            ``"0_mlp_out"``, ...

        Raises:
            KeyError: a name the cache did not keep.
        """
        end = self.num_layers if layer is None else layer
        parts, labels = [self["embed"]], ["embed"]
        for i in range(end):
            parts += [self["attn_out", i], self["mlp_out", i]]
            labels += [f"{i}_attn_out", f"{i}_mlp_out"]
        return torch.stack(parts), labels

    def stack_head_results(self, layer: int | None = None) -> tuple[Tensor, list[str]]:
        """Every head's output after its slice of the output projection (the ``result``
        points), as the residual stream receives it.

        Args:
            layer: the heads of the layers before this one; ``None`` for all.

        Returns:
            ``(stack [layers · h, b, s, e], labels)``: ``"L0H0"``, ``"L0H1"``, ...

        Raises:
            KeyError: a layer whose ``result`` the cache did not keep.
        """
        end = self.num_layers if layer is None else layer
        parts, labels = [], []
        for i in range(end):
            result = self["self_attn.result", i]  # [b, h, s, e]
            parts.append(result.transpose(0, 1))  # [h, b, s, e]
            labels += [f"L{i}H{head}" for head in range(result.shape[1])]
        return torch.cat(parts), labels

    def apply_ln_to_stack(self, stack: Tensor, *, recompute: bool = False) -> Tensor:
        """The final norm applied to each element of a stack ``[k, ..., e]``.

        Args:
            stack: residual streams or parts of one.
            recompute: normalise each element by its own scale: the logit lens of
                accumulated streams. Otherwise each is divided by the scale the final norm
                computed on the actual stream (cached ``final_norm.scale``), which is linear:
                parts normalised this way sum to the normalised stream (less a LayerNorm's
                bias, which no part owns).

        Returns:
            ``[k, ..., e]``.

        Raises:
            KeyError: the cache has no ``final_norm.scale`` (with ``recompute=False``).
        """
        scale_name = self.model.hook_name("final_norm.scale")
        norm = self.model.get_submodule(scale_name.rsplit(".", 1)[0])
        if recompute:
            return norm(stack)
        scale = self[scale_name]  # [b, s, 1]
        if isinstance(norm, nn.LayerNorm):
            stack = stack - stack.mean(-1, keepdim=True)
        normed = stack / scale
        weight = getattr(norm, "weight", None)
        if weight is None:
            return normed
        weight = weight.detach()
        return normed * (1.0 + weight) if getattr(norm, "plus_one", False) else normed * weight

    def logit_attrs(self, stack: Tensor, token: int, wrong: int | None = None) -> Tensor:
        """Direct logit attribution: each element's dot product with the unembedding of
        ``token`` (minus that of ``wrong``), what it adds to that logit (or to the logit
        difference) when it reaches the head directly. Give normalised elements
        (:meth:`apply_ln_to_stack`).

        Args:
            stack: ``[k, ..., e]``.
            token: a token id.
            wrong: another token id, for a logit difference.

        Returns:
            ``[k, ...]``.

        Raises:
            ValueError: a model without a language-model head.
        """
        try:
            head = self.model.get_submodule("lm_head")
        except AttributeError:
            raise ValueError("logit attribution needs a model with a language-model head (lm_head)") from None
        unembedding = head.weight
        assert isinstance(unembedding, Tensor)
        unembedding = unembedding.detach()  # [v, e]
        direction = unembedding[token]  # [e]
        if wrong is not None:
            direction = direction - unembedding[wrong]
        return stack @ direction.to(stack.dtype)
