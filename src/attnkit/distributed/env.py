"""Joining the process group that ``torchrun`` set up: backend and device by what is present.

``torchrun`` starts one process per rank and gives each ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init` reads them, picks NCCL and
the GPU ``cuda:LOCAL_RANK`` when CUDA is available and gloo on the CPU otherwise, and joins.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# How long a collective may wait for the other ranks before it raises (instead of hanging).
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job.

    Attributes:
        rank: global rank; ``world_size``: number of ranks; ``local_rank``: rank on this
        machine; ``device``: where this rank computes; ``backend``: ``"nccl"`` or
        ``"gloo"``.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """Rank 0, the one that writes files and prints."""
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (its rank variables are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(backend: str | None = None, *, device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProcessInfo:
    """Join the process group of this ``torchrun`` job (or return the one already joined).

    Args:
        backend: ``"nccl"`` or ``"gloo"``; default NCCL when CUDA is available (and
            ``device`` is not a CPU), else gloo.
        device: this rank's device; default ``cuda:LOCAL_RANK`` under NCCL, else ``cpu``.
        timeout_s: how long a collective waits for the other ranks before it raises.

    Returns:
        This process's :class:`ProcessInfo`.

    Raises:
        RuntimeError: the process was not started by ``torchrun`` and no group exists.
        ValueError: an unknown backend.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend is None:
        wants_cpu = device is not None and torch.device(device).type == "cpu"
        backend = "nccl" if torch.cuda.is_available() and not wants_cpu else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f'backend must be "nccl" or "gloo", got {backend!r}')
    if device is None:
        device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        if not launched_by_torchrun():
            raise RuntimeError(
                "this process was not started by torchrun (RANK and WORLD_SIZE are not set); launch it with "
                "`torchrun --nproc-per-node N ...` or `attnkit train --nproc N ...`"
            )
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return ProcessInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=dev,
        backend=dist.get_backend(),
    )


def leave() -> None:
    """Leave this job's process group once every rank has got here.

    A rank that simply exits while the group still exists may abort at interpreter exit
    ("terminate called without an active exception") while the others still use the group;
    commands call this when their last collective is done.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
