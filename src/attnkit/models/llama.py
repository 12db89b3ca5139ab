"""LLaMA-family checkpoints (SmolLM2 and friends) on :class:`attnkit.nn.DecoderLM`.

A LLaMA block is exactly a pre-norm :class:`attnkit.nn.DecoderLayer` with RMSNorm, rotary
positions in the half-split layout, grouped-query attention, SwiGLU and no biases; the
head shares the token embedding when ``tie_word_embeddings`` is set. Only the key names
differ from Hugging Face's ``LlamaForCausalLM``:

=====================================================  ==========================================
Hugging Face                                           attnkit
=====================================================  ==========================================
``model.embed_tokens``                                 ``token_embedding``
``model.layers.N.input_layernorm``                     ``decoder.layers.N.self_attn_norm``
``model.layers.N.self_attn.{q,k,v}_proj``              ``decoder.layers.N.self_attn.{q,k,v}_proj``
``model.layers.N.self_attn.o_proj``                    ``decoder.layers.N.self_attn.out_proj``
``model.layers.N.post_attention_layernorm``            ``decoder.layers.N.ff_norm``
``model.layers.N.mlp.{gate,up,down}_proj``             ``decoder.layers.N.ff.{gate,up,down}_proj``
``model.norm``                                         ``decoder.final_norm``
``lm_head`` (absent when tied)                         ``lm_head``
=====================================================  ==========================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnkit.models.checkpoint import (
    REQUIRED,
    CheckpointError,
    build_without_weights,
    config_float,
    config_int,
    short_repr,
)
from attnkit.models.family import ModelFamily
from attnkit.nn import DecoderLM, MultiHeadAttention, StackOutput

_LAYER_KEYS = {
    "input_layernorm": "self_attn_norm",
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.k_proj": "self_attn.k_proj",
    "self_attn.v_proj": "self_attn.v_proj",
    "self_attn.o_proj": "self_attn.out_proj",
    "post_attention_layernorm": "ff_norm",
    "mlp.gate_proj": "ff.gate_proj",
    "mlp.up_proj": "ff.up_proj",
    "mlp.down_proj": "ff.down_proj",
}
_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a LLaMA-family checkpoint, read from its ``config.json``.

    Attributes:
        vocab_size: ``v``.
        hidden_size: model dim ``e``.
        num_layers: depth.
        num_heads: query heads ``h``.
        num_kv_heads: key/value heads ``h_kv``.
        intermediate_size: SwiGLU hidden dim.
        rope_theta: base of the rotary frequencies.
        rms_norm_eps: RMSNorm epsilon.
        max_length: the context length (``max_position_embeddings``).
        tie_embeddings: the head shares the token embedding matrix.
        eos_token_ids: ids that end a generation.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_length: int
    tie_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf(cls, config: dict[str, Any], *, path: Path = Path("config.json")) -> LlamaConfig:
        """Read a Hugging Face ``LlamaConfig`` dict (transformers 4 or 5 layout).

        Args:
            config: the parsed ``config.json``.
            path: its file, named in errors.

        Raises:
            CheckpointError: a missing size, one that is not an integer within
                :data:`attnkit.models.checkpoint.CONFIG_LIMITS`, or a feature attnkit does
                not implement (biases, scaled RoPE, an activation other than SiLU, a head
                dim other than ``hidden_size / num_attention_heads``); the message names
                the field.
        """

        def size(key: str, default: Any = REQUIRED, maximum: int | None = None) -> int:
            return config_int(config, key, path=path, default=default, maximum=maximum)

        def refuse(key: str, detail: str) -> CheckpointError:
            return CheckpointError(path, f"{key}: {detail}", field=key)

        rope_key = next((k for k in ("rope_parameters", "rope_scaling") if config.get(k)), "rope_parameters")
        rope = config.get(rope_key) or {}
        if not isinstance(rope, dict):
            raise refuse(rope_key, f"must be an object, got {short_repr(rope)}")
        rope = {"rope_theta": config["rope_theta"], **rope} if "rope_theta" in config else rope
        hidden, heads = size("hidden_size"), size("num_attention_heads")
        vocab = size("vocab_size")
        out = cls(
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=size("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=size("num_key_value_heads", heads, maximum=heads),
            intermediate_size=size("intermediate_size"),
            rope_theta=config_float(rope, "rope_theta", path=path, default=10000.0, low=1.0, high=1e12),
            rms_norm_eps=config_float(config, "rms_norm_eps", path=path, default=1e-6, low=0.0, high=1.0),
            max_length=size("max_position_embeddings", 2048),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_ids=_ids(config.get("eos_token_id"), vocab, path),
        )
        for key in ("attention_bias", "mlp_bias"):
            if config.get(key):
                raise refuse(key, "biases are not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise refuse("hidden_act", f"{short_repr(config['hidden_act'])} is not supported (only 'silu')")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise refuse(rope_key, f"rope_type={short_repr(rope_type)} is not supported (only 'default')")
        if hidden % heads:
            raise refuse("num_attention_heads", f"hidden_size={hidden} is not a multiple of {heads} heads")
        head_dim = size("head_dim", hidden // heads)
        if head_dim * heads != hidden:
            raise refuse("head_dim", f"{head_dim} with hidden_size={hidden} and {heads} heads is not supported")
        if (hidden // heads) % 2:
            raise refuse("num_attention_heads", f"the head dim hidden_size / heads = {hidden // heads} must be even")
        if heads % out.num_kv_heads:
            raise refuse("num_key_value_heads", f"{heads} query heads are not a multiple of {out.num_kv_heads}")
        return out


def build(config: LlamaConfig) -> DecoderLM:
    """A :class:`attnkit.nn.DecoderLM` of the right shape on the ``meta`` device (no
    storage), whose weights the checkpoint's replace (then :func:`finish`)."""
    module = build_without_weights(
        lambda: DecoderLM(
            config.vocab_size,
            config.hidden_size,
            config.num_heads,
            config.num_layers,
            config.intermediate_size,
            num_kv_heads=config.num_kv_heads,
            positional="rotary",
            max_length=config.max_length,
            rope_theta=config.rope_theta,
            activation="swiglu",
            norm="rms",
            norm_eps=config.rms_norm_eps,
            norm_first=True,
            bias=False,
            dropout=0.0,
            tie_embeddings=config.tie_embeddings,
        )
    )
    assert isinstance(module, DecoderLM)
    return module


