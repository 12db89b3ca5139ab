"""The Hugging Face references on the same weights as our models (``smollm2``,
``minilm`` and ``gemma3``, in the root conftest), each loaded once per session from the attnkit cache, and
the tiny random checkpoints of the decoder families, each written once per session."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.models.tiny_families import write_tiny_family

# The words of the byte-level tokenizer (letters only: its pattern splits letters from digits).
LETTER_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "and", "slept"]

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


@pytest.fixture(scope="session")
def hf_gemma3(gemma3_path: Path):
    """``(model, tokenizer)`` of transformers' Gemma3ForCausalLM with eager attention."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma3_path, attn_implementation="eager").eval()
    return model, transformers.AutoTokenizer.from_pretrained(gemma3_path)


@pytest.fixture(scope="session")
def tiny_family_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_family_folder(case)``: the folder of the tiny random checkpoint of ``case`` (a
    key of ``tests.models.tiny_families.CASES``), named after the case and written by
    transformers the first time a test asks for it. Tests read these folders and never
    change them (a test that does copies the folder first)."""
    root = tmp_path_factory.mktemp("tiny-families")

    def folder(case: str) -> Path:
        if not (root / case).exists():
            write_tiny_family(case, root / case)
        return root / case

    return folder


@pytest.fixture(scope="session")
def byte_level_gemma3(tiny_family_folder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Gemma 3 with a byte-level tokenizer over :data:`LETTER_WORDS`: its
    tokens are spelled ``"cat"``, ``"Ġsat"``, ... as SmolLM2's are."""
    import shutil

    from tests.models.crafted import byte_level_tokenizer_json

    folder = tmp_path_factory.mktemp("byte-level") / "gemma3_byte_level"
    shutil.copytree(tiny_family_folder("gemma3_text"), folder)
    (folder / "tokenizer.json").write_text(json.dumps(byte_level_tokenizer_json(LETTER_WORDS)))
    return folder
