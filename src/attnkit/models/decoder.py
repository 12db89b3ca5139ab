"""What the causal decoder families share: one configuration record, built into an
:class:`attnkit.nn.DecoderLM` from :mod:`attnkit.nn` parts, and the readers of the
``config.json`` fields they have in common.

Each family file (``llama.py``, ``gpt2.py``, ``qwen2.py``, ...) reads its own
``config.json`` into a :class:`DecoderConfig` — saying which options its layers take —
renames its checkpoint's tensors, and ends with a :class:`attnkit.models.family.ModelFamily`
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

from attnkit.models.checkpoint import (
    CONFIG_LIMITS,
    REQUIRED,
    CheckpointError,
    build_without_weights,
    config_bool,
    config_float,
    config_int,
    read_json_object,
    short_repr,
)
from attnkit.models.family import ModelFamily
from attnkit.nn import (
    AttentionConfig,
    DecoderLayer,
    DecoderLM,
    LayerConfig,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    RotaryEmbedding,
    make_norm,
)
from attnkit.nn.feedforward import Activation
from attnkit.nn.norms import NormKind
from attnkit.nn.rope_scaling import DynamicNTKRopeScaling, LinearRopeScaling, Llama3RopeScaling, RopeScaling

# Rotary tables are precomputed up to this many positions (later ones are computed on the
# fly, with the same results): a 128K context would otherwise hold 64 MB of tables.
_ROTARY_TABLE_LIMIT = 8192


@dataclass(frozen=True)
class Rope:
    """The rotary encoding of one layer.

    Attributes:
        theta: the base of the frequencies.
        scaling: how they are stretched for long contexts, or ``None``.
    """

    theta: float
    scaling: RopeScaling | None = None


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


def build(config: DecoderConfig) -> DecoderLM:
    """A :class:`attnkit.nn.DecoderLM` of the configuration on the ``meta`` device (no
    storage), whose weights the checkpoint's replace (then :func:`finish`)."""
    module = build_without_weights(lambda: _build(config))
    assert isinstance(module, DecoderLM)
    return module


