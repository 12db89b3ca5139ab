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
