"""Attention and training beyond one process, on ``torch.distributed`` (gloo on CPU, NCCL on
GPU), launched by ``torchrun``.

- :func:`init` joins the job's process group (NCCL and a GPU when CUDA is present).
- :func:`ring_attention`: exact attention over a sequence sharded across ranks;
  :func:`shard` and :func:`gather` cut a sequence into per-rank shards and join them back.
- :func:`train`: data-parallel training (``DistributedDataParallel``) of the toy-task
  models, the loss curve of one process with the same seed and global batch.
- :func:`survey_heads`: per-head statistics over texts split across ranks.
- Importing this package registers the ``"ring"`` kernel, so that a
  :class:`attnkit.nn.MultiHeadAttention` built with ``AttentionConfig(..., kernel="ring")``
  runs a model sequence-parallel inside a torchrun job.
"""

from attnkit.distributed.env import ProcessInfo, init, launched_by_torchrun, leave
from attnkit.distributed.layout import LAYOUTS, gather, shard, shard_length, shard_positions, shard_ranges
from attnkit.distributed.ring import RingTimings, ring_attention, ring_kernel
from attnkit.distributed.survey import survey_heads
from attnkit.distributed.training import ddp_replicas, train
from attnkit.functional.kernels import register_kernel

register_kernel("ring", ring_kernel)

__all__ = [
    "LAYOUTS",
    "ProcessInfo",
    "RingTimings",
    "ddp_replicas",
    "gather",
    "init",
    "launched_by_torchrun",
    "leave",
    "ring_attention",
    "shard",
    "shard_length",
    "shard_positions",
    "shard_ranges",
    "survey_heads",
    "train",
]
