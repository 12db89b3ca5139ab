"""One training run at a time in an output folder.

Two runs started together into the same folder would both find no checkpoint there, both
train, and overwrite each other's files. A run holds an exclusive lock (``flock``) on a
file in the folder for as long as it writes there; a second run is refused at once. The
operating system drops the lock when the process ends, however it ends, so a killed run
never leaves the folder locked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".attnkit-train.lock"


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold the training lock of ``folder`` (which must exist) for the ``with`` block.

    Raises:
        ValueError: another process holds it (the message gives its process id).
    """
    try:
        import fcntl
    except ImportError:  # no flock here (Windows): runs are not serialised
        yield
        return
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise ValueError(
                f"another attnkit train run (process {holder}) is writing into {folder}; wait for it to finish, "
                "or train into another output directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
