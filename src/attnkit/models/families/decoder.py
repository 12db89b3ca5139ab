"""What the causal decoder families share: one configuration record, built into an
:class:`attnkit.nn.DecoderLM` from :mod:`attnkit.nn` parts, and the renaming of the head
and saved buffers that their checkpoints have in common.

Each family file (``llama.py``, ``gpt2.py``, ``qwen2.py``, ...) reads its own
``config.json`` into a :class:`DecoderConfig` with a
:class:`attnkit.models.checkpoints.config_reader.ConfigReader` — saying which options its layers take —
renames its checkpoint's tensors, and ends with a :class:`attnkit.models.families.family.ModelFamily`
made by :func:`decoder_family`. Nothing here knows any family by name.

Shape letters: ``s`` number of tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import Tensor, nn

from attnkit.models.checkpoints.config_reader import Rope, token_ids
from attnkit.models.checkpoints.files import read_json_object
from attnkit.models.checkpoints.renaming import Rename, rename_tensors
from attnkit.models.families.family import ModelFamily
from attnkit.models.families.meta_device import build_without_weights
from attnkit.nn import (
    AttentionConfig,
    DecoderLayer,
    DecoderLM,
    LatentAttentionConfig,
    LayerConfig,
    LearnedPositionalEmbedding,
    MixtureOfExperts,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    RotaryEmbedding,
    RouterConfig,
    make_norm,
)
from attnkit.nn.feedforward import Activation
from attnkit.nn.norms import NormKind

# Rotary tables are precomputed up to this many positions (later ones are computed on the
# fly, with the same results): a 128K context would otherwise hold 64 MB of tables.
_ROTARY_TABLE_LIMIT = 8192


@dataclass(frozen=True)
class ExpertsConfig:
    """The mixture-of-experts feed-forward of a decoder (:class:`attnkit.nn.MixtureOfExperts`).

    Attributes:
        router: how tokens are routed.
        expert_dim: each routed expert's hidden dim.
        layers: per layer, whether its feed-forward is the mixture (else a dense SwiGLU of
            the config's ``intermediate_size``: DeepSeek's first layers).
        shared_dim: the shared expert's hidden dim, or ``None``.
        shared_gate: the shared expert is gated by a sigmoid (Qwen2-MoE).
    """

    router: RouterConfig
    expert_dim: int
    layers: tuple[bool, ...]
    shared_dim: int | None = None
    shared_gate: bool = False

    def build(self, embed_dim: int) -> MixtureOfExperts:
        """The block of one layer."""
        return MixtureOfExperts(
            embed_dim, self.expert_dim, self.router, shared_dim=self.shared_dim, shared_gate=self.shared_gate
        )


@dataclass(frozen=True)
class DecoderConfig:
    """A causal decoder read from a ``config.json``: its sizes and the options its layers
    take. Per-layer fields hold one entry per layer.

    Attributes:
        vocab_size: ``v``.
        hidden_size: model dim ``e``.
        num_layers: depth.
        num_heads: query heads ``h``.
        num_kv_heads: key/value heads ``h_kv``.
        head_dim: the size of each head (``h · head_dim`` may differ from ``e``).
        intermediate_size: the feed-forward hidden dim.
        max_length: the context length.
        tie_embeddings: the head shares the token embedding matrix.
        eos_token_ids: ids that end a generation (``config.json``'s).
        activation: the feed-forward's (:data:`attnkit.nn.feedforward.ACTIVATIONS`).
        norm: the norms' kind (:data:`attnkit.nn.norms.NORM_KINDS`).
        norm_eps: their epsilon.
        positional: ``"rotary"`` (inside attention) or ``"learned"`` (added to the
            embeddings).
        rotary_dim: the rotated dims of each head (partial rotary when below ``head_dim``).
        ropes: per layer, the rotary encoding (ignored for learned positions).
        windows: per layer, the sliding window (``None``: every earlier token).
        qkv_bias: biases on the query, key and value projections.
        out_bias: a bias on the attention's output projection.
        mlp_bias: biases in the feed-forward (and on LayerNorms).
        qk_norm: a per-head norm (of kind ``norm``) on queries and keys.
        parallel: attention and feed-forward read the same input (GPT-NeoX).
        output_norms: each sublayer's output is normalised too (Gemma 2).
        attention_scale: the score scale, or ``None`` for ``1/√head_dim``.
        attention_softcap: attention logit soft-capping, or ``None``.
        logit_softcap: final logit soft-capping, or ``None``.
        embedding_scale: multiplies the token embeddings, or ``None``.
        latent_attention: multi-head latent attention in every layer (DeepSeek), instead
            of multi-head attention; ``head_dim`` is then the query/key head dim and
            ``rotary_dim`` the rotary part of it.
        experts: a mixture of experts as the feed-forward of the layers it names.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_length: int
    tie_embeddings: bool
    eos_token_ids: tuple[int, ...]
    activation: Activation
    norm: NormKind
    norm_eps: float
    positional: Literal["rotary", "learned"]
    rotary_dim: int
    ropes: tuple[Rope, ...]
    windows: tuple[int | None, ...]
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    parallel: bool = False
    output_norms: bool = False
    attention_scale: float | None = None
    attention_softcap: float | None = None
    logit_softcap: float | None = None
    embedding_scale: float | None = None
    latent_attention: LatentAttentionConfig | None = None
    experts: ExpertsConfig | None = None


def build(config: DecoderConfig) -> DecoderLM:
    """A :class:`attnkit.nn.DecoderLM` of the configuration on the ``meta`` device (no
    storage), whose weights the checkpoint's replace (then :func:`finish`)."""
    module = build_without_weights(lambda: _build(config))
    assert isinstance(module, DecoderLM)
    return module


def _build(config: DecoderConfig) -> DecoderLM:
    e, d = config.hidden_size, config.head_dim
    # Latent attention rotates a part of each head kept apart: the encoding's head is that part.
    rotary_head = d if config.latent_attention is None else config.rotary_dim
    # Layers with the same encoding share one module (and its tables).
    rotaries = {
        rope: RotaryEmbedding(
            rotary_head,
            theta=rope.theta,
            max_positions=min(config.max_length, _ROTARY_TABLE_LIMIT),
            rotary_dim=config.rotary_dim,
            scaling=rope.scaling,
        )
        for rope in dict.fromkeys(config.ropes)
    }

    def head_norm() -> nn.Module | None:
        return make_norm(config.norm, d, config.norm_eps) if config.qk_norm else None

    def self_attention(i: int) -> MultiHeadAttention:
        positional = rotaries[config.ropes[i]] if config.positional == "rotary" else None
        if config.latent_attention is not None:
            return MultiHeadLatentAttention(config.latent_attention, positional=positional)
        return MultiHeadAttention(
            _attention_config(config, i), positional=positional, q_norm=head_norm(), k_norm=head_norm()
        )

    def feed_forward(i: int) -> nn.Module | None:
        experts = config.experts
        return experts.build(e) if experts is not None and experts.layers[i] else None

    layer = _layer_config(config)
    layers = [
        DecoderLayer(layer, cross_attention=False, self_attn=self_attention(i), ff=feed_forward(i))
        for i in range(config.num_layers)
    ]
    return DecoderLM.from_parts(
        nn.Embedding(config.vocab_size, e),
        layers,
        final_norm=make_norm(config.norm, e, config.norm_eps, bias=config.mlp_bias),
        position=LearnedPositionalEmbedding(config.max_length, e) if config.positional == "learned" else None,
        tie_embeddings=config.tie_embeddings,
        embedding_scale=config.embedding_scale,
        logit_softcap=config.logit_softcap,
    )


def _layer_config(config: DecoderConfig) -> LayerConfig:
    """What every layer of the family shares: pre-norm, no dropout (inference)."""
    return LayerConfig(
        config.hidden_size,
        config.num_heads,
        config.intermediate_size,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dropout=0.0,
        activation=config.activation,
        norm=config.norm,
        norm_eps=config.norm_eps,
        norm_first=True,
        bias=config.mlp_bias,
        parallel=config.parallel,
        output_norms=config.output_norms,
    )


def _attention_config(config: DecoderConfig, layer: int) -> AttentionConfig:
    """The self-attention of one layer (its own sliding window, if any)."""
    return AttentionConfig(
        config.hidden_size,
        config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        bias=config.qkv_bias,
        out_bias=config.out_bias,
        scale=config.attention_scale,
        softcap=config.attention_softcap,
        window=config.windows[layer],
    )


def finish(module: DecoderLM, config: DecoderConfig) -> None:
    """Tie the head to the embedding again once the weights are assigned: assignment gives
    each key its own Parameter object."""
    if config.tie_embeddings:
        module.lm_head.weight = module.token_embedding.weight


def eos_token_ids(config: DecoderConfig, folder: Path) -> tuple[int, ...]:
    """The ids that end a generation: those of ``config.json`` and of
    ``generation_config.json``, which `transformers` uses when generating (it may list
    more), without repeats.

    Raises:
        CheckpointError: a ``generation_config.json`` that is not a JSON object, or ids
            outside the vocabulary.
    """
    path = folder / "generation_config.json"
    extra: tuple[int, ...] = ()
    if path.is_file():
        extra = token_ids(read_json_object(path).get("eos_token_id"), config.vocab_size, path)
    return tuple(dict.fromkeys(config.eos_token_ids + extra))


def decoder_family(
    *,
    name: str,
    model_type: str,
    read_config: Callable[..., DecoderConfig],
    state_dict_from_hf: Callable[[dict[str, Tensor], Any], tuple[dict[str, Tensor], list[str]]],
    summary: str,
) -> ModelFamily:
    """The :class:`attnkit.models.families.family.ModelFamily` of a causal decoder family: its own
    config reader and tensor names, and everything else shared.

    Args:
        name: the family's name.
        model_type: its ``config.json`` ``model_type``.
        read_config: ``(config.json dict, path=file)`` → :class:`DecoderConfig`.
        state_dict_from_hf: renames its checkpoint's tensors to :class:`attnkit.nn.DecoderLM`
            keys.
        summary: what it adds to a plain LLaMA block, for ``attnkit models families``.
    """
    return ModelFamily(
        name=name,
        model_type=model_type,
        causal=True,
        read_config=read_config,
        build=build,
        state_dict_from_hf=state_dict_from_hf,
        finish=finish,
        eos_token_ids=eos_token_ids,
        summary=summary,
    )


def rename_decoder_tensors(
    tensors: dict[str, Tensor],
    config: DecoderConfig,
    rename: Rename,
    *,
    head_keys: Collection[str] = ("lm_head.weight",),
    dropped: re.Pattern[str] | None = None,
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a decoder checkpoint's tensors to :class:`attnkit.nn.DecoderLM` keys
    (:func:`attnkit.models.checkpoints.renaming.rename_tensors`): each family gives its own names in
    ``rename``; the head is handled here, alike for every family.

    Args:
        tensors: the checkpoint's tensors.
        config: its configuration (whether the head is tied to the embedding).
        rename: the family's renaming of each key (:data:`attnkit.models.checkpoints.renaming.Rename`;
            transposed tensors where the layout differs).
        head_keys: the keys the head is saved under. With tied embeddings a saved head is a
            copy of the embedding: it is dropped and the head set to the embedding.
        dropped: keys of buffers that old checkpoints saved beside the weights (causal masks,
            rotary frequencies): recomputed by attnkit, so neither loaded nor unknown.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """

    def rename_with_head(key: str, value: Tensor) -> dict[str, Tensor] | None:
        if key in head_keys:
            return {} if config.tie_embeddings else {"lm_head.weight": value}
        return rename(key, value)

    tied = {"lm_head.weight": "token_embedding.weight"} if config.tie_embeddings else None
    return rename_tensors(tensors, rename_with_head, dropped=dropped, shared=tied)
