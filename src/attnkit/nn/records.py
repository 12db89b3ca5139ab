"""Typed records that modules hand back when asked for attention weights.

Shape letters: ``b`` batch, ``h`` query heads, ``s_q`` query length, ``s_k`` key length,
``e`` model dim, ``d_v`` value dim, ``v`` vocabulary size.

Weights are returned, never stored on a module: every forward that takes
``return_weights=True`` returns one of these instead of a bare tensor. All weights are
post-softmax and before dropout, zero on rows that could attend to nothing.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

from torch import Tensor


@dataclass(frozen=True)
class AttentionContext:
    """What RNN-era attention (:class:`attnkit.nn.AdditiveAttention`,
    :class:`attnkit.nn.LuongAttention`) computed.

    Attributes:
        context: the context vector(s), ``[b, d_v]`` for one query per batch entry, or
            ``[b, s_q, d_v]``.
        weights: ``[b, s_k]`` or ``[b, s_q, s_k]``.
    """

    context: Tensor
    weights: Tensor


@dataclass(frozen=True)
class MultiHeadOutput:
    """The result of :class:`attnkit.nn.MultiHeadAttention` with its weights.

    Attributes:
        output: ``[b, s_q, e]``.
        weights: per head, ``[b, h, s_q, s_k]``; ``None`` from
            :meth:`~attnkit.nn.MultiHeadAttention.forward_record` when not asked for.
    """

    output: Tensor
    weights: Tensor | None


@dataclass(frozen=True)
class LayerWeights:
    """The attention weights of one Transformer layer.

    Attributes:
        self_attention: ``[b, h, s_q, s_k]``.
        cross_attention: ``[b, h, s_q, s_src]``, or ``None`` for a layer without
            cross-attention (encoder layers, decoder-only models).
    """

    self_attention: Tensor
    cross_attention: Tensor | None = None


@dataclass(frozen=True)
class LayerOutput:
    """The result of one Transformer layer with its weights.

    Attributes:
        output: ``[b, s, e]``.
        weights: the layer's :class:`LayerWeights`; ``None`` from a layer's
            ``forward_record`` when not asked for.
    """

    output: Tensor
    weights: LayerWeights | None


@dataclass(frozen=True)
class StackOutput:
    """The result of a stack of layers (:class:`attnkit.nn.Encoder`,
    :class:`attnkit.nn.Decoder`) with the weights of every layer.

    Attributes:
        output: ``[b, s, e]``.
        weights: one :class:`LayerWeights` per layer, first layer first; ``None`` for a
            layer whose weights were not asked for.
    """

    output: Tensor
    weights: list[LayerWeights | None]


@dataclass(frozen=True)
class TransformerOutput:
    """The result of an encoder–decoder :class:`attnkit.nn.Transformer` with its weights.

    Attributes:
        output: the decoder's output ``[b, s_tgt, e]``.
        encoder_weights: one :class:`LayerWeights` per encoder layer.
        decoder_weights: one :class:`LayerWeights` per decoder layer, each with
            ``cross_attention`` ``[b, h, s_tgt, s_src]``.
    """

    output: Tensor
    encoder_weights: list[LayerWeights]
    decoder_weights: list[LayerWeights]


@dataclass(frozen=True)
class LMOutput:
    """The result of :class:`attnkit.nn.DecoderLM` with its weights.

    Attributes:
        logits: ``[b, s, v]``.
        weights: one :class:`LayerWeights` per layer; ``None`` for a layer whose weights
            were not asked for.
    """

    logits: Tensor
    weights: list[LayerWeights | None]


@dataclass(frozen=True)
class EncoderDecoderLMOutput:
    """The result of an :class:`attnkit.nn.EncoderDecoderLM` with its weights: the three
    kinds of attention of an encoder–decoder.

    Attributes:
        logits: ``[b, s_tgt, v]``.
        encoder_weights: one :class:`LayerWeights` per encoder layer (self-attention over
            the source, ``[b, h, s_src, s_src]``); ``None`` for a layer not asked for.
        decoder_weights: one :class:`LayerWeights` per decoder layer: masked
            self-attention ``[b, h, s_tgt, s_tgt]`` and ``cross_attention``
            ``[b, h, s_tgt, s_src]`` (target positions as rows, source tokens as columns);
            ``None`` for a layer not asked for.
    """

    logits: Tensor
    encoder_weights: list[LayerWeights | None]
    decoder_weights: list[LayerWeights | None]


_Module = TypeVar("_Module")
_Arguments = ParamSpec("_Arguments")
_Record = TypeVar("_Record", MultiHeadOutput, LayerOutput)


def forward_of_record(
    forward_record: Callable[Concatenate[_Module, _Arguments], _Record],
) -> Callable[Concatenate[_Module, _Arguments], Tensor | _Record]:
    """A module's ``forward`` made from its ``forward_record``: the same arguments, the
    record's ``output`` tensor returned, or the whole record with ``return_weights=True``.
    The arguments (and their documentation) are written once, on ``forward_record``.

    Args:
        forward_record: the method that always returns a :class:`MultiHeadOutput` or
            :class:`LayerOutput`, taking ``return_weights`` by keyword.

    Returns:
        The ``forward`` method, with ``forward_record``'s arguments and docstring.
    """

    @functools.wraps(forward_record)
    def forward(self: _Module, /, *args: _Arguments.args, **kwargs: _Arguments.kwargs) -> Tensor | _Record:
        record = forward_record(self, *args, **kwargs)
        return record if kwargs.get("return_weights", False) else record.output

    forward.__name__ = "forward"
    forward.__qualname__ = f"{forward_record.__qualname__.rpartition('.')[0]}.forward"
    returned = f"Tensor | {forward_record.__annotations__['return']}"
    forward.__annotations__ = {**forward_record.__annotations__, "return": returned}
    forward.__signature__ = inspect.signature(forward_record).replace(return_annotation=returned)  # type: ignore[attr-defined]
    return forward
