"""Checkpoints that a killed run never leaves broken.

A checkpoint is written to a temporary file in the same directory, flushed to disk, and
renamed over the previous one with :func:`os.replace`, which is atomic on POSIX and
Windows: a reader sees either the old complete file or the new complete file, never a
half-written one, whenever the process dies.

The content is restricted to what ``torch.load(weights_only=True)`` accepts (dicts, lists,
tuples, strings, numbers, tensors), so loading a checkpoint never runs code from the file.
A SHA-256 of the content (every tensor's bytes, dtype and shape, and every other value) is
stored beside it under :data:`CHECKSUM_KEY` and checked on reading, so flipped bytes inside
a tensor are an error rather than a silently different run. Temporary files are named
after the writing process; those of a process that no longer runs (killed while writing)
are removed by :func:`remove_stale_temporaries`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"
CHECKSUM_KEY = "sha256"


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically.

    Args:
        state: plain data: dicts, lists, strings, numbers and tensors.
        path: the checkpoint file; its directory must exist.

    Returns:
        The path written.

    Raises:
        OSError: the directory is not writable or the disk is full (also when torch's
            writer reports it as a ``RuntimeError``); the previous checkpoint, if any, is
            left untouched and the temporary file removed.
        ValueError: ``state`` already has a :data:`CHECKSUM_KEY` entry.
    """
    path = Path(path)
    if CHECKSUM_KEY in state:
        raise ValueError(f"state must not have a {CHECKSUM_KEY!r} entry: the checkpoint's checksum goes there")
    stamped = {**state, CHECKSUM_KEY: checksum(state)}
    fd, tmp_name = tempfile.mkstemp(prefix=f"{_temporary_prefix(path)}{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); give it the mode of any new file.
        os.chmod(tmp_name, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            try:
                torch.save(stamped, f)
            except RuntimeError as err:
                # torch's zip writer reports a failed write (a full disk) as a RuntimeError.
                raise OSError(f"writing failed ({str(err).splitlines()[0][:200]})") from err
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(path.parent)
    return path


def checksum(state: Any) -> str:
    """SHA-256, hex, of plain data: every tensor's dtype, shape and bytes, every other
    value's ``repr``, in order."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(f"T{value.dtype}{list(value.shape)}".encode())
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            digest.update(f"D{len(value)}".encode())
            for key, item in value.items():
                feed(key)
                feed(item)
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__[0]}{len(value)}".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"V{value!r};".encode())

    feed(state)
    return digest.hexdigest()


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary files that writers of checkpoint ``path`` left when they were
    killed mid-write: those named after a process that no longer runs.

    Returns:
        The files removed.
    """
    path = Path(path)
    removed = []
    for candidate in path.parent.glob(f"{_temporary_prefix(path)}*.tmp"):
        writer = candidate.name[len(_temporary_prefix(path)) :].split(".", 1)[0]
        if writer.isdigit() and _running(int(writer)):
            continue
        with contextlib.suppress(FileNotFoundError):
            candidate.unlink()
            removed.append(candidate)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
        The saved state (without its checksum).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a checkpoint (corrupt, holding objects that are not
            plain data, or content whose checksum differs from the one stored with it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not a readable checkpoint: {err}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a checkpoint: it holds a {type(state).__name__}, not a dict")
    stored = state.pop(CHECKSUM_KEY, None)
    if stored is None:
        raise ValueError(f"{path} has no checksum: it was not written by attnkit, or by a version without them")
    if stored != checksum(state):
        raise ValueError(f"{path} is corrupt: its content does not match the checksum stored with it")
    return state
