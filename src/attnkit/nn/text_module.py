"""What every network that reads one text's token ids offers: :class:`TextModule`, the
interface :class:`attnkit.nn.DecoderLM`, :class:`attnkit.nn.EncoderDecoderLM` and BERT's
encoder (:class:`attnkit.models.families.bert.BertModel`) share, which :class:`attnkit.models.Model`
calls whatever the family.

Shape letters: ``b`` batch, ``s`` number of tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookedModule
from attnkit.nn.records import StackOutput
from attnkit.nn.transformer import LayerSelection


class TextModule(HookedModule, ABC):
    """A network over the token ids of a text, with hook points (:mod:`attnkit.nn.hooks`):
    the hidden states of its stack (with the weights of chosen layers), the logits of its
    head, and each layer's self-attention.

    A subclass may take more keywords in :meth:`last_hidden_state` (a KV cache, explicit
    positions), with defaults.
    """

    @abstractmethod
    def last_hidden_state(
        self, tokens: Tensor, *, padding: Tensor | None = None, return_weights: LayerSelection = False
    ) -> Tensor | StackOutput:
        """The last layer's output for a batch of token ids (an encoder–decoder's encoder).

        Args:
            tokens: integer ids ``[b, s]``.
            padding: ``None``, or ``[b, s]`` bool, ``True`` on tokens and ``False`` on padding
                (on either side), which no token attends to; a causal network counts each
                row's positions from its first token, so that a left-padded row gives its
                unpadded results.
            return_weights: also return the weights of every layer (``True``) or of the
                layers with these indices.

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput` when weights are asked for
            (a list of indices, even empty, asks).

        Raises:
            TypeError: non-integer ids.
            ValueError: ids not ``[b, s]``, padding of another shape, a layer index out of
                range.
        """

    @abstractmethod
    def logits(self, hidden: Tensor) -> Tensor | None:
        """Next-token logits ``[..., v]`` of what :meth:`last_hidden_state` returns
        (``[..., e]``), or ``None`` when the network has no head on those states (an
        encoder; an encoder–decoder, whose head reads its decoder)."""

    @abstractmethod
    def self_attention(self, layer: int) -> MultiHeadAttention:
        """The self-attention module of layer ``layer`` of the stack :meth:`last_hidden_state`
        runs (whose projections value-weighted attention and TransformerLens-style weights
        read)."""


@runtime_checkable
class DecodingModule(Protocol):
    """A network that continues token ids step by step with a KV cache
    (:meth:`attnkit.nn.DecoderLM.stream`, :meth:`attnkit.nn.EncoderDecoderLM.stream`): what
    generation by an :class:`attnkit.models.Model` runs."""

    def stream(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_kv_cache: bool = True,
    ) -> Iterator[Tensor]:
        """The next token ``[b]`` of every row, one step at a time (with a KV cache unless
        ``use_kv_cache=False``)."""
        ...


def padding_positions(padding: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """The key mask and the positions of a padded batch: padded keys masked, and each row's
    positions counted from its first token.

    Args:
        padding: ``[b, s]`` bool, ``True`` on tokens.
        tokens: the ids ``[b, s]`` it pads.

    Returns:
        ``(mask [b, 1, 1, s], positions [b, s])``.

    Raises:
        ValueError: padding that is not a bool tensor of the ids' shape.
    """
    check_padding(padding, tokens)
    positions = (padding.long().cumsum(-1) - 1).clamp(min=0)  # [b, s]
    return padding[:, None, None, :], positions  # [b, 1, 1, s], [b, s]


def check_token_ids(tokens: Tensor) -> None:
    """Refuse ids that :meth:`TextModule.last_hidden_state` cannot read: anything but an
    integer tensor ``[b, s]``.

    Raises:
        TypeError: float or bool ids.
        ValueError: ids that are not 2-D.
    """
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [b, s], got {list(tokens.shape)}")


def check_padding(padding: Tensor, tokens: Tensor) -> None:
    """Refuse padding that is not a bool tensor ``[b, s]`` of the ids' shape.

    Raises:
        ValueError: padding of another dtype or shape.
    """
    if not isinstance(padding, Tensor) or padding.dtype != torch.bool or padding.shape != tokens.shape:
        got = f"{padding.dtype} {list(padding.shape)}" if isinstance(padding, Tensor) else type(padding).__name__
        raise ValueError(f"padding must be a bool tensor [b, s] = {list(tokens.shape)} like the ids, got {got}")
