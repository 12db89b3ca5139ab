"""Writing output files so that a failure never leaves half of one.

Every file is written to a temporary file in the same folder and renamed over its name
(:func:`os.replace`, atomic on POSIX and Windows) only once it is complete: on a full disk
or any other error the temporary file is removed, and a file of that name written before
is left as it was, never truncated.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed to ``path`` when the ``with``
    block ends without an error, removed when it raises. The folder is created if needed.

    Yields:
        The temporary path (``.NAME.PID.tmp``; the caller gives the format explicitly where
        the suffix would tell it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` through :func:`atomic_path`.

    Returns:
        ``path``.

    Raises:
        OSError: the folder cannot be written or the disk is full; an older ``path`` is
            left as it was.
    """
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)
