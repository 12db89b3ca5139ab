"""The models the app serves: each with the batcher of its ``POST /api/attention`` texts and
the queue of its long-context work, and what ``GET /api/info`` says about it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnkit.models.model.kinds import ONE_TEXT, SOURCE_AND_TARGET, ModelKind, for_kind, model_kind
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
    def kind(self) -> ModelKind:
        """The model's kind (:func:`attnkit.models.model_kind`), as ``GET /api/info`` says it."""
        return model_kind(self.model)

    def info(self) -> ServedModelBody:
        """What ``GET /api/info`` says about this model."""
        stacks = for_kind(
            self.model, {ONE_TEXT: _one_text_stacks, SOURCE_AND_TARGET: _encoder_decoder_stacks}, what="GET /api/info"
        )
        return ServedModelBody(
            name=self.name,
            family=str(getattr(self.model, "family", "")),
            kind=self.kind,
            layers=self.model.num_layers,
            heads=self.model.num_heads,
            max_tokens=self.max_tokens,
            max_long_tokens=self.max_long_tokens,
            chat_template=_has_chat_template(self.model),
            **stacks(self.model),
        )


def _one_text_stacks(model: Any) -> dict[str, Any]:
    """What ``GET /api/info`` says of a model of one text beyond its layers and heads: no
    decoder, and each layer's sliding window."""
    return {"decoder_layers": 0, "decoder_heads": 0, "windows": _listed_windows(model)}


def _encoder_decoder_stacks(model: Any) -> dict[str, Any]:
    """What ``GET /api/info`` says of an encoder-decoder :class:`attnkit.models.Model` beyond
    its encoder's layers and heads: its decoder's, and no windows."""
    return {
        "decoder_layers": int(getattr(model, "num_decoder_layers", 0)),
        "decoder_heads": int(model.heads_per_kind["decoder"]),
        "windows": None,
    }


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
