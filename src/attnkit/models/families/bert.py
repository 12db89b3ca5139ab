"""BERT-family checkpoints (MiniLM and friends) on :class:`attnkit.nn.Encoder`.

Shape letters: ``b`` batch, ``s`` sequence length, ``e`` model dim.

A BERT layer is a post-norm :class:`attnkit.nn.EncoderLayer` with exact GELU and
biases everywhere. In front of the stack, BERT sums three embeddings (token, learned
position, segment) and normalises them. Keys map from Hugging Face's ``BertModel``:

=====================================================  ==========================================
Hugging Face                                           attnkit
=====================================================  ==========================================
``embeddings.word_embeddings``                         ``token_embedding``
``embeddings.position_embeddings``                     ``position``
``embeddings.token_type_embeddings``                   ``token_type_embedding``
``embeddings.LayerNorm``                               ``embedding_norm``
``encoder.layer.N.attention.self.{query,key,value}``   ``encoder.layers.N.self_attn.{q,k,v}_proj``
``encoder.layer.N.attention.output.dense``             ``encoder.layers.N.self_attn.out_proj``
``encoder.layer.N.attention.output.LayerNorm``         ``encoder.layers.N.self_attn_norm``
``encoder.layer.N.intermediate.dense``                 ``encoder.layers.N.ff.up_proj``
``encoder.layer.N.output.dense``                       ``encoder.layers.N.ff.down_proj``
``encoder.layer.N.output.LayerNorm``                   ``encoder.layers.N.ff_norm``
=====================================================  ==========================================

The pooler (a tanh layer over ``[CLS]`` trained for next-sentence prediction) and
task heads are not part of the encoder and are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.checkpoints.renaming import rename_tensors
from attnkit.models.families.family import ModelFamily
from attnkit.models.families.meta_device import build_without_weights
from attnkit.nn import (
    Encoder,
    EncoderLayer,
    HookPoint,
    LayerConfig,
    LayerNorm,
    LayerSelection,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    StackOutput,
)
from attnkit.nn.layers import MaskLike
from attnkit.nn.text_module import TextModule, check_padding, check_token_ids

_LAYER_KEYS = {
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "self_attn_norm",
    "intermediate.dense": "ff.up_proj",
    "output.dense": "ff.down_proj",
    "output.LayerNorm": "ff_norm",
}
_EMBEDDING_KEYS = {
    "embeddings.word_embeddings": "token_embedding",
    "embeddings.position_embeddings": "position",
    "embeddings.token_type_embeddings": "token_type_embedding",
    "embeddings.LayerNorm": "embedding_norm",
}
_LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
# Old checkpoints name LayerNorm parameters gamma/beta.
_NORM_NAMES = {"gamma": "weight", "beta": "bias"}
# Not part of the encoder: the position ids buffer, the pooler, pre-training heads.
_IGNORED = re.compile(r"(bert\.)?(embeddings\.position_ids|pooler\..*|cls\..*)")


@dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT-family checkpoint, read from its ``config.json``.

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model dim ``e``.
        num_layers: depth.
        num_heads: attention heads.
        intermediate_size: feed-forward hidden dim.
        max_length: learned positions (``max_position_embeddings``).
        type_vocab_size: number of segment ids.
        layer_norm_eps: every LayerNorm's epsilon.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_length: int
    type_vocab_size: int
    layer_norm_eps: float

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: as many as query heads."""
        return self.num_heads

    @classmethod
    def from_hf(cls, config: dict[str, Any], *, path: Path = Path("config.json")) -> BertConfig:
        """Read a Hugging Face ``BertConfig`` dict.

        Args:
            config: the parsed ``config.json``.
            path: its file, named in errors.

        Raises:
            CheckpointError: a missing size, one that is not an integer within
                :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`, or a feature attnkit does
                not implement (an activation other than exact GELU, relative position
                embeddings); the message names the field.
        """
        read = ConfigReader(config, path)
        # The layers are built with exact GELU and the learned absolute positions only.
        read.choice("hidden_act", {"gelu": "gelu"}, "gelu")
        read.choice("position_embedding_type", {"absolute": "absolute"}, "absolute")
        hidden = read.size("hidden_size")
        return cls(
            vocab_size=read.size("vocab_size"),
            hidden_size=hidden,
            num_layers=read.size("num_hidden_layers"),
            num_heads=read.head_count("num_attention_heads", width=hidden, width_key="hidden_size"),
            intermediate_size=read.size("intermediate_size"),
            max_length=read.size("max_position_embeddings", 512),
            type_vocab_size=read.size("type_vocab_size", 2),
            layer_norm_eps=read.number("layer_norm_eps", 1e-12, high=1.0),
        )


