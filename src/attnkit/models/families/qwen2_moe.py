"""Qwen2-MoE checkpoints on :class:`attnkit.nn.DecoderLM`: a Qwen 2 block (biases on the
query, key and value projections) whose feed-forward is a mixture of experts
(:class:`attnkit.nn.MixtureOfExperts`): a softmax router over ``num_experts`` experts, the
``num_experts_per_tok`` best per token (renormalised where ``norm_topk_prob``), plus a
shared expert gated by ``sigmoid(x W_g)``. Layers listed in ``mlp_only_layers`` (and all
but every ``decoder_sparse_step``-th) keep a dense feed-forward.

=====================================================  ==========================================
Hugging Face                                           attnkit
=====================================================  ==========================================
``model.layers.N.mlp.gate``                            ``decoder.layers.N.ff.gate``
``model.layers.N.mlp.experts.E.{gate,up,down}_proj``   ``decoder.layers.N.ff.experts.E.{…}``
``model.layers.N.mlp.shared_expert.{…}``               ``decoder.layers.N.ff.shared_experts.{…}``
``model.layers.N.mlp.shared_expert_gate``              ``decoder.layers.N.ff.shared_expert_gate``
=====================================================  ==========================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, ExpertsConfig, decoder_family
from attnkit.models.families.experts import expert_keys, routing_layers
from attnkit.models.families.llama import LAYER_KEYS, llama_like_config, rename_llama_layout
from attnkit.nn import RouterConfig

_PROJECTIONS = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
_SHARED_KEYS = {f"mlp.shared_expert.{name}": f"ff.shared_experts.{name}" for name in _PROJECTIONS} | {
    "mlp.shared_expert_gate": "ff.shared_expert_gate"
}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Qwen2MoeConfig`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config`, and expert
            counts out of range.
    """
    read = ConfigReader(config, path)
    return llama_like_config(
        read,
        qkv_bias=read.flag("qkv_bias", True),
        out_bias=False,
        experts=ExpertsConfig(
            qwen_router(read),
            expert_dim=read.size("moe_intermediate_size", like="intermediate_size"),
            layers=routing_layers(read, read.size("num_hidden_layers")),
            shared_dim=read.size("shared_expert_intermediate_size", like="intermediate_size"),
            shared_gate=True,
        ),
    )


def qwen_router(read: ConfigReader) -> RouterConfig:
    """The softmax router of Qwen's mixtures (``num_experts``, ``num_experts_per_tok``,
    ``norm_topk_prob``)."""
    experts = read.size("num_experts", maximum=4096)
    return RouterConfig(
        experts,
        read.size("num_experts_per_tok", maximum=experts),
        scoring="softmax",
        norm_topk_prob=read.flag("norm_topk_prob", False),
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face Qwen2-MoE state dict to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    assert config.experts is not None  # read_config sets them
    moe = expert_keys("mlp", config.experts.router.num_experts, _PROJECTIONS)
    return rename_llama_layout(tensors, config, LAYER_KEYS | moe | _SHARED_KEYS)


FAMILY = decoder_family(
    name="qwen2_moe",
    model_type="qwen2_moe",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="Qwen 2 with a mixture of experts: softmax router, top-k experts, a sigmoid-gated shared expert",
)
