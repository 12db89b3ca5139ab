"""Upper bounds on a training configuration, checked before anything is allocated.

Each size has a cap far above what these toy tasks need (so that a typo or a crafted
checkpoint cannot ask for billions of symbols or layers), and the run as a whole has a
memory estimate, from the model's exact parameter count (built on the ``meta`` device: no
memory) and the activations of one step, that must stay under :data:`TRAIN_MEMORY_LIMIT`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from attnkit.train.model import build_model
from attnkit.train.tasks import Task


class Sizes(Protocol):
    """The sizes of a run that the memory estimate reads (a
    :class:`attnkit.train.config.TrainConfig`, which imports this module)."""

    @property
    def d_model(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def ff(self) -> int: ...
    @property
    def dropout(self) -> float: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def eval_size(self) -> int: ...


# The largest value of each size; those of the steps live in attnkit.train.config.
FIELD_LIMITS: dict[str, int] = {
    "length": 4096,
    "symbols": 65536,
    "digits": 256,
    "layers": 64,
    "d_model": 65536,
    "heads": 1024,
    "ff": 262144,
    "batch_size": 65536,
    "eval_size": 1_000_000,
    "seed": 2**63 - 1,
}
# What a training run may need in memory: weights, gradients, the optimizer's two moments,
# the activations of one step and the held-out examples.
TRAIN_MEMORY_LIMIT = 8 * 2**30
_FLOAT_BYTES = 4


def check_field_limits(config: Any) -> None:
    """Raises:
    ValueError: a size above its :data:`FIELD_LIMITS` entry, naming the field."""
    for name, limit in FIELD_LIMITS.items():
        value = getattr(config, name)
        if value > limit:
            raise ValueError(f"{name} must be at most {limit:,}, got {value:,}")


def estimated_memory(config: Sizes, task: Task) -> int:
    """Bytes a run of ``config`` on ``task`` needs at its peak, roughly (within a small
    factor): four copies of the parameters (weights, gradients, two AdamW moments), the
    activations kept for the backward pass (per token and layer: the projections, the
    feed-forward hidden units and a row of attention weights per head), the logits with
    their gradients, and the held-out examples."""
    with torch.device("meta"):
        model = build_model(
            task.vocab_size,
            decoder_only=task.decoder_only,
            d_model=config.d_model,
            heads=config.heads,
            layers=config.layers,
            ff=config.ff,
            dropout=config.dropout,
        )
    parameters = sum(p.numel() for p in model.parameters())
    s_in, s_out = task.input_length, task.target_length
    s_total = s_in + s_out + 1  # every position of the encoder and decoder (or the context)
    stacks = 1 if task.decoder_only else 2
    per_token_layer = 10 * config.d_model + 2 * config.ff + 2 * config.heads * s_total
    activations = config.batch_size * s_total * stacks * config.layers * per_token_layer
    logits = 3 * config.batch_size * s_out * task.vocab_size
    held_out = 4 * config.eval_size * s_total  # int64 inputs, targets and predictions
    return _FLOAT_BYTES * (4 * parameters + activations + logits + held_out)


def check_memory(config: Sizes, task: Task) -> None:
    """Raises:
    ValueError: :func:`estimated_memory` is over :data:`TRAIN_MEMORY_LIMIT`; the message
        gives the estimate and the sizes that drive it."""
    needed = estimated_memory(config, task)
    if needed > TRAIN_MEMORY_LIMIT:
        raise ValueError(
            f"this run would need about {_size(needed)} of memory (d_model={config.d_model}, ff={config.ff}, "
            f"layers={config.layers}, heads={config.heads}, batch_size={config.batch_size}, vocabulary "
            f"{task.vocab_size}, {task.input_length + task.target_length} positions), over the "
            f"{_size(TRAIN_MEMORY_LIMIT)} limit; make the model, the batch or the task smaller"
        )


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"
