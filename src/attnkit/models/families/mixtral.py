"""Mixtral checkpoints on :class:`attnkit.nn.DecoderLM`: a Mistral block
(:mod:`attnkit.models.families.llama`'s layout, grouped-query attention, an optional
sliding window) whose feed-forward is a mixture of experts
(:class:`attnkit.nn.MixtureOfExperts`): a softmax router over ``num_local_experts``
experts, the ``num_experts_per_tok`` best per token, their weights renormalised to sum to 1.

=====================================================  ==========================================
Hugging Face                                           attnkit
=====================================================  ==========================================
``model.layers.N.block_sparse_moe.gate``               ``decoder.layers.N.ff.gate``
``model.layers.N.block_sparse_moe.experts.E.w1``       ``decoder.layers.N.ff.experts.E.gate_proj``
``model.layers.N.block_sparse_moe.experts.E.w3``       ``decoder.layers.N.ff.experts.E.up_proj``
``model.layers.N.block_sparse_moe.experts.E.w2``       ``decoder.layers.N.ff.experts.E.down_proj``
=====================================================  ==========================================

The other tensors are named as LLaMA's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, ExpertsConfig, decoder_family
from attnkit.models.families.experts import expert_keys
from attnkit.models.families.llama import LAYER_KEYS, llama_like_config, rename_llama_layout
from attnkit.nn import RouterConfig


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``MixtralConfig`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config`, and expert
            counts out of range.
    """
    read = ConfigReader(config, path)
    experts = read.size("num_local_experts", maximum=4096)
    top_k = read.size("num_experts_per_tok", maximum=experts)
    layers = read.size("num_hidden_layers")
    windows = read.windows(layers, sliding_by_default=True)
    llama = llama_like_config(read)
    return llama_like_config(
        read,
        windows=windows,
        experts=ExpertsConfig(
            RouterConfig(experts, top_k, scoring="softmax", norm_topk_prob=True),
            expert_dim=llama.intermediate_size,
            layers=(True,) * layers,
        ),
    )


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face Mixtral state dict to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    assert config.experts is not None  # read_config sets them
    names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    moe = expert_keys("block_sparse_moe", config.experts.router.num_experts, names)
    return rename_llama_layout(tensors, config, LAYER_KEYS | moe)


FAMILY = decoder_family(
    name="mixtral",
    model_type="mixtral",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="Mistral with a mixture of experts: softmax router, top-k experts renormalised",
)
