"""Data-parallel training of the toy-task Transformers with ``DistributedDataParallel``.

Every rank builds the same model from the same seed, draws the same global batch and trains
on its rows of it; DDP averages the gradients during backward, so every rank takes the
optimizer step of the whole batch. The loss curve is the one a single process computes with
the same seed and global batch (up to rounding), the checkpoint does not depend on the
number of ranks, and a run resumes with the same or another number of ranks. Rank 0 writes
the checkpoints (atomically) and the results.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from attnkit.distributed.env import ProcessInfo
from attnkit.train.loop import DEFAULT_THREADS, Replicas, RunResult, TrainConfig, run


def ddp_replicas(info: ProcessInfo, group: dist.ProcessGroup | None = None) -> Replicas:
    """The :class:`~attnkit.train.Replicas` of this process over ``torch.distributed``:
    the model wrapped in ``DistributedDataParallel``, sums and barriers over ``group``."""

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        device_ids = [info.device] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, process_group=group)

    def all_reduce_sum(t: Tensor) -> None:
        dist.all_reduce(t, group=group)

    def barrier() -> None:
        dist.barrier(group=group)

    return Replicas(
        rank=dist.get_rank(group),
        world_size=dist.get_world_size(group),
        wrap=wrap,
        all_reduce_sum=all_reduce_sum,
        barrier=barrier,
    )


def train(
    config: TrainConfig,
    out_dir: str | Path,
    info: ProcessInfo,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    threads: int | None = DEFAULT_THREADS,
) -> RunResult:
    """:func:`attnkit.train.run` on every rank of the job, data-parallel.

    ``config.device`` is replaced by this rank's device (``info.device``). Every rank must
    call it with the same arguments.

    Returns:
        The run's :class:`~attnkit.train.RunResult`; only rank 0's has metrics.

    Raises:
        ValueError: as :func:`attnkit.train.run`, and a global batch smaller than the
            number of ranks.
    """
    config = dataclasses.replace(config, device=str(info.device))
    return run(
        config,
        out_dir,
        resume=resume,
        stop_after=stop_after,
        progress=progress,
        threads=threads,
        replicas=ddp_replicas(info),
    )