class BertModel(TextModule):
    """A BERT encoder: embeddings, then a stack of post-norm encoder layers. Its hook
    points (:mod:`attnkit.nn.hooks`) are ``embed`` (the normalised embeddings), those of
    ``encoder``'s layers and ``encoder.final``.

    Args:
        config: the sizes.
        dropout: dropout on the embeddings and inside the layers (0 for inference).
    """

    def __init__(self, config: BertConfig, *, dropout: float = 0.0) -> None:
        super().__init__()
        e = config.hidden_size
        self.token_embedding = nn.Embedding(config.vocab_size, e)
        self.position = LearnedPositionalEmbedding(config.max_length, e)
        self.token_type_embedding = nn.Embedding(config.type_vocab_size, e)
        self.embedding_norm = LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(dropout)
        self.embed = HookPoint()
        self.encoder = Encoder(
            EncoderLayer(
                LayerConfig(
                    e,
                    config.num_heads,
                    config.intermediate_size,
                    dropout=dropout,
                    activation="gelu",
                    norm="layer",
                    norm_eps=config.layer_norm_eps,
                    norm_first=False,
                    bias=True,
                )
            )
            for _ in range(config.num_layers)
        )

    def forward(
        self,
        tokens: Tensor,
        *,
        token_types: Tensor | None = None,
        mask: MaskLike | None = None,
        return_weights: LayerSelection = False,
    ) -> Tensor | StackOutput:
        """Contextual embeddings of every token.

        Args:
            tokens: integer ids ``[b, s]``.
            token_types: segment ids ``[b, s]`` (default all 0, a single sentence).
            mask: where each token may attend (``True`` = may), e.g. key padding
                ``[b, 1, 1, s]``.
            return_weights: also return the weights of every layer (``True``) or of the
                layers with these indices.

        Returns:
            The last layer's output ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput`.

        Raises:
            TypeError: non-integer tokens.
            ValueError: tokens not ``[b, s]`` or longer than the learned positions.
        """
        check_token_ids(tokens)
        if token_types is None:
            token_types = torch.zeros_like(tokens)
        # Summed in Hugging Face's order (token + segment, then position): float addition
        # is not associative, and parity is checked to 1e-5.
        x = self.token_embedding(tokens) + self.token_type_embedding(token_types)  # [b, s, e]
        x = self.embed(self.dropout(self.embedding_norm(self.position(x))))  # [b, s, e]
        return self.encoder(x, mask=mask, return_weights=return_weights)

    def last_hidden_state(
        self, tokens: Tensor, *, padding: Tensor | None = None, return_weights: LayerSelection = False
    ) -> Tensor | StackOutput:
        """The last layer's output of single-segment ids (:meth:`forward`).

        Args:
            tokens: integer ids ``[b, s]``.
            padding: ``[b, s]`` bool, ``True`` on tokens and ``False`` on padding, whose
                keys are masked (positions stay ``0 .. s - 1``, as in Hugging Face's BERT).
            return_weights: the layers whose weights to return (``True`` for all).

        Returns:
            ``[b, s, e]``, or a :class:`attnkit.nn.StackOutput`.

        Raises:
            TypeError, ValueError: as :meth:`forward`; padding of another shape.
        """
        if padding is None:
            return self(tokens, return_weights=return_weights)
        check_padding(padding, tokens)
        return self(tokens, mask=padding[:, None, None, :], return_weights=return_weights)

    def logits(self, hidden: Tensor) -> None:
        """None: the encoder has no language-model head."""
        return None

    def self_attention(self, layer: int) -> MultiHeadAttention:
        """The self-attention module of layer ``layer``."""
        attention = self.encoder.layers[layer].self_attn
        assert isinstance(attention, MultiHeadAttention)
        return attention


def build(config: BertConfig) -> BertModel:
    """A :class:`BertModel` on the ``meta`` device (no storage), whose weights the
    checkpoint's replace (:func:`attnkit.models.families.meta_device.build_without_weights`)."""
    module = build_without_weights(lambda: BertModel(config))
    assert isinstance(module, BertModel)
    return module


def state_dict_from_hf(tensors: dict[str, Tensor], config: BertConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face BERT state dict (with or without the ``bert.`` prefix of
    task models) to :class:`BertModel` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model (the pooler and pre-training heads are dropped, not unknown).
    """

    def rename(key: str, value: Tensor) -> dict[str, Tensor] | None:
        bare = key.removeprefix("bert.")
        parts = bare.rsplit(".", 1)
        if len(parts) == 2 and parts[1] in _NORM_NAMES:
            bare = f"{parts[0]}.{_NORM_NAMES[parts[1]]}"
        match = _LAYER_KEY.fullmatch(bare)
        stem, _, leaf = bare.rpartition(".")
        if match and match.group(2) in _LAYER_KEYS:
            return {f"encoder.layers.{match.group(1)}.{_LAYER_KEYS[match.group(2)]}.{match.group(3)}": value}
        if stem in _EMBEDDING_KEYS:
            return {f"{_EMBEDDING_KEYS[stem]}.{leaf}": value}
        return None

    return rename_tensors(tensors, rename, dropped=_IGNORED)


def finish(module: BertModel, config: BertConfig) -> None:
    """Nothing to do once the weights are assigned: BERT shares no weights."""


def eos_token_ids(config: BertConfig, folder: Path) -> tuple[int, ...]:
    """None: an encoder does not generate."""
    return ()


FAMILY = ModelFamily(
    name="bert",
    model_type="bert",
    causal=False,
    read_config=BertConfig.from_hf,
    build=build,
    state_dict_from_hf=state_dict_from_hf,
    finish=finish,
    eos_token_ids=eos_token_ids,
    summary="post-norm encoder: LayerNorm, exact GELU, learned positions and segment embeddings, biases",
)
