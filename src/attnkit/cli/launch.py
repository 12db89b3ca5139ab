"""``--nproc N``: run this same command as N processes under ``torchrun`` on this machine."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from attnkit.cli import CommandError


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (its rank variables are set): the
    same test as :func:`attnkit.distributed.launched_by_torchrun`, made here so that the
    command checks its options before it imports PyTorch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def add_nproc_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str) -> None:
    parser.add_argument("--nproc", type=int, metavar="N", help=help)


def check_nproc(args: argparse.Namespace) -> None:
    """Raises:
    CommandError: ``--nproc`` below 1."""
    if args.nproc is not None and args.nproc < 1:
        raise CommandError(f"--nproc must be >= 1, got {args.nproc}")


def without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` (or ``--nproc=N``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


def relaunch(args: argparse.Namespace, *, threads: int = 1) -> int:
    """Run the command of ``args`` (less ``--nproc``) as ``args.nproc`` processes under
    ``torchrun --standalone`` and wait for them; each sees torchrun's rank variables.

    Raises:
        CommandError: a process failed (torchrun has printed its error).
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.nproc),
        "-m",
        "attnkit.cli",
        *without_nproc(args.argv),
    ]
    # torchrun would otherwise set one OpenMP thread per process and say so.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    status = subprocess.run(command, check=False, env=env).returncode
    if status != 0:
        raise CommandError(f"the {args.nproc} processes failed (exit status {status}); see their errors above")
    return 0


def check_world_size(args: argparse.Namespace, world_size: int) -> None:
    """Under torchrun, ``--nproc`` (if given) must be the number of processes it started.

    Raises:
        CommandError: it is not.
    """
    if args.nproc is not None and args.nproc != world_size:
        raise CommandError(
            f"--nproc {args.nproc} differs from the number of processes torchrun started "
            f"({world_size}); under torchrun leave --nproc out"
        )
