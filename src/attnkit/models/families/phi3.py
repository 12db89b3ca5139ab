"""Phi-3 checkpoints on :class:`attnkit.nn.DecoderLM`.

A Phi-3 block is a LLaMA block whose query, key and value projections are stored as one
matrix (``self_attn.qkv_proj``: the ``h · d`` query rows, then ``h_kv · d`` key rows, then
value rows) and whose SwiGLU gate and up projections are one matrix too
(``mlp.gate_up_proj``: gate rows, then up rows). They are split at load into attnkit's
separate projections. ``partial_rotary_factor`` rotates part of each head, and
``sliding_window`` applies to every layer. LongRoPE scaling (Phi-3 128K) is not
implemented.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import Tensor

from attnkit.models.checkpoints.config_reader import ConfigReader
from attnkit.models.families.decoder import DecoderConfig, decoder_family
from attnkit.models.families.llama import LAYER_KEYS, llama_like_config, rename_llama_layout

_FUSED_KEY = re.compile(r"(model\.layers\.\d+\.)(self_attn\.qkv_proj|mlp\.gate_up_proj)\.weight")


def read_config(config: dict[str, Any], *, path: Path = Path("config.json")) -> DecoderConfig:
    """Read a Hugging Face ``Phi3Config`` dict.

    Raises:
        CheckpointError: as :func:`attnkit.models.families.llama.read_config` (LongRoPE included).
    """
    read = ConfigReader(config, path)
    return llama_like_config(read, windows=read.windows(read.size("num_hidden_layers"), sliding_by_default=True))


def state_dict_from_hf(tensors: dict[str, Tensor], config: DecoderConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Split Phi-3's fused projections, then rename as LLaMA's.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place
        (a fused matrix of the wrong height included).
    """
    split: dict[str, Tensor] = {}
    unfit: list[str] = []
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    for key, value in tensors.items():
        match = _FUSED_KEY.fullmatch(key)
        if match is None:
            split[key] = value
            continue
        prefix, name = match.groups()
        if name == "self_attn.qkv_proj":
            parts = {"self_attn.q_proj": q_rows, "self_attn.k_proj": kv_rows, "self_attn.v_proj": kv_rows}
        else:
            parts = {"mlp.gate_proj": config.intermediate_size, "mlp.up_proj": config.intermediate_size}
        if value.shape[0] != sum(parts.values()):
            unfit.append(key)
            continue
        for (part, _), piece in zip(parts.items(), value.split(list(parts.values()))):
            split[f"{prefix}{part}.weight"] = piece
    state, unknown = rename_llama_layout(split, config, LAYER_KEYS)
    return state, unknown + unfit


FAMILY = decoder_family(
    name="phi3",
    model_type="phi3",
    read_config=read_config,
    state_dict_from_hf=state_dict_from_hf,
    summary="LLaMA with fused qkv_proj and gate_up_proj (split at load), partial rotary, sliding window",
)
