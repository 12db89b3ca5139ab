"""BART checkpoints on :class:`attnkit.nn.EncoderDecoderLM`.

Shape letters: ``s`` tokens, ``e`` model dim (``d_model``), ``v`` vocabulary size.

A BART layer is a post-norm layer with LayerNorm and biases everywhere, scaled
dot-product attention and a GELU feed-forward (``activation_function``), as the original
Transformer. Each stack embeds its tokens as ``layernorm(token · scale + position)``: the
token matrix (times ``√d_model`` when ``scale_embedding``), a learned position table
whose row of position ``p`` is ``p + 2`` (BART's offset: the table has two extra rows), and
a LayerNorm (``layernorm_embedding``); no final norm after the stacks. The head adds
``final_logits_bias``. With ``tie_word_embeddings`` (the default) both stacks and the head
share ``model.shared``, and the stacks' ``embed_tokens`` and ``lm_head`` are saved copies of
it; without it each reads its own matrix and ``model.shared`` is unused, as in
transformers. Keys map from Hugging Face's
``BartForConditionalGeneration`` (``S`` a stack, ``encoder`` or ``decoder``; ``E`` its
embedding, ``source_embedding`` or ``target_embedding``):

===================================================  ===============================================
Hugging Face                                         attnkit
===================================================  ===============================================
``model.shared`` (tied)                              ``source_embedding.token`` (and the target's)
``model.encoder.embed_tokens`` (untied)              ``source_embedding.token``
``model.decoder.embed_tokens`` (untied)              ``target_embedding.token``
``model.S.embed_positions``                          ``E.position``
``model.S.layernorm_embedding``                      ``E.norm``
``model.S.layers.N.self_attn.{q,k,v,out}_proj``      ``S.layers.N.self_attn.{q,k,v,out}_proj``
``model.S.layers.N.self_attn_layer_norm``            ``S.layers.N.self_attn_norm``
``model.decoder.layers.N.encoder_attn.*``            ``decoder.layers.N.cross_attn.*``
``model.decoder.layers.N.encoder_attn_layer_norm``   ``decoder.layers.N.cross_attn_norm``
``model.S.layers.N.fc1``, ``fc2``                    ``S.layers.N.ff.up_proj``, ``ff.down_proj``
``model.S.layers.N.final_layer_norm``                ``S.layers.N.ff_norm``
``final_logits_bias`` ``[1, v]``                     ``head.proj.bias`` ``[v]``
``lm_head`` (untied)                                 ``head.proj.weight``
===================================================  ===============================================
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.checkpoints.renaming import rename_tensors
from attnkit.models.families.encoder_decoder import (
    EncoderDecoderSizes,
    encoder_decoder_family,
    tie_head_to_token_embedding,
)
from attnkit.nn import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderDecoderLM,
    EncoderLayer,
    LayerConfig,
    LearnedPositionalEmbedding,
    LMHead,
    SequenceEmbedding,
)
from attnkit.nn.feedforward import Activation

# BART's learned positions start at row 2 of the table (rows 0 and 1 were once kept for
# padding).
POSITION_OFFSET = 2
# activation_function → attnkit's activation.
_ACTIVATIONS: dict[str, Activation] = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}
# BART's LayerNorms use torch's default epsilon.
_NORM_EPS = 1e-5
_LAYER_KEYS = {
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.k_proj": "self_attn.k_proj",
    "self_attn.v_proj": "self_attn.v_proj",
    "self_attn.out_proj": "self_attn.out_proj",
    "self_attn_layer_norm": "self_attn_norm",
    "encoder_attn.q_proj": "cross_attn.q_proj",
    "encoder_attn.k_proj": "cross_attn.k_proj",
    "encoder_attn.v_proj": "cross_attn.v_proj",
    "encoder_attn.out_proj": "cross_attn.out_proj",
    "encoder_attn_layer_norm": "cross_attn_norm",
    "fc1": "ff.up_proj",
    "fc2": "ff.down_proj",
    "final_layer_norm": "ff_norm",
}
_LAYER_KEY = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)")
_EMBEDDING_KEY = re.compile(r"model\.(encoder|decoder)\.(embed_positions|layernorm_embedding)\.(weight|bias)")
_EMBEDDING_OF = {"encoder": "source_embedding", "decoder": "target_embedding"}
_EMBEDDING_PARTS = {"embed_positions": "position", "layernorm_embedding": "norm"}
# The matrices each part reads when the embeddings are untied (saved copies of
# model.shared when they are tied).
_OWN_MATRICES = {
    "model.encoder.embed_tokens.weight": "source_embedding.token.weight",
    "model.decoder.embed_tokens.weight": "target_embedding.token.weight",
    "lm_head.weight": "head.proj.weight",
}


@dataclass(frozen=True)
class BartConfig(EncoderDecoderSizes):
    """The sizes of a BART checkpoint, read from its ``config.json``.

    Attributes:
        vocab_size: ``v``.
        d_model: model dim ``e``.
        num_layers: encoder depth (``encoder_layers``).
        num_decoder_layers: decoder depth (``decoder_layers``).
        num_heads: encoder attention heads.
        num_decoder_heads: decoder attention heads (self and cross).
        encoder_ffn_dim: encoder feed-forward hidden dim.
        decoder_ffn_dim: decoder feed-forward hidden dim.
        max_length: learned positions (``max_position_embeddings``).
        activation: the feed-forward activation.
        scale_embedding: token vectors are multiplied by ``√d_model``.
        tie_embeddings: both stacks and the head share ``model.shared`` (when false, as
            ``tie_word_embeddings: false`` says, each reads its own matrix).
        decoder_start_token_id: the decoder's first input (BART: ``</s>``, 2).
        eos_token_ids: ids that end a generation.
        layer_count_fields: the ``config.json`` field of each stack's depth.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    num_decoder_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_length: int
    activation: Activation
    scale_embedding: bool
    tie_embeddings: bool
    decoder_start_token_id: int
    eos_token_ids: tuple[int, ...]
    layer_count_fields: tuple[tuple[str, str], ...] = (("encoder", "encoder_layers"), ("decoder", "decoder_layers"))

    @property
    def intermediate_size(self) -> int:
        """The encoder's feed-forward hidden dim."""
        return self.encoder_ffn_dim

    @classmethod
    def from_hf(cls, config: dict[str, Any], *, path: Path = Path("config.json")) -> BartConfig:
        """Read a Hugging Face ``BartConfig`` dict.

        Args:
            config: the parsed ``config.json``.
            path: its file, named in errors.

        Raises:
            CheckpointError: a missing size, one that is not an integer within the limits
                of :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`, a width that the heads
                do not divide, or an activation or norm placement attnkit does not
                implement; the message names the field.
        """
        read = ConfigReader(config, path)
        vocab = read.size("vocab_size")
        activation = read.choice("activation_function", _ACTIVATIONS, "gelu")
        read.no_flags("normalize_before", "add_final_layer_norm", detail="pre-norm BART variants are not supported")
        d_model = read.size("d_model", like="hidden_size")
        return cls(
            vocab_size=vocab,
            d_model=d_model,
            num_layers=read.size("encoder_layers", like="num_hidden_layers"),
            num_decoder_layers=read.size("decoder_layers", like="num_hidden_layers"),
            num_heads=read.head_count("encoder_attention_heads", width=d_model, width_key="d_model"),
            num_decoder_heads=read.head_count("decoder_attention_heads", width=d_model, width_key="d_model"),
            encoder_ffn_dim=read.size("encoder_ffn_dim", like="intermediate_size"),
            decoder_ffn_dim=read.size("decoder_ffn_dim", like="intermediate_size"),
            max_length=read.size("max_position_embeddings", 1024),
            activation=activation,
            scale_embedding=read.flag("scale_embedding", False),
            tie_embeddings=read.flag("tie_word_embeddings", True),
            decoder_start_token_id=read.token_id("decoder_start_token_id", vocab, 2),
            eos_token_ids=read.eos(vocab),
        )


