"""``attnkit.train``: toy tasks, small Transformers trained on them from scratch,
checkpoints that survive being killed, and the evaluation that shows what attention
learned (``attnkit train``).

- :mod:`attnkit.train.tasks`: ``copy``, ``reverse``, ``sort``, ``addition``.
- :mod:`attnkit.train.model`: :class:`EncoderDecoderTransformer`, :class:`DecoderOnlyTransformer`.
- :mod:`attnkit.train.config`: :class:`TrainConfig`.
- :mod:`attnkit.train.loop`: :func:`run`, the trainer, resuming.
- :mod:`attnkit.train.evaluation`: held-out evaluation and the heads' alignment.
- :mod:`attnkit.train.report`: ``metrics.json`` and the example heatmap.
- :mod:`attnkit.train.devices`: the device a run computes on.
- :mod:`attnkit.train.checkpoint`: atomic checkpoint files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit._lazy import lazy_names

if TYPE_CHECKING:
    from attnkit.train.checkpoint import load_checkpoint, save_checkpoint
    from attnkit.train.config import TrainConfig
    from attnkit.train.evaluation import Evaluation, evaluate
    from attnkit.train.loop import Replicas, RunResult, run
    from attnkit.train.model import AttentionMaps, DecoderOnlyTransformer, EncoderDecoderTransformer, build_model
    from attnkit.train.tasks import TASKS, Batch, Task, make_task

# Public name -> the module it comes from, imported on first use: `attnkit train` reads its
# options (attnkit.train.config) without waiting for PyTorch.
_LAZY = {
    **dict.fromkeys(("load_checkpoint", "save_checkpoint"), "attnkit.train.checkpoint"),
    "TrainConfig": "attnkit.train.config",
    **dict.fromkeys(("Evaluation", "evaluate"), "attnkit.train.evaluation"),
    **dict.fromkeys(("Replicas", "RunResult", "run"), "attnkit.train.loop"),
    **dict.fromkeys(
        ("AttentionMaps", "DecoderOnlyTransformer", "EncoderDecoderTransformer", "build_model"), "attnkit.train.model"
    ),
    **dict.fromkeys(("TASKS", "Batch", "Task", "make_task"), "attnkit.train.tasks"),
}

__all__ = [
    "TASKS",
    "AttentionMaps",
    "Batch",
    "DecoderOnlyTransformer",
    "EncoderDecoderTransformer",
    "Evaluation",
    "Replicas",
    "RunResult",
    "Task",
    "TrainConfig",
    "build_model",
    "evaluate",
    "load_checkpoint",
    "make_task",
    "run",
    "save_checkpoint",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
