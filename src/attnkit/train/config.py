"""The configuration of a training run: :class:`TrainConfig`, with the defaults that
depend on the task."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from attnkit.train.tasks import Task

# The toy tasks, by name (attnkit.train.tasks.TASKS, which imports PyTorch, has one class
# each; a test keeps the two equal). The command line offers them before it imports PyTorch.
TASK_NAMES = ("copy", "reverse", "sort", "addition")

# The loss and accuracy of every step are kept (8 bytes a step): 10 million steps, 80 MB,
# is far beyond what these toy tasks need (8,000 at most).
MAX_STEPS = 10_000_000

# Defaults that depend on the task, applied by TrainConfig.for_task. Addition's small
# decoder-only model needs more steps, each far cheaper (measured: 29% held-out exact
# match after 2000 steps, 100% after 8000, under 4 minutes of one core).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {"addition": {"steps": 8000}}

# CPU threads of a run, for the Python API and the command alike.
DEFAULT_THREADS = 1


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run.

    Attributes:
        task: one of :data:`attnkit.train.tasks.TASKS`.
        length: input length of ``copy``, ``reverse``, ``sort``.
        symbols: number of symbols of ``copy``, ``reverse``, ``sort``.
        digits: digits per operand of ``addition``.
        layers: encoder layers and as many decoder layers (decoder layers for
            ``addition``).
        d_model: model dim, even.
        heads: attention heads; must divide ``d_model``.
        ff: feed-forward hidden dim.
        dropout: dropout rate (the tasks have unlimited data, so 0 by default).
        steps: optimizer steps.
        batch_size: examples per step.
        lr: peak learning rate.
        warmup: steps of linear warm-up before the cosine decay.
        weight_decay: AdamW's decoupled weight decay.
        label_smoothing: of the cross-entropy loss.
        clip: maximum gradient norm.
        seed: seeds weights, training and held-out examples.
        eval_size: held-out examples of the final evaluation.
        checkpoint_every: steps between checkpoints.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
    """

    task: str
    length: int = 16
    symbols: int = 32
    digits: int = 3
    layers: int = 2
    d_model: int = 128
    heads: int = 4
    ff: int = 256
    dropout: float = 0.0
    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 200
    weight_decay: float = 0.01
    label_smoothing: float = 0.0
    clip: float = 1.0
    seed: int = 0
    eval_size: int = 1000
    checkpoint_every: int = 500
    device: str = "cpu"

    # Fields a resumed run may change: they do not enter the training computation.
    # (Another device gives other rounding, but moving a run is worth allowing.)
    RESUMABLE_CHANGES: ClassVar[tuple[str, ...]] = ("device", "eval_size", "checkpoint_every")

    @classmethod
    def for_task(cls, task: str, **options: Any) -> TrainConfig:
        """The config of ``task`` with its defaults (:data:`TASK_DEFAULTS`) and ``options``
        on top."""
        return cls(task=task, **{**TASK_DEFAULTS.get(task, {}), **options})

    def validate(self) -> Task:
        """Check every option and build the task.

        Returns:
            The task the config describes.

        Raises:
            ValueError: the first invalid option, with what was expected and what was got;
                sizes beyond :data:`attnkit.train.budget.FIELD_LIMITS`, or a run whose
                estimated memory is over :data:`attnkit.train.budget.TRAIN_MEMORY_LIMIT`.
        """
        # Imported here: both import PyTorch, which reading a configuration does not need.
        from attnkit.train.budget import check_field_limits, check_memory
        from attnkit.train.tasks import make_task

        if self.task not in TASK_NAMES:
            raise ValueError(f"unknown task {self.task!r}; expected one of {', '.join(TASK_NAMES)}")
        at_least_one = ("layers", "heads", "ff", "steps", "batch_size", "eval_size", "checkpoint_every")
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps > MAX_STEPS:
            raise ValueError(f"steps must be at most {MAX_STEPS:,}, got {self.steps:,}")
        if self.d_model < 2 or self.d_model % 2:
            raise ValueError(f"d_model must be even and >= 2 (sinusoidal encoding), got {self.d_model}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model must be divisible by heads, got d_model={self.d_model} and heads={self.heads}")
        for name in ("dropout", "label_smoothing"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("lr", "clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("lr", "weight_decay"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.warmup < 0 or self.weight_decay < 0:
            raise ValueError(f"warmup and weight_decay must be >= 0, got {self.warmup} and {self.weight_decay}")
        for name in ("warmup", "checkpoint_every"):
            if getattr(self, name) > MAX_STEPS:
                raise ValueError(f"{name} must be at most {MAX_STEPS:,}, got {getattr(self, name):,}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        check_field_limits(self)
        task = make_task(self.task, length=self.length, symbols=self.symbols, digits=self.digits)
        check_memory(self, task)
        return task

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for checkpoints and ``metrics.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The inverse of :meth:`to_dict`.

        Raises:
            ValueError: unknown or missing fields, or a field of the wrong type.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if not all(isinstance(key, str) for key in data) or set(data) - set(fields) or "task" not in data:
            raise ValueError(f"not a training config: fields {sorted(map(str, data))}")
        for name, value in data.items():
            kinds = {"int": (int,), "float": (int, float), "str": (str,)}[str(fields[name].type)]
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ValueError(f"config field {name} must be {fields[name].type}, got {value!r}"[:200])
        return cls(**data)
