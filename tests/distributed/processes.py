"""Run a function on real gloo processes on this machine, within a time limit.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` processes, each of which joins a
gloo process group (rendezvous through a file, traffic on loopback) and calls
``fn(rank, world_size, *args)``. The first rank that raises makes ``run_ranks`` raise at once
with that rank's traceback (the others are killed; their own errors, such as "connection
closed by peer", are listed after it); a run that outlives ``timeout`` seconds is
killed and fails; a collective that waits longer than ``collective_timeout`` raises in its rank.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException


class RanksFailed(AssertionError):
    """A rank raised, or the ranks did not finish in time."""


def _rank_main(
    rank: int, fn: Callable[..., Any], world_size: int, store_file: str, collective_timeout: float, args: tuple
) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_file}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=collective_timeout),
    )
    try:
        fn(rank, world_size, *args)
    except BaseException:
        # Written before this rank's sockets close, so it is older than the errors it causes.
        with open(f"{store_file}.rank{rank}.error", "w") as f:
            f.write(f"{time.time()!r}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 90.0, collective_timeout: float = 60.0
) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes.

    Raises:
        RanksFailed: a rank raised (its traceback is in the message) or time ran out.
    """
    with tempfile.TemporaryDirectory(prefix="attnkit-dist-") as tmp:
        store_file = os.path.join(tmp, "store")
        context = mp.start_processes(
            _rank_main,
            args=(fn, world_size, store_file, collective_timeout, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise RanksFailed(f"{world_size} ranks of {fn.__name__} did not finish within {timeout:.0f} s")
        except ProcessException as err:
            raise RanksFailed(
                _first_errors(store_file, world_size) or f"rank {err.error_index} of {world_size} failed:\n{err}"
            ) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(5)


def _first_errors(store_file: str, world_size: int) -> str:
    """The ranks' recorded errors, oldest first."""
    errors = []
    for rank in range(world_size):
        path = f"{store_file}.rank{rank}.error"
        if os.path.exists(path):
            with open(path) as f:
                when, _, text = f.read().partition("\n")
            errors.append((float(when), rank, text))
    errors.sort()
    return "\n".join(f"rank {rank} of {world_size} failed:\n{text}" for _, rank, text in errors)
