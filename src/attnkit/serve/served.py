"""The models the app serves: each with the batcher of its ``POST /api/attention`` texts and
the queue of its long-context work, and what ``GET /api/info`` says about it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnkit.models.protocol import InspectableModel
from attnkit.serve.batching import Batcher
from attnkit.serve.bodies import ServedModelBody
from attnkit.serve.limits import DEFAULT_MAX_QUEUE
from attnkit.serve.work_queue import WorkQueue


@dataclass
class ServedModel:
    """A model the app serves, the :class:`attnkit.serve.batching.Batcher` that runs its
    requests (on one thread, several texts per forward pass), and the
    :class:`attnkit.serve.work_queue.WorkQueue` of its long-context requests (on another
    thread, one at a time). Each queue holds at most ``max_queue`` waiting requests.

    ``max_long_tokens`` is the longest text of the long-context routes (0 for a model that
    has none: an encoder-decoder).
    """

    name: str
    model: InspectableModel
    max_tokens: int
    max_queue: int = DEFAULT_MAX_QUEUE
    max_long_tokens: int = 0
    batcher: Batcher = field(init=False, repr=False)
    long_queue: WorkQueue = field(init=False, repr=False)
    # An encoder-decoder runs one source and target at a time, outside the batcher.
    encoder_decoder_lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.batcher = Batcher(self.model, max_queue=self.max_queue, name=f"attnkit-model-{self.name}")
        self.long_queue = WorkQueue(max_queue=self.max_queue, name=f"attnkit-long-{self.name}")

    @property
    def encoder_decoder(self) -> bool:
        """Whether the model reads a source and a target (:meth:`attnkit.models.Model.run_encoder_decoder`)."""
        return self.model.encoder_decoder

    def info(self) -> ServedModelBody:
        """What ``GET /api/info`` says about this model."""
        kind = "encoder-decoder" if self.encoder_decoder else "causal" if self.model.causal else "bidirectional"
        return ServedModelBody(
            name=self.name,
            family=str(getattr(self.model, "family", "")),
            kind=kind,
            layers=self.model.num_layers,
            decoder_layers=int(getattr(self.model, "num_decoder_layers", 0)) if self.encoder_decoder else 0,
            heads=self.model.num_heads,
            decoder_heads=_decoder_heads(self.model) if self.encoder_decoder else 0,
            max_tokens=self.max_tokens,
            max_long_tokens=self.max_long_tokens,
            windows=None if self.encoder_decoder else _listed_windows(self.model),
            chat_template=_has_chat_template(self.model),
        )


def _has_chat_template(model: Any) -> bool:
    """Whether a model's checkpoint folder has a chat template."""
    from attnkit.models.checkpoints.chat import read_chat_template

    path = getattr(model, "path", None)
    return path is not None and read_chat_template(Path(path)) is not None


def _listed_windows(model: Any) -> list[int | None] | None:
    """Each layer's sliding window, or ``None`` for a model without local layers."""
    from attnkit.inspect.maps import model_windows

    windows = model_windows(model)
    return None if windows is None else list(windows)


def _decoder_heads(model: Any) -> int:
    """An encoder-decoder :class:`attnkit.models.Model`'s heads per decoder layer."""
    return int(model.heads_per_kind["decoder"])
