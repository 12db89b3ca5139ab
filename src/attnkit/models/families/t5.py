"""T5 checkpoints (T5 v1.0, and v1.1 / Flan-T5 with a gated-GELU feed-forward) on
:class:`attnkit.nn.EncoderDecoderLM`.

Shape letters: ``s`` tokens, ``e`` model dim (``d_model``), ``v`` vocabulary size.

A T5 layer is a pre-norm layer with RMSNorm (no bias, no centring), no biases anywhere,
and unscaled dot-product scores (``q·k``, no ``1/√d``: T5 folds the scale into the
initialisation). Positions enter only as a learned bias per head and bucket of relative
distance (:class:`attnkit.nn.RelativePositionBias`), held by the first layer of each stack
and shared by all its layers: bidirectional buckets in the encoder, past-only buckets in
the decoder, none in cross-attention. Each stack ends with a final norm. The head reads the
decoder's output scaled by ``d_model ** -0.5`` when it is tied to the token embedding (v1.0;
``scale_decoder_outputs``), unscaled otherwise (v1.1). Keys map from Hugging Face's
``T5ForConditionalGeneration`` (``N`` a layer, ``S`` a stack, ``encoder`` or ``decoder``):

======================================================  ===============================================
Hugging Face                                            attnkit
======================================================  ===============================================
``shared``                                              ``source_embedding.token`` (and the target's)
``S.block.N.layer.0.SelfAttention.{q,k,v,o}``           ``S.layers.N.self_attn.{q,k,v,out}_proj``
``S.block.0.layer.0.SelfAttention.relative_attention_`` ``S.layers.*.self_attn.positional`` (shared)
``bias``
``S.block.N.layer.0.layer_norm``                        ``S.layers.N.self_attn_norm``
``decoder.block.N.layer.1.EncDecAttention.{q,k,v,o}``   ``decoder.layers.N.cross_attn.{q,k,v,out}_proj``
``decoder.block.N.layer.1.layer_norm``                  ``decoder.layers.N.cross_attn_norm``
``S.block.N.layer.F.DenseReluDense.wi``                 ``S.layers.N.ff.up_proj`` (``F``: 1 encoder, 2 decoder)
``S.block.N.layer.F.DenseReluDense.{wi_0,wi_1}``        ``S.layers.N.ff.{gate,up}_proj`` (gated)
``S.block.N.layer.F.DenseReluDense.wo``                 ``S.layers.N.ff.down_proj``
``S.block.N.layer.F.layer_norm``                        ``S.layers.N.ff_norm``
``S.final_layer_norm``                                  ``S.final_norm``
``lm_head`` (absent when tied)                          ``head.proj``
======================================================  ===============================================
"""

from __future__ import annotations

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
    AttentionConfig,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderDecoderLM,
    EncoderLayer,
    LayerConfig,
    LMHead,
    MultiHeadAttention,
    RelativePositionBias,
    RMSNorm,
    SequenceEmbedding,
)
from attnkit.nn.feedforward import Activation

