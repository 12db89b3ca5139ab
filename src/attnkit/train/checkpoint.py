"""Checkpoints that a killed run never leaves broken.

A checkpoint is written to a temporary file in the same directory, flushed to disk, and
renamed over the previous one with :func:`os.replace`, which is atomic on POSIX and
Windows: a reader sees either the old complete file or the new complete file, never a
half-written one, whenever the process dies.

The content is restricted to what ``torch.load(weights_only=True)`` accepts (dicts, lists,
tuples, strings, numbers, tensors), so loading a checkpoint never runs code from the file.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically.

    Args:
        state: plain data: dicts, lists, strings, numbers and tensors.
        path: the checkpoint file; its directory must exist.

    Returns:
        The path written.

    Raises:
        OSError: the directory is not writable or the disk is full; the previous
            checkpoint, if any, is left untouched and the temporary file removed.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); give it the mode of any new file.
        os.chmod(tmp_name, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(path.parent)
    return path


def _umask() -> int:
    # The umask can only be read by setting it; set it straight back.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); elsewhere directories cannot be opened."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, tensors on the CPU.

    Args:
        path: the checkpoint file.

    Returns:
        The saved state.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a checkpoint (corrupt, or holding objects that are not
            plain data).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError) as err:
        raise ValueError(f"{path} is not a readable checkpoint: {err}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a checkpoint: it holds a {type(state).__name__}, not a dict")
    return state
