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

from torch import Tensor

from attnkit.models.checkpoint import without_init
from attnkit.models.family import ModelFamily
from attnkit.nn import DecoderLM, StackOutput

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
    def from_hf(cls, config: dict[str, Any]) -> LlamaConfig:
        """Read a Hugging Face ``LlamaConfig`` dict (transformers 4 or 5 layout).

        Raises:
            ValueError: a missing size, or a feature attnkit does not implement (biases,
                scaled RoPE, an activation other than SiLU, a head dim other than
                ``hidden_size / num_attention_heads``).
        """
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            out = cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                intermediate_size=int(config["intermediate_size"]),
                rope_theta=float(_rope_parameters(config).get("rope_theta", 10000.0)),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                max_length=int(config.get("max_position_embeddings", 2048)),
                tie_embeddings=bool(config.get("tie_word_embeddings", False)),
                eos_token_ids=_ids(config.get("eos_token_id")),
            )
        except KeyError as err:
            raise ValueError(f"config.json lacks {err.args[0]!r}, which a LLaMA model needs") from None
        unsupported = []
        if config.get("attention_bias") or config.get("mlp_bias"):
            unsupported.append("attention_bias/mlp_bias")
        if config.get("hidden_act", "silu") != "silu":
            unsupported.append(f"hidden_act={config['hidden_act']!r}")
        rope_type = _rope_parameters(config).get("rope_type", _rope_parameters(config).get("type", "default"))
        if rope_type != "default":
            unsupported.append(f"rope_type={rope_type!r}")
        head_dim = config.get("head_dim")
        if head_dim is not None and head_dim * heads != hidden:
            unsupported.append(f"head_dim={head_dim} with hidden_size={hidden} and {heads} heads")
        if hidden % heads or heads % out.num_kv_heads:
            unsupported.append(f"hidden_size={hidden}, {heads} heads, {out.num_kv_heads} key/value heads")
        if unsupported:
            raise ValueError(f"unsupported LLaMA configuration: {', '.join(unsupported)}")
        return out


def build(config: LlamaConfig) -> DecoderLM:
    """A :class:`attnkit.nn.DecoderLM` of the right shape with uninitialised weights, to be
    replaced by the checkpoint's (then :func:`finish`)."""
    with without_init():
        return DecoderLM(
            config.vocab_size, config.hidden_size, config.num_heads, config.num_layers, config.intermediate_size,
            num_kv_heads=config.num_kv_heads, positional="rotary", max_length=config.max_length,
            rope_theta=config.rope_theta,
            activation="swiglu", norm="rms", norm_eps=config.rms_norm_eps, norm_first=True, bias=False,
            dropout=0.0, tie_embeddings=config.tie_embeddings,
        )


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
        ValueError: a ``generation_config.json`` that is not a JSON object.
    """
    path = folder / "generation_config.json"
    extra: tuple[int, ...] = ()
    if path.is_file():
        try:
            extra = _ids(json.loads(path.read_text()).get("eos_token_id"))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            raise ValueError(f"{path} is not a valid JSON object") from None
    return tuple(dict.fromkeys(config.eos_token_ids + extra))


def hidden_states(module: DecoderLM, ids: Tensor, layers: Collection[int]) -> StackOutput:
    """The hidden states after the final norm ``[1, s, e]`` of ids ``[1, s]``, with the
    weights of ``layers``."""
    return module.hidden_states(ids, return_weights=layers)


def logits(module: DecoderLM, hidden: Tensor) -> Tensor:
    """Next-token logits ``[1, s, v]`` of hidden states ``[1, s, e]``."""
    return module.lm_head(hidden)


def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 keeps ``rope_theta`` in ``rope_parameters``; 4.x at the top level
    with the scaling in ``rope_scaling``."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if "rope_theta" in config:
        params = {"rope_theta": config["rope_theta"], **params}
    return params


def _ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


FAMILY = ModelFamily(
    name="llama", model_type="llama", causal=True, read_config=LlamaConfig.from_hf, build=build,
    state_dict_from_hf=state_dict_from_hf, finish=finish, eos_token_ids=eos_token_ids, hidden_states=hidden_states,
    logits=logits,
)