def _build(config: DecoderConfig) -> DecoderLM:
    e, d = config.hidden_size, config.head_dim
    # Layers with the same encoding share one module (and its tables).
    rotaries = {
        rope: RotaryEmbedding(
            d,
            theta=rope.theta,
            max_positions=min(config.max_length, _ROTARY_TABLE_LIMIT),
            rotary_dim=config.rotary_dim,
            scaling=rope.scaling,
        )
        for rope in dict.fromkeys(config.ropes)
    }

    def head_norm() -> nn.Module | None:
        return make_norm(config.norm, d, config.norm_eps) if config.qk_norm else None

    layer = _layer_config(config)
    layers = [
        DecoderLayer(
            layer,
            cross_attention=False,
            self_attn=MultiHeadAttention(
                _attention_config(config, i),
                positional=rotaries[config.ropes[i]] if config.positional == "rotary" else None,
                q_norm=head_norm(),
                k_norm=head_norm(),
            ),
        )
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
    """The :class:`attnkit.models.family.ModelFamily` of a causal decoder family: its own
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
    rename: Callable[[str, Tensor], dict[str, Tensor] | None],
    *,
    head_keys: Collection[str] = ("lm_head.weight",),
    dropped: re.Pattern[str] | None = None,
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a decoder checkpoint's tensors to :class:`attnkit.nn.DecoderLM` keys: each
    family gives its own names in ``rename``; the head, saved buffers and the unknown keys
    are handled here, alike for every family.

    Args:
        tensors: the checkpoint's tensors.
        config: its configuration (whether the head is tied to the embedding).
        rename: ``(checkpoint key, tensor)`` → the state-dict entries it becomes (several
            when a fused tensor is split, transposed ones where the layout differs), or
            ``None`` when the key has no place in the model.
        head_keys: the keys the head is saved under. With tied embeddings a saved head is a
            copy of the embedding: it is dropped and the head set to the embedding.
        dropped: keys of buffers that old checkpoints saved beside the weights (causal masks,
            rotary frequencies): recomputed by attnkit, so neither loaded nor unknown.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    state: dict[str, Tensor] = {}
    unknown = []
    for key, value in tensors.items():
        if key in head_keys:
            if not config.tie_embeddings:
                state["lm_head.weight"] = value
            continue
        if dropped is not None and dropped.fullmatch(key):
            continue
        entries = rename(key, value)
        if entries is None:
            unknown.append(key)
        else:
            state.update(entries)
    if config.tie_embeddings and "token_embedding.weight" in state:
        state["lm_head.weight"] = state["token_embedding.weight"]
    return state, unknown


# ---------------------------------------------------------------------------------------
# Reading config.json: what several families have in common.
# ---------------------------------------------------------------------------------------


class ConfigReader:
    """Checked reads of one ``config.json``; every error names the file and the field.

    Args:
        config: the parsed file.
        path: the file.
    """

    def __init__(self, config: dict[str, Any], path: Path) -> None:
        self.config = config
        self.path = path

    def size(self, key: str, default: Any = REQUIRED, *, maximum: int | None = None) -> int:
        """A positive integer field (:func:`attnkit.models.checkpoint.config_int`)."""
        return config_int(self.config, key, path=self.path, default=default, maximum=maximum)

    def number(self, key: str, default: float, *, low: float = 0.0, high: float = 1e12) -> float:
        """A number field with ``low < value <= high``."""
        return config_float(self.config, key, path=self.path, default=default, low=low, high=high)

    def flag(self, key: str, default: bool) -> bool:
        """A boolean field (:func:`attnkit.models.checkpoint.config_bool`)."""
        return config_bool(self.config, key, path=self.path, default=default)

    def optional_number(self, key: str) -> float | None:
        """A positive number field, or ``None`` when absent or ``null``."""
        return None if self.config.get(key) is None else self.number(key, 0.0)

    def refuse(self, key: str, detail: str) -> CheckpointError:
        """The error for a field attnkit cannot load."""
        return CheckpointError(self.path, f"{key}: {detail}", field=key)

    def choice(self, key: str, mapping: dict[str, Any], default: str) -> Any:
        """The value ``mapping`` gives a string field.

        Raises:
            CheckpointError: a value that is not a key of ``mapping`` (listed in the message).
        """
        value = self.config.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, str) or value not in mapping:
            known = ", ".join(repr(k) for k in mapping)
            raise self.refuse(key, f"{short_repr(value)} is not supported (attnkit has {known})")
        return mapping[value]

    def heads(self, hidden: int) -> tuple[int, int, int]:
        """``(num_attention_heads, num_key_value_heads, head_dim)``, checked against each
        other (``head_dim`` defaults to ``hidden_size / num_attention_heads``)."""
        heads = self.size("num_attention_heads")
        kv_heads = self.size("num_key_value_heads", heads, maximum=heads)
        if heads % kv_heads:
            raise self.refuse("num_key_value_heads", f"{heads} query heads are not a multiple of {kv_heads}")
        if self.config.get("head_dim") is None and hidden % heads:
            raise self.refuse("num_attention_heads", f"hidden_size={hidden} is not a multiple of {heads} heads")
        head_dim = self.size("head_dim", hidden // heads)
        return heads, kv_heads, head_dim

    def eos(self, vocab_size: int) -> tuple[int, ...]:
        """``eos_token_id``: absent, one id or a list of ids."""
        return token_ids(self.config.get("eos_token_id"), vocab_size, self.path)

    def no_flags(self, *keys: str) -> None:
        """Refuse features attnkit does not implement that a field switches on."""
        for key in keys:
            if self.flag(key, False):
                raise self.refuse(key, "true is not supported")

    def rope(self, *, head_dim: int, layer_type: str | None = None) -> tuple[Rope, float]:
        """The rotary encoding and its partial factor, from transformers 5's
        ``rope_parameters`` (per layer type where it is keyed so) or transformers 4's
        ``rope_theta`` and ``rope_scaling``.

        Args:
            head_dim: the head dim (the rotated dims' count must stay even).
            layer_type: the key of per-layer-type parameters (Gemma 3), if they are keyed.

        Returns:
            ``(rope, partial_rotary_factor)``.

        Raises:
            CheckpointError: scaling attnkit does not implement (YaRN, LongRoPE), or
                parameters out of range.
        """
        key = next((k for k in ("rope_parameters", "rope_scaling") if self.config.get(k)), "rope_parameters")
        params = self.config.get(key) or {}
        if not isinstance(params, dict):
            raise self.refuse(key, f"must be an object, got {short_repr(params)}")
        if layer_type is not None and layer_type in params:
            key = f"{key}.{layer_type}"
            params = params[layer_type]
            if not isinstance(params, dict):
                raise self.refuse(key, f"must be an object, got {short_repr(params)}")
        merged: dict[str, Any] = {
            k: self.config[k] for k in ("rope_theta", "partial_rotary_factor") if k in self.config
        }
        merged |= params
        sub = ConfigReader(merged, self.path)
        theta = sub.number("rope_theta", 10000.0, low=1.0)
        partial = sub.number("partial_rotary_factor", 1.0, high=1.0)
        rope_type = merged.get("rope_type", merged.get("type", "default"))
        scaling: RopeScaling | None
        try:
            if rope_type == "default":
                scaling = None
            elif rope_type == "linear":
                scaling = LinearRopeScaling(sub.number("factor", 1.0))
            elif rope_type == "llama3":
                scaling = Llama3RopeScaling(
                    sub.number("factor", 8.0),
                    sub.number("low_freq_factor", 1.0),
                    sub.number("high_freq_factor", 4.0),
                    sub.size("original_max_position_embeddings", 8192),
                )
            elif rope_type == "dynamic":
                scaling = DynamicNTKRopeScaling(sub.number("factor", 1.0), self.size("max_position_embeddings", 2048))
            else:
                raise self.refuse(
                    key,
                    f"rope_type={short_repr(rope_type)} is not supported "
                    "(attnkit has 'default', 'linear', 'llama3', 'dynamic')",
                )
        except ValueError as err:
            if isinstance(err, CheckpointError):
                raise
            raise self.refuse(key, str(err)) from None
        rotary_dim = int(head_dim * partial)
        if rotary_dim < 2 or rotary_dim % 2:
            raise self.refuse(key, f"rotates {rotary_dim} dims of each {head_dim}-dim head; they must be even and >= 2")
        return Rope(theta, scaling), partial

    def context_length(self, rope: Rope, default: int) -> int:
        """The most tokens a text may have: ``max_position_embeddings``, times the factor of
        dynamic scaling, which exists to run past the trained context."""
        length = self.size("max_position_embeddings", default)
        if isinstance(rope.scaling, DynamicNTKRopeScaling):
            return min(int(length * rope.scaling.factor), CONFIG_LIMITS["max_position_embeddings"])
        return length

    def windows(self, num_layers: int, *, sliding_by_default: bool) -> tuple[int | None, ...]:
        """The sliding window of every layer: ``sliding_window`` on the layers that
        ``layer_types`` marks ``"sliding_attention"`` (every layer when there is no
        ``layer_types`` and ``sliding_by_default``), ``None`` on the others."""
        window = self.config.get("sliding_window")
        if window is None or not self.flag("use_sliding_window", True):
            return (None,) * num_layers
        size = self.size("sliding_window")
        types = self.config.get("layer_types")
        if types is None:
            return ((size,) if sliding_by_default else (None,)) * num_layers
        if not isinstance(types, list) or len(types) != num_layers:
            raise self.refuse("layer_types", f"must list one type per layer ({num_layers}), got {short_repr(types)}")
        known = {"sliding_attention": size, "full_attention": None}
        unknown = [t for t in types if not isinstance(t, str) or t not in known]
        if unknown:
            raise self.refuse("layer_types", f"{short_repr(unknown[0])} is not supported (attnkit has {list(known)})")
        return tuple(known[t] for t in types)


def token_ids(value: object, vocab_size: int, path: Path) -> tuple[int, ...]:
    """``eos_token_id``: absent, one id or a list of ids, each in ``[0, vocab_size)``.

    Raises:
        CheckpointError: anything else.
    """
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size for v in values):
        raise CheckpointError(
            path, f"eos_token_id must be token ids in [0, {vocab_size}), got {short_repr(value)}", field="eos_token_id"
        )
    return tuple(values)
