"""Random LLaMA checkpoints of real models' shapes for the benchmarks: TinyLlama-1.1B's and
Llama-3-8B's, written once by transformers itself (its ``LlamaConfig``, random weights)
into a cache folder, on the device that will run them, with a word-level tokenizer whose
words are ``w0``, ``w1``, ... Time and memory are what they measure, not what the maps show.

Imports PyTorch and transformers only inside the functions that need them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

# name → (layers, hidden size, heads, key-value heads, feed-forward, vocabulary)
SHAPES: dict[str, dict[str, int]] = {
    "tinyllama": {"layers": 22, "hidden": 2048, "heads": 32, "kv_heads": 4, "ffn": 5632, "vocab": 32000},
    "llama3-8b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256},
    # A dry run's: seconds on a CPU.
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 300},
}
# The context every checkpoint is written with, at least: longer texts get their own folder.
BASE_CONTEXT = 2048


def text_of(length: int, vocab: int) -> str:
    """A text of ``length`` tokens of the word-level tokenizer: ``w1 w2 ...``, starting over
    after the last word (``w0`` is never used; the last id is ``[UNK]``)."""
    return " ".join(f"w{1 + i % (vocab - 2)}" for i in range(length))


def parameter_count(shape: dict[str, int]) -> int:
    """The parameters of a LLaMA of ``shape`` with untied embeddings."""
    d = shape["hidden"] // shape["heads"]
    attention = shape["hidden"] * (shape["heads"] + 2 * shape["kv_heads"]) * d + shape["hidden"] ** 2
    return shape["vocab"] * shape["hidden"] * 2 + shape["layers"] * (attention + 3 * shape["hidden"] * shape["ffn"])


def context_for(tokens: int) -> int:
    """The context a checkpoint for texts of ``tokens`` tokens is written with: a power of
    two, at least :data:`BASE_CONTEXT`."""
    context = BASE_CONTEXT
    while context < tokens:
        context *= 2
    return context


def write_checkpoint(
    cache: Path,
    shape: dict[str, int],
    dtype_name: str,
    *,
    tokens: int,
    device: str = "cpu",
    log: Callable[[str], None] = print,
) -> Path:
    """The random checkpoint of ``shape`` in ``dtype_name`` for texts of up to ``tokens``
    tokens, written into ``cache`` the first time (built on ``device``, so that an 8B model
    is drawn on a GPU in seconds), then reused.

    Returns:
        The checkpoint folder (``config.json``, safetensors, ``tokenizer.json``).
    """
    context = context_for(tokens)
    name = "tinyllama-shaped-" + "-".join(f"{k}{v}" for k, v in shape.items()) + f"-{dtype_name}"
    folder = cache / (name if context == BASE_CONTEXT else f"{name}-ctx{context}")
    if (folder / "written.json").is_file():
        return folder
    import torch
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tokenizer_models

    log(f"writing {folder} (once) …")
    config = transformers.LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["ffn"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=context,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype_name))  # drawn in the checkpoint's dtype
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    del model
    words = [f"w{i}" for i in range(shape["vocab"] - 1)] + ["[UNK]"]
    tokenizer = Tokenizer(tokenizer_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.save_pretrained(partial)
    (partial / "written.json").write_text(json.dumps(shape) + "\n")
    os.replace(partial, folder)
    return folder
