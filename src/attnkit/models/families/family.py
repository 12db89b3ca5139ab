"""The protocol a model family implements: how to read its configuration, build its
network and rename its checkpoint's tensors.

:func:`attnkit.models.load` and :class:`attnkit.models.Model` know nothing about any
particular family: they look the checkpoint's ``model_type`` up in
:data:`attnkit.models.families.table.FAMILIES` and call the family's functions. Running the
network is the network's own job: every family builds an
:class:`attnkit.nn.text_module.TextModule` (``last_hidden_state``, ``logits``,
``self_attention``), which :class:`attnkit.models.Model` calls directly. A new family is
one new file that defines a :class:`ModelFamily`, plus its entry in that table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from attnkit.nn.text_module import TextModule


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
            (the module's ``last_hidden_state`` and ``self_attention`` read the encoder, its
            ``logits`` are ``None``), :meth:`attnkit.models.Model.run_encoder_decoder` runs a
            source and a target with the three kinds of attention, and generation
            translates a source.
        read_config: ``(config.json as a dict, path=the file)`` → the family's config (a
            :class:`ModelConfig`); raises :class:`attnkit.models.CheckpointError`, naming
            the field, for what it cannot load or what exceeds
            :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`.
        build: config → the network on the ``meta`` device (no storage), whose weights
            the checkpoint's replace: an :class:`attnkit.nn.text_module.TextModule`, whose
            methods run it (hidden states with the weights of chosen layers, logits, each
            layer's self-attention) and whose hook points (:mod:`attnkit.nn.hooks`) every
            run, batch and generation goes through.
        state_dict_from_hf: ``(checkpoint tensors, config)`` → ``(state dict of the
            network, checkpoint keys with no place in it)``.
        finish: ``(network, config)`` → ``None``; what must happen once the weights are
            assigned (tying shared weights again).
        eos_token_ids: ``(config, checkpoint folder)`` → the ids that end a generation.
        summary: what the family's blocks have, in a line (``attnkit models families``).
    """

    name: str
    model_type: str
    causal: bool
    read_config: Callable[..., ModelConfig]
    build: Callable[[Any], TextModule]
    state_dict_from_hf: Callable[[dict[str, Tensor], Any], tuple[dict[str, Tensor], list[str]]]
    finish: Callable[[Any, Any], None]
    eos_token_ids: Callable[[Any, Path], tuple[int, ...]]
    summary: str
    encoder_decoder: bool = False