def _embedding(config: BartConfig, token: nn.Embedding) -> SequenceEmbedding:
    return SequenceEmbedding(
        token,
        scale=math.sqrt(config.d_model) if config.scale_embedding else 1.0,
        position=LearnedPositionalEmbedding(config.max_length + POSITION_OFFSET, config.d_model),
        position_offset=POSITION_OFFSET,
        norm=nn.LayerNorm(config.d_model, eps=_NORM_EPS),
    )


def build_network(config: BartConfig) -> EncoderDecoderLM:
    """A BART :class:`attnkit.nn.EncoderDecoderLM` with random weights (``FAMILY.build``
    builds it without storage, for a checkpoint's weights to replace)."""
    e = config.d_model
    source_token = nn.Embedding(config.vocab_size, e)
    target_token = source_token if config.tie_embeddings else nn.Embedding(config.vocab_size, e)
    options: dict[str, Any] = {
        "dropout": 0.0,
        "activation": config.activation,
        "norm": "layer",
        "norm_eps": _NORM_EPS,
        "norm_first": False,
        "bias": True,
    }
    encoder_layer = LayerConfig(e, config.num_heads, config.encoder_ffn_dim, **options)
    decoder_layer = LayerConfig(e, config.num_decoder_heads, config.decoder_ffn_dim, **options)
    encoder = Encoder(EncoderLayer(encoder_layer) for _ in range(config.num_layers))
    decoder = Decoder(DecoderLayer(decoder_layer) for _ in range(config.num_decoder_layers))
    head = LMHead(e, config.vocab_size, bias=True)
    if config.tie_embeddings:
        head.proj.weight = source_token.weight
    return EncoderDecoderLM(
        source_embedding=_embedding(config, source_token),
        target_embedding=_embedding(config, target_token),
        encoder=encoder,
        decoder=decoder,
        head=head,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: BartConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face BART state dict to :class:`attnkit.nn.EncoderDecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model. With tied embeddings both stacks and the head get ``model.shared``, and
        the stacks' ``embed_tokens`` and ``lm_head`` (saved copies of it) are dropped; with
        untied ones each reads its own tensor and ``model.shared`` (which transformers'
        forward pass never reads then) is dropped. The head's bias is
        ``final_logits_bias`` (zeros when the checkpoint has none, as transformers assumes).
    """

    def rename(key: str, value: Tensor) -> dict[str, Tensor] | None:
        layer = _LAYER_KEY.fullmatch(key)
        if layer and layer.group(3) in _LAYER_KEYS:
            stack, index, name, leaf = layer.groups()
            return {f"{stack}.layers.{index}.{_LAYER_KEYS[name]}.{leaf}": value}
        embedding = _EMBEDDING_KEY.fullmatch(key)
        if embedding:
            stack, part, leaf = embedding.groups()
            return {f"{_EMBEDDING_OF[stack]}.{_EMBEDDING_PARTS[part]}.{leaf}": value}
        if key == "model.shared.weight":
            return {"source_embedding.token.weight": value} if config.tie_embeddings else {}
        if key in _OWN_MATRICES:
            return {} if config.tie_embeddings else {_OWN_MATRICES[key]: value}
        if key == "final_logits_bias":
            return {"head.proj.bias": value.reshape(-1)}
        return None

    tied = {name: "source_embedding.token.weight" for name in _OWN_MATRICES.values()} if config.tie_embeddings else None
    state, unknown = rename_tensors(tensors, rename, shared=tied)
    if "head.proj.bias" not in state and "head.proj.weight" in state:
        weight = state["head.proj.weight"]
        state["head.proj.bias"] = weight.new_zeros(weight.shape[0])
    return state, unknown


def finish(module: EncoderDecoderLM, config: BartConfig) -> None:
    """Tie the target embedding and the head to the source's token matrix again when the
    checkpoint ties them: assignment gives each key its own Parameter object."""
    if not config.tie_embeddings:
        return
    module.target_embedding.token = module.source_embedding.token
    tie_head_to_token_embedding(module)


FAMILY = encoder_decoder_family(
    name="bart",
    model_type="bart",
    read_config=BartConfig.from_hf,
    build_network=build_network,
    state_dict_from_hf=state_dict_from_hf,
    finish=finish,
    summary="post-norm LayerNorm, learned positions from row 2, embedding LayerNorm, GELU, biases, final logits bias",
)