def state_dict_from_hf(tensors: dict[str, Tensor], config: LlamaConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face LLaMA state dict to :class:`attnkit.nn.DecoderLM` keys.

    Args:
        tensors: the checkpoint's tensors.
        config: its configuration.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place in
        the model. With tied embeddings the head gets the embedding matrix.
    """
    state: dict[str, Tensor] = {}
    unknown = []
    for key, value in tensors.items():
        match = _LAYER_KEY.fullmatch(key)
        if match and match.group(2) in _LAYER_KEYS:
            state[f"decoder.layers.{match.group(1)}.{_LAYER_KEYS[match.group(2)]}.weight"] = value
        elif key == "model.embed_tokens.weight":
            state["token_embedding.weight"] = value
        elif key == "model.norm.weight":
            state["decoder.final_norm.weight"] = value
        elif key == "lm_head.weight" and not config.tie_embeddings:
            state["lm_head.weight"] = value
        elif key == "lm_head.weight" or key.endswith("rotary_emb.inv_freq"):
            continue  # a saved copy of the tied head, or frequencies that are recomputed
        else:
            unknown.append(key)
    if config.tie_embeddings and "token_embedding.weight" in state:
        state["lm_head.weight"] = state["token_embedding.weight"]
    return state, unknown


def finish(module: DecoderLM, config: LlamaConfig) -> None:
    """Tie the head to the embedding again once the weights are assigned: assignment gives
    each key its own Parameter object."""
    if config.tie_embeddings:
        module.lm_head.weight = module.token_embedding.weight


def eos_token_ids(config: LlamaConfig, folder: Path) -> tuple[int, ...]:
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
        try:
            generation = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise CheckpointError(path, "is not valid JSON") from None
        if not isinstance(generation, dict):
            raise CheckpointError(path, "must hold a JSON object")
        extra = _ids(generation.get("eos_token_id"), config.vocab_size, path)
    return tuple(dict.fromkeys(config.eos_token_ids + extra))


def hidden_states(module: DecoderLM, ids: Tensor, layers: Collection[int]) -> StackOutput:
    """The hidden states after the final norm ``[1, s, e]`` of ids ``[1, s]``, with the
    weights of ``layers``."""
    return module.hidden_states(ids, return_weights=layers)


def logits(module: DecoderLM, hidden: Tensor) -> Tensor:
    """Next-token logits ``[1, s, v]`` of hidden states ``[1, s, e]``."""
    return module.lm_head(hidden)


def _ids(value: object, vocab_size: int, path: Path) -> tuple[int, ...]:
    """``eos_token_id``: absent, one id or a list of ids, each in ``[0, vocab_size)``."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size for v in values):
        raise CheckpointError(
            path, f"eos_token_id must be token ids in [0, {vocab_size}), got {short_repr(value)}", field="eos_token_id"
        )
    return tuple(values)


def self_attention(module: nn.Module, layer: int) -> MultiHeadAttention:
    """The self-attention module of layer ``layer``."""
    return module.decoder.layers[layer].self_attn


FAMILY = ModelFamily(
    name="llama",
    model_type="llama",
    causal=True,
    read_config=LlamaConfig.from_hf,
    build=build,
    state_dict_from_hf=state_dict_from_hf,
    finish=finish,
    eos_token_ids=eos_token_ids,
    hidden_states=hidden_states,
    logits=logits,
    self_attention=self_attention,
)
