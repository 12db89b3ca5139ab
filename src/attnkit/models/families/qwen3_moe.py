"""Qwen3-MoE checkpoints on :class:`attnkit.nn.DecoderLM`: a Qwen 3 block (a per-head
RMSNorm on queries and keys, an explicit ``head_dim``) whose feed-forward is a mixture of
experts (:class:`attnkit.nn.MixtureOfExperts`) with Qwen's softmax router and no shared
expert. Tensors are named as Qwen2-MoE's (:mod:`attnkit.models.families.qwen2_moe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, ExpertsConfig, decoder_family
from attnkit.models.families.experts import expert_keys, routing_layers
from attnkit.models.families.llama import LAYER_KEYS, llama_like_config, rename_llama_layout
from attnkit.models.families.qwen2_moe import qwen_router

_LAYER_KEYS = LAYER_KEYS | {"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}
_PROJECTIONS = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Qwen3MoeConfig`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config`, and expert
            counts out of range.
    """
    read = ConfigReader(config, path, aliases={"num_experts": "num_local_experts"})
    return llama_like_config(
        read,
        qk_norm=True,
        experts=ExpertsConfig(
            qwen_router(read),
            expert_dim=read.size("moe_intermediate_size", like="intermediate_size"),
            layers=routing_layers(read, read.size("num_hidden_layers")),
        ),
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face Qwen3-MoE state dict to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    assert config.experts is not None  # read_config sets them
    return rename_llama_layout(
        tensors, config, _LAYER_KEYS | expert_keys("mlp", config.experts.router.num_experts, _PROJECTIONS)
    )


FAMILY = decoder_family(
    name="qwen3_moe",
    model_type="qwen3_moe",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="Qwen 3 with a mixture of experts: softmax router, top-k experts",
)
