"""DeepSeek-V3 checkpoints on :class:`attnkit.nn.DecoderLM`: multi-head latent attention
(:class:`attnkit.nn.MultiHeadLatentAttention`) in every layer, a dense SwiGLU feed-forward
in the first ``first_k_dense_replace`` layers and a mixture of experts
(:class:`attnkit.nn.MixtureOfExperts`) in the others: a sigmoid router with a correction
bias for the choice, the ``num_experts_per_tok`` best experts within the ``topk_group``
best of ``n_group`` groups, weights renormalised (``norm_topk_prob``) and scaled by
``routed_scaling_factor``, plus ``n_shared_experts`` shared experts run on every token.

The rotary part of each head is laid out in pairs when ``rope_interleave`` is set (the
default); the softmax scale is ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times
YaRN's ``mscale²`` where ``rope_parameters`` give ``mscale_all_dim`` with a scaling type.
The checkpoint's multi-token-prediction layers (``model.layers.N`` for ``N`` from
``num_hidden_layers``) are not used to predict the next token and are left out.

=====================================================  ==========================================
Hugging Face                                           attnkit
=====================================================  ==========================================
``model.layers.N.self_attn.q_proj`` (no query latent)  ``decoder.layers.N.self_attn.q_proj``
``model.layers.N.self_attn.q_a_proj``                  ``decoder.layers.N.self_attn.q_a_proj``
``model.layers.N.self_attn.q_a_layernorm``             ``decoder.layers.N.self_attn.q_a_norm``
``model.layers.N.self_attn.q_b_proj``                  ``decoder.layers.N.self_attn.q_b_proj``
``model.layers.N.self_attn.kv_a_proj_with_mqa``        ``decoder.layers.N.self_attn.kv_a_proj``
``model.layers.N.self_attn.kv_a_layernorm``            ``decoder.layers.N.self_attn.kv_a_norm``
``model.layers.N.self_attn.kv_b_proj``                 ``decoder.layers.N.self_attn.kv_b_proj``
``model.layers.N.self_attn.o_proj``                    ``decoder.layers.N.self_attn.out_proj``
``model.layers.N.mlp.{gate,up,down}_proj`` (dense)     ``decoder.layers.N.ff.{gate,up,down}_proj``
``model.layers.N.mlp.gate``                            ``decoder.layers.N.ff.gate``
``model.layers.N.mlp.experts.E.{…}``                   ``decoder.layers.N.ff.experts.E.{…}``
``model.layers.N.mlp.shared_experts.{…}``              ``decoder.layers.N.ff.shared_experts.{…}``
=====================================================  ==========================================

The norms, embedding and head are named as LLaMA's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, ExpertsConfig, decoder_family
from attnkit.models.families.experts import expert_keys, routing_layers
from attnkit.models.families.llama import rename_llama_layout
from attnkit.nn import LatentAttentionConfig, RouterConfig
from attnkit.nn.rope_scaling import yarn_mscale

_PROJECTIONS = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
_LAYER_KEYS = {
    "input_layernorm": "self_attn_norm",
    "post_attention_layernorm": "ff_norm",
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.q_a_proj": "self_attn.q_a_proj",
    "self_attn.q_a_layernorm": "self_attn.q_a_norm",
    "self_attn.q_b_proj": "self_attn.q_b_proj",
    "self_attn.kv_a_proj_with_mqa": "self_attn.kv_a_proj",
    "self_attn.kv_a_layernorm": "self_attn.kv_a_norm",
    "self_attn.kv_b_proj": "self_attn.kv_b_proj",
    "self_attn.o_proj": "self_attn.out_proj",
    **{f"mlp.{name}": f"ff.{name}" for name in _PROJECTIONS},
    **{f"mlp.shared_experts.{name}": f"ff.shared_experts.{name}" for name in _PROJECTIONS},
}
_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``DeepseekV3Config`` dict.

    Raises:
        CheckpointError: a missing size or one out of range, rotary scaling attnkit does
            not implement, a router whose groups do not fit its experts; the message names
            the field.
    """
    read = ConfigReader(config, path)
    hidden = read.size("hidden_size")
    vocab = read.size("vocab_size")
    layers = read.size("num_hidden_layers")
    heads = read.size("num_attention_heads")
    rope_dim = read.size("qk_rope_head_dim", like="head_dim")
    rope, _ = read.rope(head_dim=rope_dim)
    norm_eps = read.number("rms_norm_eps", 1e-6, high=1.0)
    latent = _latent_attention(read, hidden, heads, norm_eps)
    return DecoderConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=latent.qk_head_dim,
        intermediate_size=read.size("intermediate_size"),
        max_length=read.context_length(rope, 4096),
        tie_embeddings=read.flag("tie_word_embeddings", False),
        eos_token_ids=read.eos(vocab),
        activation=read.choice("hidden_act", {"silu": "swiglu"}, "silu"),
        norm="rms",
        norm_eps=norm_eps,
        positional="rotary",
        rotary_dim=rope_dim,
        ropes=(rope,) * layers,
        windows=(None,) * layers,
        latent_attention=latent,
        experts=_experts(read, layers),
    )


