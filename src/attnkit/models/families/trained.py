"""The encoder–decoders that ``attnkit train`` trains (copy, reverse, sort), as a family that
:func:`attnkit.models.load` reads from the run's folder like any checkpoint.

Shape letters: ``s`` tokens, ``e`` model dim (``d_model``), ``v`` vocabulary size.

The network is the paper's Transformer, scaled down: :func:`attnkit.nn.paper_transformer`,
the very module that ``attnkit train`` trains (one token matrix shared by the source and
the target, its vectors multiplied by ``√e`` and added to the sinusoidal encoding;
post-norm layers with LayerNorm, biases and a ReLU feed-forward, no final norm; an untied
head with a bias). The decoder reads ``<s>`` first and a target ends with ``</s>``.

A finished run's folder holds, beside the training checkpoint, what
:func:`attnkit.models.load` reads (written by
:func:`attnkit.train.export.write_model_folder`): ``config.json`` (the fields of
:class:`TrainedConfig`), ``model.safetensors`` (the network's state dict, the target
embedding's copy of the token matrix left out) and ``tokenizer.json`` (the task's symbols,
one word each, separated by spaces).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.checkpoints.renaming import rename_tensors
from attnkit.models.families.encoder_decoder import (
    EncoderDecoderSizes,
    encoder_decoder_family,
)
from attnkit.nn import EncoderDecoderLM, paper_transformer

MODEL_TYPE = "attnkit_transformer"
# The positions a loaded model reads at most: the sinusoidal encoding has no table, so
# this only bounds the memory of one run (``attnkit train --length`` allows up to 4,096).
MAX_LENGTH = 4096
# The keys of model.safetensors besides the target embedding's, which shares the source's.
_KEY = re.compile(r"(source_embedding\.token\.weight|(encoder|decoder)\.layers\.\d+\..+|head\.proj\.(weight|bias))")


@dataclass(frozen=True)
class TrainedConfig(EncoderDecoderSizes):
    """The sizes of a trained encoder–decoder (``config.json`` of its run's folder).

    Attributes:
        vocab_size: ``v``: the task's symbols and ``<s>``, ``</s>``.
        d_model: model dim ``e``.
        num_layers: encoder depth (``encoder_layers``).
        num_decoder_layers: decoder depth (``decoder_layers``).
        num_heads: attention heads of every attention (``attention_heads``).
        ffn_dim: feed-forward hidden dim.
        max_length: the most tokens of one text (``max_position_embeddings``).
        decoder_start_token_id: the decoder's first input (``<s>``).
        eos_token_ids: the ids that end a generation (``</s>``).
        dropout: dropout while training (none once loaded: models load in evaluation mode).
        layer_count_fields: the ``config.json`` field of each stack's depth.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    ffn_dim: int
    max_length: int = MAX_LENGTH
    decoder_start_token_id: int = 0
    eos_token_ids: tuple[int, ...] = (1,)
    dropout: float = 0.0
    layer_count_fields: tuple[tuple[str, str], ...] = (("encoder", "encoder_layers"), ("decoder", "decoder_layers"))

    @property
    def intermediate_size(self) -> int:
        """The feed-forward hidden dim."""
        return self.ffn_dim

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` content that :meth:`from_hf` reads back."""
        return {
            "model_type": MODEL_TYPE,
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "encoder_layers": self.num_layers,
            "decoder_layers": self.num_decoder_layers,
            "attention_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "max_position_embeddings": self.max_length,
            "decoder_start_token_id": self.decoder_start_token_id,
            "eos_token_id": list(self.eos_token_ids),
        }

    @classmethod
    def from_hf(cls, config: dict[str, Any], *, path: Path = Path("config.json")) -> TrainedConfig:
        """Read a run folder's ``config.json``.

        Args:
            config: the parsed file.
            path: the file, named in errors.

        Raises:
            CheckpointError: a missing size, one that is not an integer within the limits
                of :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`, an odd width, or one
                that the heads do not divide; the message names the field.
        """
        read = ConfigReader(config, path)
        vocab = read.size("vocab_size")
        d_model = read.size("d_model", like="hidden_size")
        if d_model % 2:
            raise read.refuse("d_model", f"must be even (sinusoidal encoding), got {d_model}")
        return cls(
            vocab_size=vocab,
            d_model=d_model,
            num_layers=read.size("encoder_layers", like="num_hidden_layers"),
            num_decoder_layers=read.size("decoder_layers", like="num_hidden_layers"),
            num_heads=read.head_count("attention_heads", width=d_model, width_key="d_model"),
            ffn_dim=read.size("ffn_dim", like="intermediate_size"),
            max_length=read.size("max_position_embeddings", MAX_LENGTH),
            decoder_start_token_id=read.token_id("decoder_start_token_id", vocab, 0),
            eos_token_ids=read.eos(vocab),
        )


def build_network(config: TrainedConfig) -> EncoderDecoderLM:
    """The network with fresh weights (:func:`attnkit.nn.paper_transformer`)."""
    return paper_transformer(
        config.vocab_size,
        embed_dim=config.d_model,
        num_heads=config.num_heads,
        num_encoder_layers=config.num_layers,
        num_decoder_layers=config.num_decoder_layers,
        ff_dim=config.ffn_dim,
        dropout=config.dropout,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def saved_state(module: EncoderDecoderLM) -> dict[str, Tensor]:
    """What ``model.safetensors`` holds: the state dict without the target embedding's
    token matrix (the source's; safetensors stores a tensor once)."""
    return {key: value for key, value in module.state_dict().items() if not key.startswith("target_embedding.")}


def state_dict_from_hf(tensors: dict[str, Tensor], config: TrainedConfig) -> tuple[dict[str, Tensor], list[str]]:
    """The state dict of ``FAMILY.build``'s module from ``model.safetensors``.

    Returns:
        ``(state, unknown)``: the tensors, the target embedding given the source's token
        matrix, and the keys with no place in the model.
    """
    return rename_tensors(
        tensors,
        lambda key, value: {key: value} if _KEY.fullmatch(key) else None,
        shared={"target_embedding.token.weight": "source_embedding.token.weight"},
    )


def finish(module: EncoderDecoderLM, config: TrainedConfig) -> None:
    """Share the token matrix between source and target again: assignment gives each key
    its own Parameter object."""
    module.target_embedding.token = module.source_embedding.token


FAMILY = encoder_decoder_family(
    name="transformer",
    model_type=MODEL_TYPE,
    read_config=TrainedConfig.from_hf,
    build_network=build_network,
    state_dict_from_hf=state_dict_from_hf,
    finish=finish,
    summary="what attnkit train writes: post-norm LayerNorm, sinusoidal positions, shared √e-scaled embeddings, ReLU, untied head with bias",
)
