"""The protocol a model family implements: how to read its configuration, build its
network, rename its checkpoint's tensors, and run it.

:func:`attnkit.models.load` and :class:`attnkit.models.Model` know nothing about any
particular family: they look the checkpoint's ``model_type`` up in
:data:`attnkit.models.families.FAMILIES` and call the family's functions. A new family is
one new file that defines a :class:`ModelFamily`, plus its entry in that table.

Shape letters: ``s`` number of tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from attnkit.nn import HookedModule, MultiHeadAttention, StackOutput


class ModelConfig(Protocol):
    """What :class:`attnkit.models.Model` and the analyses on it
    (:mod:`attnkit.inspect.interventions`) read from every family's config."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int:
        """The model dim ``e``."""
        ...

    @property
    def intermediate_size(self) -> int:
        """The feed-forward hidden dim."""
        ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def max_length(self) -> int: ...


@dataclass(frozen=True)
class ModelFamily:
    """One architecture family (LLaMA, BERT, ...) as :func:`attnkit.models.load` uses it.

    Attributes:
        name: the family's name, :attr:`attnkit.models.Model.family`.
        model_type: the ``model_type`` of its Hugging Face ``config.json``.
        causal: a causal decoder, which can generate; its module is then an
            :class:`attnkit.nn.DecoderLM` (generation runs its cached decoding loop).
        encoder_decoder: an encoder–decoder (T5, BART), whose module is an
            :class:`attnkit.nn.EncoderDecoderLM`: a run over one text is its encoder's
            (``hidden_states`` and ``self_attention`` read the encoder, ``logits`` is
            ``None``), :meth:`attnkit.models.Model.run_seq2seq` runs a source and a target
            with the three kinds of attention, and generation translates a source.
        read_config: ``(config.json as a dict, path=the file)`` → the family's config (a
            :class:`ModelConfig`); raises :class:`attnkit.models.CheckpointError`, naming
            the field, for what it cannot load or what exceeds
            :data:`attnkit.models.checkpoint.CONFIG_LIMITS`.
        build: config → the network on the ``meta`` device (no storage), whose weights
            the checkpoint's replace: an :class:`attnkit.nn.HookedModule` whose hook points
            (:mod:`attnkit.nn.hooks`) every run, batch and generation goes through.
        state_dict_from_hf: ``(checkpoint tensors, config)`` → ``(state dict of the
            network, checkpoint keys with no place in it)``.
        finish: ``(network, config)`` → ``None``; what must happen once the weights are
            assigned (tying shared weights again).
        eos_token_ids: ``(config, checkpoint folder)`` → the ids that end a generation.
        hidden_states: ``(network, ids [b, s], layers, padding)`` → a
            :class:`attnkit.nn.StackOutput` with the last hidden states ``[b, s, e]`` and the
            attention weights of the layers with these indices (``None`` for the others);
            ``padding`` is ``None`` or ``[b, s]`` bool, ``True`` on tokens, ``False`` on
            padding (on either side), which no token may attend to; a causal family counts
            each row's positions from its first token.
        logits: ``(network, hidden [b, s, e])`` → next-token logits ``[b, s, v]``, or
            ``None`` for a family without a language-model head.
        self_attention: ``(network, layer)`` → that layer's
            :class:`attnkit.nn.MultiHeadAttention` (whose projections value-weighted
            attention reads).
        summary: what the family's blocks have, in a line (``attnkit models families``).
    """

    name: str
    model_type: str
    causal: bool
    read_config: Callable[..., ModelConfig]
    build: Callable[[Any], HookedModule]
    state_dict_from_hf: Callable[[dict[str, Tensor], Any], tuple[dict[str, Tensor], list[str]]]
    finish: Callable[[Any, Any], None]
    eos_token_ids: Callable[[Any, Path], tuple[int, ...]]
    hidden_states: Callable[[Any, Tensor, Collection[int], Tensor | None], StackOutput]
    logits: Callable[[Any, Tensor], Tensor | None]
    self_attention: Callable[[Any, int], MultiHeadAttention]
    summary: str
    encoder_decoder: bool = False
