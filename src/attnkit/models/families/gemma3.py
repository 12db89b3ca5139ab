"""Gemma 3 (text) checkpoints on :class:`attnkit.nn.DecoderLM`: Gemma 2's block
(:mod:`attnkit.models.families.gemma2`) with

- a per-head ``(1 + w)`` RMSNorm on queries and keys (``self_attn.q_norm``,
  ``self_attn.k_norm``);
- no soft-capping unless configured;
- five local (sliding-window) layers per global one;
- other rotary frequencies on local layers (``rope_parameters["sliding_attention"]``, or
  ``rope_local_base_freq`` in transformers 4) than on global ones.

The ``model_type`` is ``gemma3_text``: the text model of Gemma 3, as the 270M checkpoint
ships it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader, Rope
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.gemma2 import GEMMA2_LAYER_KEYS, gemma_config
from attnkit.models.families.llama import rename_llama_layout

GEMMA3_LAYER_KEYS = GEMMA2_LAYER_KEYS | {"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Gemma3TextConfig`` dict (transformers 4 or 5 layout).

    Raises:
        CheckpointError: as :func:`attnkit.models.families.gemma2.read_config`.
    """
    read = ConfigReader(config, path)
    layers = read.size("num_hidden_layers")
    _, _, head_dim = read.heads(read.size("hidden_size"))
    windows = read.windows(layers, sliding_by_default=False)
    global_rope, _ = read.rope(head_dim=head_dim, layer_type="full_attention")
    if "rope_local_base_freq" in config:  # transformers 4: default rotary with its own base
        local_rope = Rope(read.number("rope_local_base_freq", 10000.0, low=1.0))
    else:
        local_rope, _ = read.rope(head_dim=head_dim, layer_type="sliding_attention")
    ropes = tuple(global_rope if window is None else local_rope for window in windows)
    return gemma_config(read, ropes=ropes, qk_norm=True)


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a Hugging Face Gemma 3 (text) state dict to :class:`attnkit.nn.DecoderLM` keys.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    return rename_llama_layout(tensors, config, GEMMA3_LAYER_KEYS)


FAMILY = decoder_family(
    name="gemma3_text",
    model_type="gemma3_text",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary=(
        "Gemma 2's block with a per-head (1 + w) RMSNorm on queries and keys, five local layers per global one, "
        "other rotary frequencies on local layers"
    ),
)
