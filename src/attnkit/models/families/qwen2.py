"""Qwen 2 (and 2.5) checkpoints on :class:`attnkit.nn.DecoderLM`.

A Qwen 2 block is a LLaMA block (:mod:`attnkit.models.families.llama`, same tensor names) whose
query, key and value projections have biases (the output projection has none). Layers
that ``layer_types`` marks ``"sliding_attention"`` (when ``use_sliding_window`` is set)
attend within ``sliding_window`` tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.llama import llama_like_config, state_dict_from_hf


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Qwen2Config`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config`.
    """
    return llama_like_config(ConfigReader(config, path), qkv_bias=True, out_bias=False)


FAMILY = decoder_family(
    name="qwen2",
    model_type="qwen2",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="LLaMA with biases on the query, key and value projections; optional sliding window per layer",
)