def _latent_attention(read: ConfigReader, hidden: int, heads: int, norm_eps: float) -> LatentAttentionConfig:
    """The latent attention of every layer: its ranks, head dims, rotary layout and scale."""
    nope, rope_dim, v_dim = (
        read.size(key, like="head_dim") for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    )
    q_lora = None if read.config.get("q_lora_rank") is None else read.size("q_lora_rank", like="hidden_size")
    return LatentAttentionConfig(
        hidden,
        heads,
        kv_lora_rank=read.size("kv_lora_rank", like="hidden_size"),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=v_dim,
        q_lora_rank=q_lora,
        bias=read.flag("attention_bias", False),
        scale=(nope + rope_dim) ** -0.5 * _mscale(read) ** 2,
        interleaved_rotary=read.flag("rope_interleave", True),
        norm_eps=norm_eps,
    )


def _experts(read: ConfigReader, layers: int) -> ExpertsConfig:
    """The mixture of experts of the layers after the dense first ones.

    Raises:
        CheckpointError: expert counts out of range, groups that do not fit the experts.
    """
    experts = read.size("n_routed_experts", maximum=4096)
    try:
        router = RouterConfig(
            experts,
            read.size("num_experts_per_tok", maximum=experts),
            scoring="sigmoid",
            norm_topk_prob=read.flag("norm_topk_prob", True),
            routed_scaling_factor=read.number("routed_scaling_factor", 1.0),
            num_groups=read.size("n_group", 1),
            topk_groups=read.size("topk_group", 1),
            correction_bias=True,
        )
    except ValueError as err:
        raise read.refuse("n_group", str(err)) from None
    expert_dim = read.size("moe_intermediate_size", like="intermediate_size")
    shared = read.size("n_shared_experts", 0, minimum=0, maximum=64)
    return ExpertsConfig(
        router,
        expert_dim=expert_dim,
        layers=routing_layers(read, layers, dense_first=read.size("first_k_dense_replace", 0, minimum=0)),
        shared_dim=expert_dim * shared if shared else None,
    )


def _mscale(read: ConfigReader) -> float:
    """YaRN's ``mscale`` of the softmax scale: ``yarn_mscale(factor, mscale_all_dim)`` when
    the rotary parameters have a scaling type and ``mscale_all_dim``, else 1."""
    params = read.config.get("rope_parameters") or read.config.get("rope_scaling") or {}
    if not isinstance(params, dict) or params.get("rope_type", params.get("type", "default")) == "default":
        return 1.0
    scaled = ConfigReader(params, read.path)
    all_dim = scaled.number("mscale_all_dim", 0.0, low=-1.0)
    return yarn_mscale(scaled.number("factor", 1.0), all_dim) if all_dim else 1.0


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face DeepSeek-V3 state dict to :class:`attnkit.nn.DecoderLM` keys,
    leaving out the multi-token-prediction layers.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    assert config.experts is not None  # read_config sets them
    kept = {
        key: value
        for key, value in tensors.items()
        if not ((match := _LAYER_INDEX.match(key)) and int(match.group(1)) >= config.num_layers)
    }
    moe = expert_keys("mlp", config.experts.router.num_experts, _PROJECTIONS)
    return rename_llama_layout(kept, config, _LAYER_KEYS | moe)


FAMILY = decoder_family(
    name="deepseek_v3",
    model_type="deepseek_v3",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="multi-head latent attention (a KV cache of latents), sigmoid-routed mixture of experts with "
    "shared experts and group-limited top-k, dense first layers",
)
