"""The activations one forward pass recorded, by hook name (:mod:`attnkit.nn.hooks`), and
what a residual-stream analysis computes from them: the stream after each layer, its
decomposition into the blocks that wrote it, each head's share, the final norm applied to
any of these (the logit lens) and their direct contribution to a logit.

Shape letters: ``k`` stacked components, ``b`` batch, ``s`` positions, ``e`` model dim,
``h`` heads, ``v`` vocabulary.
"""

from __future__ import annotations

import re
from typing import Protocol

import torch
from torch import Tensor, nn

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class _Hooked(Protocol):
    """What the cache needs of its model (an :class:`attnkit.nn.HookedModule`)."""

    def hook_name(self, name: str, layer: int | None = None) -> str: ...

    def hook_names(self) -> list[str]: ...

    def get_submodule(self, target: str) -> nn.Module: ...


class ActivationCache(dict[str, Tensor]):
    """Hook name → the activation recorded there (after any hook that replaced it), as
    :meth:`attnkit.nn.HookedModule.run_with_cache` returns it.

    Besides full names, ``cache["pattern", 3]`` looks a point up by the end of its name
    and its layer (:meth:`attnkit.nn.HookedModule.hook_name`). The residual-stream helpers
    read a pre-norm model with one stack (:class:`attnkit.nn.DecoderLM`, the LLaMA
    checkpoints), where the stream is the sum of the embeddings and of every block's
    output; they need the names they combine in the cache (``run_with_cache()`` keeps them
    all).

    Args:
        model: the module whose names these are.
    """

    def __init__(self, model: _Hooked) -> None:
        super().__init__()
        self.model = model

    def __getitem__(self, key: str | tuple[str, int | None]) -> Tensor:
        if isinstance(key, tuple):
            name, layer = key
            key = self.model.hook_name(name, layer)
        return super().__getitem__(key)

    def __repr__(self) -> str:
        return f"ActivationCache({list(self)})"

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
