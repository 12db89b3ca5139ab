"""What the encoder–decoder families (T5, BART, the trained Transformer) share: the sizes
their configs have alike, and the :class:`~attnkit.models.families.family.ModelFamily`
made from a family's own config reader, network and tensor names. Running an
encoder–decoder is the :class:`~attnkit.models.Model`'s job
(:mod:`attnkit.models.model.encoder_decoder`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from attnkit.models.families.decoder import eos_token_ids
from attnkit.models.families.family import ModelFamily
from attnkit.models.families.meta_device import build_without_weights
from attnkit.nn import EncoderDecoderLM, LMHead


class EncoderDecoderSizes:
    """What the configs of encoder–decoder families (T5, BART, the trained Transformer)
    share: :class:`attnkit.models.families.family.ModelConfig`'s ``hidden_size`` is ``d_model`` and
    every head has its own keys and values. A config adds ``intermediate_size``."""

    d_model: int
    num_heads: int

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: as many as query heads."""
        return self.num_heads

    @property
    def hidden_size(self) -> int:
        """The model dim ``e`` (``d_model``)."""
        return self.d_model


def encoder_decoder_family(
    *,
    name: str,
    model_type: str,
    read_config: Callable[..., Any],
    build_network: Callable[[Any], EncoderDecoderLM],
    state_dict_from_hf: Callable[[dict[str, Tensor], Any], tuple[dict[str, Tensor], list[str]]],
    finish: Callable[[Any, Any], None],
    summary: str,
) -> ModelFamily:
    """The :class:`attnkit.models.families.family.ModelFamily` of an encoder–decoder family: its own
    config reader, network and tensor names, and everything else shared.

    Args:
        name: the family's name.
        model_type: its ``config.json`` ``model_type``.
        read_config: ``(config.json dict, path=file)`` → the family's config.
        build_network: config → the network with initialised weights; the family's
            ``build`` runs it on the ``meta`` device (no storage), for the checkpoint's
            weights to replace.
        state_dict_from_hf: renames its checkpoint's tensors to
            :class:`attnkit.nn.EncoderDecoderLM` keys.
        finish: ``(module, config)``: ties what assignment untied, once the weights are in.
        summary: what it is made of, for ``attnkit models families``.
    """

    def build(config: Any) -> EncoderDecoderLM:
        module = build_without_weights(lambda: build_network(config))
        assert isinstance(module, EncoderDecoderLM)
        return module

    return ModelFamily(
        name=name,
        model_type=model_type,
        causal=False,
        encoder_decoder=True,
        read_config=read_config,
        build=build,
        state_dict_from_hf=state_dict_from_hf,
        finish=finish,
        eos_token_ids=eos_token_ids,
        summary=summary,
    )


def tie_head_to_token_embedding(module: EncoderDecoderLM) -> None:
    """Give the head the source embedding's token matrix again, once a tied checkpoint's
    weights are in: assignment gives each key its own Parameter object.

    Args:
        module: the network, whose head is an :class:`attnkit.nn.LMHead`.
    """
    head = module.head
    assert isinstance(head, LMHead)
    head.proj.weight = module.token_embedding.weight  # [v, e], the one matrix
