"""Tiny random checkpoints of every decoder family, written by ``transformers`` itself
(its own config class, ``from_config``, ``save_pretrained``) with a word-level
``tokenizer.json``: hidden size 64, a few layers, no download.

Each case sets what its family adds so that it matters on a short text: sliding windows
shorter than the text, soft-capping small enough to bend the scores, partial rotary,
rotary scaling reached by the text (dynamic NTK past ``max_position_embeddings``), and
some folders sharded into several safetensors files with an index.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.models.crafted import tokenizer_json

VOCAB = 128
TEXT_LENGTH = 20  # tokens; every window below is shorter
WINDOW = 6
_SIZES = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "max_position_embeddings": 64}
# Larger than transformers' 0.02, so that attention is far from uniform and the
# soft-capping and windows change the results.
_INIT = {"initializer_range": 0.2, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _config(class_name: str, **fields: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, class_name)(**_INIT, **fields)

    return make


# Multi-head latent attention with every size distinct, 8 routed experts (2 per token) and a
# shared one, a dense first layer.
_DEEPSEEK_SIZES = {
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
}


# case → (transformers config factory, write sharded safetensors)
CASES: dict[str, tuple[Callable[[], Any], bool]] = {
    "gpt2": (_config("GPT2Config", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64), False),
    "gpt_neox": (
        _config("GPTNeoXConfig", **_SIZES, num_hidden_layers=2, num_attention_heads=4, rotary_pct=0.25),
        True,
    ),
    "qwen2": (
        _config(
            "Qwen2Config",
            **_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=1,
        ),
        False,
    ),
    "qwen3": (
        _config(
            "Qwen3Config", **_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32
        ),
        False,
    ),
    "mistral": (
        _config(
            "MistralConfig",
            **_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            sliding_window=WINDOW,
        ),
        False,
    ),
    "gemma2": (
        _config(
            "Gemma2Config",
            **_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=1.5,
        ),
        True,
    ),
    "gemma3_text": (
        _config(
            "Gemma3TextConfig",
            **_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            },
        ),
        False,
    ),
    "phi3": (
        _config(
            "Phi3Config",
            **_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            partial_rotary_factor=0.5,
        ),
        False,
    ),
    "llama_llama3": (
        _config(
            "LlamaConfig",
            **_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        False,
    ),
    "llama_linear": (
        _config(
            "LlamaConfig",
            **_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        ),
        False,
    ),
    "llama_dynamic": (
        _config(
            "LlamaConfig",
            **{**_SIZES, "max_position_embeddings": 16},
            num_hidden_layers=2,
            num_attention_heads=4,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        ),
        False,
    ),
}

# The mixture-of-experts and latent-attention families, apart from CASES: the analyses that
# read dense weights (the lens's W_in, W_V) have no counterpart for them.
MOE_CASES: dict[str, tuple[Callable[[], Any], bool]] = {
    "mixtral": (
        _config(
            "MixtralConfig",
            **_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
        ),
        False,
    ),
    "qwen2_moe": (
        _config(
            "Qwen2MoeConfig",
            **_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            mlp_only_layers=[1],
        ),
        False,
    ),
    "qwen3_moe": (
        _config(
            "Qwen3MoeConfig",
            **_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
        ),
        False,
    ),
    "deepseek_v3": (
        _config(
            "DeepseekV3Config",
            **_SIZES,
            **_DEEPSEEK_SIZES,
            q_lora_rank=24,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
        ),
        True,
    ),
    "deepseek_v3_no_query_latent": (
        _config(
            "DeepseekV3Config",
            **_SIZES,
            **_DEEPSEEK_SIZES,
            q_lora_rank=None,
            rope_interleave=False,
            n_group=1,
            topk_group=1,
        ),
        False,
    ),
}


def write_tiny_family(case: str, folder: Path) -> Path:
    """Write the tiny random checkpoint of ``case`` (a key of :data:`CASES` or
    :data:`MOE_CASES`) into
    ``folder``: ``config.json``, safetensors weights (several shards and an index for the
    sharded cases) and ``tokenizer.json``."""
    import transformers

    make_config, sharded = (CASES | MOE_CASES)[case]
    torch.manual_seed(0)
    config = make_config()
    model = transformers.AutoModelForCausalLM.from_config(config)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            # DeepSeek's choice bias starts at zero: give it values that change the choice.
            buffer.normal_(0.0, 0.3)
    model.save_pretrained(folder, max_shard_size="100KB" if sharded else "10GB")
    words = [f"w{i}" for i in range(VOCAB - 1)] + ["[UNK]"]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(words)))
    return folder


def family_of_case(case: str) -> str:
    """The family a case's checkpoint loads as (cases named ``<family>_<variant>``)."""
    for family in ("llama", "deepseek_v3"):
        if case.startswith(f"{family}_"):
            return family
    return case
