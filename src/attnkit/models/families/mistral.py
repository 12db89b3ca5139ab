"""Mistral checkpoints on :class:`attnkit.nn.DecoderLM`.

A Mistral block is a LLaMA block (:mod:`attnkit.models.families.llama`, same tensor names, an
optional explicit ``head_dim``) whose attention keeps, when ``sliding_window`` is set,
only the ``sliding_window`` most recent tokens (each query's own included), on every
layer: an :func:`attnkit.masks.sliding_window` mask.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.llama import llama_like_config, state_dict_from_hf


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``MistralConfig`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config`.
    """
    read = ConfigReader(config, path)
    return llama_like_config(read, windows=read.windows(read.size("num_hidden_layers"), sliding_by_default=True))


FAMILY = decoder_family(
    name="mistral",
    model_type="mistral",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="LLaMA with a sliding window on every layer (sliding_window)",
)
