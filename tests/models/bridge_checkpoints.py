"""Tiny random checkpoints of architectures attnkit has no family for, written by
``transformers`` itself (its own config class, ``from_config``, ``save_pretrained``) with a
word-level ``tokenizer.json``: what the bridge (:mod:`attnkit.models.bridge`) loads.

Each case turns on what its architecture adds so that it matters on a short text: sliding
windows shorter than the text, per-head query/key norms, clipped projections, partial
rotary, scaled embeddings, attention and logits (Granite, Cohere), mixtures of experts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.models.crafted import tokenizer_json

VOCAB = 128
WINDOW = 6  # shorter than the texts of the tests
SIZES: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    # Larger than transformers' 0.02, so that attention is far from uniform.
    "initializer_range": 0.2,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
_WINDOWED = {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}

# model_type → the fields of its transformers config (on top of the sizes above).
CASES: dict[str, dict[str, Any]] = {
    "olmo": {"num_key_value_heads": 2, "clip_qkv": 0.5},
    "olmo2": {"num_key_value_heads": 2},
    "granite": {
        "num_key_value_heads": 2,
        "embedding_multiplier": 2.0,
        "attention_multiplier": 0.3,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
    },
    "cohere": {"num_key_value_heads": 2, "use_qk_norm": True, "logit_scale": 0.5},
    "cohere2": {"num_key_value_heads": 2, **_WINDOWED},
    "stablelm": {"num_key_value_heads": 2, "partial_rotary_factor": 0.25, "qk_layernorm": True},
    "starcoder2": {"num_key_value_heads": 2, "sliding_window": WINDOW},
    "phi": {"partial_rotary_factor": 0.5},
    "gpt_bigcode": {"multi_query": True},
    "exaone4": {"num_key_value_heads": 2, **_WINDOWED},
    "glm4": {"num_key_value_heads": 2, "partial_rotary_factor": 0.5, "eos_token_id": 1},
    "mixtral": {"num_key_value_heads": 1, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    "qwen2_moe": {"num_key_value_heads": 2, "num_experts": 4, **_MOE, "shared_expert_intermediate_size": 32},
    "qwen3_moe": {"num_key_value_heads": 2, "num_experts": 4, **_MOE},
    "smollm3": {"num_key_value_heads": 2, "no_rope_layer_interval": 2},
    "granitemoe": {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "logits_scaling": 2.0},
    "nemotron": {"num_key_value_heads": 2, "partial_rotary_factor": 0.5},
}
# gpt_bigcode names its sizes as GPT-2 does.
_RENAMED = {"gpt_bigcode": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}}


def config_of(model_type: str) -> Any:
    """The ``transformers`` config of the tiny checkpoint of ``model_type``."""
    import transformers

    renamed = _RENAMED.get(model_type, {})
    sizes = {renamed.get(key, key): value for key, value in SIZES.items()}
    if model_type == "gpt_bigcode":
        sizes = {key: value for key, value in sizes.items() if key != "intermediate_size"} | {"n_positions": 64}
        sizes.pop("max_position_embeddings")
    return transformers.AutoConfig.for_model(model_type, **(sizes | CASES[model_type]))


def write_bridge_checkpoint(model_type: str, folder: Path) -> Path:
    """Write the tiny random checkpoint of ``model_type`` into ``folder``: ``config.json``,
    ``model.safetensors`` and ``tokenizer.json``."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_of(model_type))
    model.save_pretrained(folder)
    words = [f"w{i}" for i in range(VOCAB - 1)] + ["[UNK]"]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(words)))
    return folder
