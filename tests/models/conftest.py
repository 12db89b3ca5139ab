"""The Hugging Face references on the same weights as our models (``smollm2`` and
``minilm``, in the root conftest), each loaded once per session from the attnkit cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The references must never reach for the network: everything is in the attnkit cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path: Path):
    """``(model, tokenizer)`` of transformers' LlamaForCausalLM with eager attention, the
    implementation whose ``output_attentions`` are the reference weights."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_path, attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def hf_smollm2_sdpa(smollm2_path: Path):
    """transformers' LlamaForCausalLM with its default (sdpa) attention: the same kernel as
    attnkit's fused path, so logits agree to the last bits."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(smollm2_path, attn_implementation="sdpa").eval()


@pytest.fixture(scope="session")
def hf_minilm(minilm_path: Path):
    """``(model, tokenizer)`` of transformers' BertModel with eager attention."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(minilm_path)
