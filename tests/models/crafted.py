"""Small checkpoint folders to tamper with: a tiny random LLaMA written in Hugging Face's
layout (config.json, model.safetensors, tokenizer.json), and helpers that rewrite a
safetensors header or a tokenizer file."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

WORDS = ["<eos>", "the", "cat", "sat", "on", "mat", "a", "b", "c", "[UNK]"]
TINY_LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 16,
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
    "max_position_embeddings": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 0,
    "hidden_act": "silu",
}


def tiny_llama_tensors(config: dict[str, Any] = TINY_LLAMA_CONFIG) -> dict[str, torch.Tensor]:
    """Random weights in Hugging Face's ``LlamaForCausalLM`` names for ``config``."""
    generator = torch.Generator().manual_seed(0)
    e, ff, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = e // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * d

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.1

    tensors = {"model.embed_tokens.weight": w(v, e), "model.norm.weight": torch.ones(e)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(e),
            p + "post_attention_layernorm.weight": torch.ones(e),
            p + "self_attn.q_proj.weight": w(e, e),
            p + "self_attn.k_proj.weight": w(kv, e),
            p + "self_attn.v_proj.weight": w(kv, e),
            p + "self_attn.o_proj.weight": w(e, e),
            p + "mlp.gate_proj.weight": w(ff, e),
            p + "mlp.up_proj.weight": w(ff, e),
            p + "mlp.down_proj.weight": w(e, ff),
        }
    return tensors


def tokenizer_json(words: list[str] = WORDS) -> dict[str, Any]:
    """A word-level ``tokenizer.json`` (whitespace split) over ``words``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return json.loads(backend.to_str())


def byte_level_tokenizer_json(words: list[str]) -> dict[str, Any]:
    """A ``tokenizer.json`` that spells tokens as byte-level BPE does (GPT-2, LLaMA 3,
    SmolLM2): each of ``words`` is a token, and again after a space as ``"Ġ" + word``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({"\u0120" + w: len(words) + i for i, w in enumerate(words)})
    vocab["[UNK]"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return json.loads(backend.to_str())


def write_tiny_llama(folder: Path) -> Path:
    """A loadable tiny LLaMA checkpoint folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    save_file(tiny_llama_tensors(), str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    return folder


def read_header(path: Path) -> tuple[dict[str, Any], bytes]:
    """A safetensors file's header and its data bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_with_header(path: Path, header: Any, data: bytes, *, header_text: bytes | None = None) -> None:
    """Rewrite a safetensors file with another header (any JSON, or raw bytes)."""
    text = json.dumps(header).encode() if header_text is None else header_text
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


_LLAMA_LAYOUT: dict[str, Any] = {
    **TINY_LLAMA_CONFIG,
    "head_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "partial_rotary_factor": 1.0,
    "attention_bias": False,
    "mlp_bias": False,
    "sliding_window": 4,
    "use_sliding_window": True,
    "layer_types": ["sliding_attention", "full_attention"],
}
_GEMMA: dict[str, Any] = {
    **_LLAMA_LAYOUT,
    "model_type": "gemma2",
    "hidden_act": None,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 4,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "use_bidirectional_attention": False,
}
_SEQ2SEQ_SIZES: dict[str, Any] = {"vocab_size": 16, "d_model": 8, "eos_token_id": 1, "decoder_start_token_id": 0}
# A valid config.json of every family, holding every field the family reads (the fuzz
# test gives each a value of the wrong type in turn).
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": _LLAMA_LAYOUT | {"rope_scaling": None},
    "qwen2": _LLAMA_LAYOUT | {"model_type": "qwen2"},
    "qwen3": _LLAMA_LAYOUT | {"model_type": "qwen3"},
    "mistral": _LLAMA_LAYOUT | {"model_type": "mistral"},
    "phi3": _LLAMA_LAYOUT | {"model_type": "phi3"},
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA
    | {
        "model_type": "gemma3_text",
        "rope_local_base_freq": 10000.0,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        },
    },
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": 16,
        "n_embd": 8,
        "n_head": 2,
        "n_layer": 2,
        "n_inner": 16,
        "n_positions": 32,
        "tie_word_embeddings": True,
        "eos_token_id": 0,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "scale_attn_by_inverse_layer_idx": False,
        "add_cross_attention": False,
        "scale_attn_weights": True,
    },
    "gpt_neox": {
        **{k: TINY_LLAMA_CONFIG[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")},
        "model_type": "gpt_neox",
        "num_attention_heads": 2,
        "head_dim": 4,
        "max_position_embeddings": 32,
        "rotary_emb_base": 10000.0,
        "rotary_pct": 0.5,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "eos_token_id": 0,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "use_parallel_residual": True,
    },
    "bert": {
        **{k: TINY_LLAMA_CONFIG[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")},
        "model_type": "bert",
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
    },
    "t5": _SEQ2SEQ_SIZES
    | {
        "model_type": "t5",
        "d_kv": 4,
        "d_ff": 16,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 2,
        "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16,
        "feed_forward_proj": "relu",
        "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": True,
        "scale_decoder_outputs": True,
        "pad_token_id": 0,
    },
    "bart": _SEQ2SEQ_SIZES
    | {
        "model_type": "bart",
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 16,
        "decoder_ffn_dim": 16,
        "max_position_embeddings": 32,
        "activation_function": "gelu",
        "normalize_before": False,
        "add_final_layer_norm": False,
        "scale_embedding": False,
    },
    "attnkit_transformer": _SEQ2SEQ_SIZES
    | {
        "model_type": "attnkit_transformer",
        "encoder_layers": 2,
        "decoder_layers": 2,
        "attention_heads": 2,
        "ffn_dim": 16,
        "max_position_embeddings": 32,
    },
}
# Values of every JSON type (and the numbers float32 cannot hold) for any field.
WRONG_VALUES: list[Any] = [
    [["full_attention"]],
    ["relu"],
    "gelu",
    "",
    True,
    False,
    None,
    float("nan"),
    float("inf"),
    -1,
    0,
    1e-300,
    1e300,
    2**70,
    {"a": 1},
]