# feed_forward_proj → attnkit's activation. T5 v1.1's "gated-gelu" is GELU's tanh
# approximation (transformers' gelu_new).
_ACTIVATIONS: dict[str, Activation] = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gated-gelu": "geglu_tanh",
    "gated-gelu_new": "geglu_tanh",
    "gated-silu": "swiglu",
}
_ATTENTION_KEYS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
_FF_KEYS = {"wi": "up_proj", "wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}
_LAYER_KEY = re.compile(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d)\.(.+)\.weight")
_OUTER_KEYS = {
    "shared.weight": "source_embedding.token.weight",
    "encoder.final_layer_norm.weight": "encoder.final_norm.weight",
    "decoder.final_layer_norm.weight": "decoder.final_norm.weight",
}
# Saved copies of the shared token matrix.
_EMBEDDING_COPIES = re.compile(r"(encoder|decoder)\.embed_tokens\.weight")


@dataclass(frozen=True)
class T5Config(EncoderDecoderSizes):
    """The sizes of a T5 checkpoint, read from its ``config.json``.

    Attributes:
        vocab_size: ``v``.
        d_model: model dim ``e``.
        d_kv: head dim (``num_heads · d_kv`` need not be ``d_model``: T5 v1.1).
        d_ff: feed-forward hidden dim.
        num_layers: encoder depth.
        num_decoder_layers: decoder depth.
        num_heads: heads of every attention.
        num_buckets: relative-position buckets.
        max_distance: distance from which offsets share a bucket.
        activation: the feed-forward activation (:data:`attnkit.nn.feedforward.ACTIVATIONS`).
        layer_norm_eps: every RMSNorm's epsilon.
        tie_embeddings: the head shares the token embedding (``lm_head`` is then absent).
        scale_decoder_outputs: the head reads the decoder output times ``d_model ** -0.5``.
        decoder_start_token_id: the decoder's first input (T5: the padding id, 0).
        eos_token_ids: ids that end a generation.
        max_length: the most tokens a text may have (T5 has no absolute positions; this
            bounds the attention weights a run may ask for).
        layer_count_fields: the ``config.json`` field of each stack's depth.
    """

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    num_buckets: int
    max_distance: int
    activation: Activation
    layer_norm_eps: float
    tie_embeddings: bool
    scale_decoder_outputs: bool
    decoder_start_token_id: int
    eos_token_ids: tuple[int, ...]
    max_length: int = 4096
    layer_count_fields: tuple[tuple[str, str], ...] = (("encoder", "num_layers"), ("decoder", "num_decoder_layers"))

    @property
    def intermediate_size(self) -> int:
        """The feed-forward hidden dim."""
        return self.d_ff

    @classmethod
    def from_hf(cls, config: dict[str, Any], *, path: Path = Path("config.json")) -> T5Config:
        """Read a Hugging Face ``T5Config`` dict (written by transformers 4 or 5).

        Args:
            config: the parsed ``config.json``.
            path: its file, named in errors.

        Raises:
            CheckpointError: a missing size, one that is not an integer within the limits
                of :data:`attnkit.models.checkpoints.config_reader.CONFIG_LIMITS`, or a feed-forward
                activation attnkit does not implement; the message names the field.
        """
        read = ConfigReader(config, path)
        vocab = read.size("vocab_size")
        layers = read.size("num_layers", like="num_hidden_layers")
        activation = read.choice("feed_forward_proj", _ACTIVATIONS, "relu")
        # transformers 5 always ties T5's head and records whether to scale in
        # scale_decoder_outputs; older files say tie_word_embeddings=false for v1.1, whose
        # checkpoints then hold their own lm_head.
        tie = read.flag("tie_word_embeddings", True)
        # Half the buckets of the bidirectional encoder are exact offsets, half of those
        # each way: at least one each, and max_distance beyond the decoder's exact ones.
        buckets = read.size("relative_attention_num_buckets", 32, minimum=4, like="num_attention_heads")
        return cls(
            vocab_size=vocab,
            d_model=read.size("d_model", like="hidden_size"),
            d_kv=read.size("d_kv", like="head_dim"),
            d_ff=read.size("d_ff", like="intermediate_size"),
            num_layers=layers,
            num_decoder_layers=read.size("num_decoder_layers", layers, like="num_hidden_layers"),
            num_heads=read.size("num_heads", like="num_attention_heads"),
            num_buckets=buckets,
            max_distance=read.size(
                "relative_attention_max_distance", 128, minimum=buckets // 2 + 1, like="max_position_embeddings"
            ),
            activation=activation,
            layer_norm_eps=read.number("layer_norm_epsilon", 1e-6, high=1.0),
            tie_embeddings=tie,
            scale_decoder_outputs=read.flag("scale_decoder_outputs", tie),
            decoder_start_token_id=read.token_id(
                "decoder_start_token_id", vocab, read.token_id("pad_token_id", vocab, 0)
            ),
            eos_token_ids=read.eos(vocab),
        )


def _attention(config: T5Config, positional: RelativePositionBias | None) -> MultiHeadAttention:
    return MultiHeadAttention(
        AttentionConfig(config.d_model, config.num_heads, head_dim=config.d_kv, bias=False, score="dot", dropout=0.0),
        positional=positional,
    )


def _layer_config(config: T5Config) -> LayerConfig:
    return LayerConfig(
        config.d_model,
        config.num_heads,
        config.d_ff,
        head_dim=config.d_kv,
        dropout=0.0,
        activation=config.activation,
        norm="rms",
        norm_eps=config.layer_norm_eps,
        norm_first=True,
        bias=False,
    )


def _stack_norm(config: T5Config) -> RMSNorm:
    return RMSNorm(config.d_model, eps=config.layer_norm_eps)


def build_network(config: T5Config) -> EncoderDecoderLM:
    """A T5 :class:`attnkit.nn.EncoderDecoderLM` with random weights (``FAMILY.build``
    builds it without storage, for a checkpoint's weights to replace)."""
    e = config.d_model
    token = nn.Embedding(config.vocab_size, e)
    encoder_bias = RelativePositionBias(
        config.num_heads, num_buckets=config.num_buckets, max_distance=config.max_distance, bidirectional=True
    )
    decoder_bias = RelativePositionBias(
        config.num_heads, num_buckets=config.num_buckets, max_distance=config.max_distance, bidirectional=False
    )
    layer = _layer_config(config)
    encoder = Encoder(
        [EncoderLayer(layer, self_attn=_attention(config, encoder_bias)) for _ in range(config.num_layers)],
        final_norm=_stack_norm(config),
    )
    decoder = Decoder(
        [
            DecoderLayer(layer, self_attn=_attention(config, decoder_bias), cross_attn=_attention(config, None))
            for _ in range(config.num_decoder_layers)
        ],
        final_norm=_stack_norm(config),
    )
    head = LMHead(e, config.vocab_size, input_scale=e**-0.5 if config.scale_decoder_outputs else 1.0)
    if config.tie_embeddings:
        head.proj.weight = token.weight
    return EncoderDecoderLM(
        source_embedding=SequenceEmbedding(token),
        target_embedding=SequenceEmbedding(token),
        encoder=encoder,
        decoder=decoder,
        head=head,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: T5Config) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face T5 state dict to :class:`attnkit.nn.EncoderDecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model. The first layer's relative-position table goes to every layer of its
        stack; both embeddings, and a tied head, get the shared matrix.
    """
    depth = {"encoder": config.num_layers, "decoder": config.num_decoder_layers}

    def rename(key: str, value: Tensor) -> dict[str, Tensor] | None:
        match = _LAYER_KEY.fullmatch(key)
        if match:
            stack, layer, sublayer, rest = match.groups()
            target = _layer_key(stack, int(sublayer), rest)
            if target == "positional":
                positional = (f"{stack}.layers.{i}.self_attn.positional.weight" for i in range(depth[stack]))
                return {name: value for name in positional} if layer == "0" else None
            return None if target is None else {f"{stack}.layers.{layer}.{target}.weight": value}
        if key == "lm_head.weight":
            return {} if config.tie_embeddings else {"head.proj.weight": value}
        outer = _OUTER_KEYS.get(key)
        return None if outer is None else {outer: value}

    shared = {"target_embedding.token.weight": "source_embedding.token.weight"}
    if config.tie_embeddings:
        shared["head.proj.weight"] = "source_embedding.token.weight"
    return rename_tensors(tensors, rename, dropped=_EMBEDDING_COPIES, shared=shared)


def _layer_key(stack: str, sublayer: int, rest: str) -> str | None:
    """The attnkit name (without ``.weight``) of ``S.block.N.layer.<sublayer>.<rest>``,
    ``"positional"`` for the relative-position table, ``None`` for no place."""
    ff = 1 if stack == "encoder" else 2
    parts = rest.split(".")
    if sublayer == 0 and parts[0] == "SelfAttention":
        if parts[1:] == ["relative_attention_bias"]:
            return "positional"
        return f"self_attn.{_ATTENTION_KEYS[parts[1]]}" if len(parts) == 2 and parts[1] in _ATTENTION_KEYS else None
    if sublayer == 1 and stack == "decoder" and parts[0] == "EncDecAttention":
        return f"cross_attn.{_ATTENTION_KEYS[parts[1]]}" if len(parts) == 2 and parts[1] in _ATTENTION_KEYS else None
    if sublayer == ff and parts[0] == "DenseReluDense":
        return f"ff.{_FF_KEYS[parts[1]]}" if len(parts) == 2 and parts[1] in _FF_KEYS else None
    if rest == "layer_norm":
        return {0: "self_attn_norm", 1: "cross_attn_norm", ff: "ff_norm"}.get(sublayer)
    return None


def finish(module: EncoderDecoderLM, config: T5Config) -> None:
    """Share again what the checkpoint stores once: assignment gives each key its own
    Parameter object (the relative-position tables of every layer, a tied head)."""
    for stack in (module.encoder, module.decoder):
        attentions = [layer.self_attn for layer in stack.layers if isinstance(layer.self_attn, MultiHeadAttention)]
        for attention in attentions:
            attention.positional = attentions[0].positional
    if config.tie_embeddings:
        tie_head_to_token_embedding(module)


FAMILY = encoder_decoder_family(
    name="t5",
    model_type="t5",
    read_config=T5Config.from_hf,
    build_network=build_network,
    state_dict_from_hf=state_dict_from_hf,
    finish=finish,
    summary="pre-norm RMSNorm, unscaled scores, shared relative position buckets, no biases; ReLU or gated-GELU (v1.1), tied or untied head",
)
