"""Qwen 3 checkpoints on :class:`attnkit.nn.DecoderLM`.

A Qwen 3 block is a LLaMA block (:mod:`attnkit.models.families.llama`) with an RMSNorm over each
head's queries and keys before the rotation (``self_attn.q_norm``, ``self_attn.k_norm``)
and an explicit ``head_dim`` (``num_heads · head_dim`` need not be ``hidden_size``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.llama import LAYER_KEYS, llama_like_config, rename_llama_layout

_LAYER_KEYS = LAYER_KEYS | {"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Qwen3Config`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config`.
    """
    return llama_like_config(ConfigReader(config, path), qk_norm=True)


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face Qwen 3 state dict to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    return rename_llama_layout(tensors, config, _LAYER_KEYS)


FAMILY = decoder_family(
    name="qwen3",
    model_type="qwen3",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="LLaMA with a per-head RMSNorm on queries and keys and an explicit head_dim",
)
