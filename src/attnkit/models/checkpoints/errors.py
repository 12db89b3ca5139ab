"""What goes wrong when a checkpoint arrives, said so that a user can act: a model that is
not there (:class:`ModelNotFound`), a file attnkit cannot load (:class:`CheckpointError`,
naming the file and the field), an optional dependency that is not installed
(:func:`require`); and :func:`short_repr`, which shows a value from an untrusted file in a
message without its megabytes.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any


def require(module: str) -> Any:
    """Import an optional dependency of the models extra, or say how to install it.

    Raises:
        ImportError: naming ``pip install 'attnkit[models]'``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"attnkit.models needs {module} ({err}): pip install 'attnkit[models]'") from None


class ModelNotFound(FileNotFoundError):
    """A model that is neither fetched nor a folder on disk; the message says how to get it."""


class CheckpointError(ValueError):
    """A checkpoint file that attnkit cannot load: crafted, corrupt or inconsistent.

    The message starts with the file and, where one field is to blame, names it:
    ``"/m/config.json: num_attention_heads must be an integer from 1 to 1024, got 0"``
    (a ``detail`` that says what the file is, ``"is truncated: ..."``, follows the path
    without a colon).

    Attributes:
        path: the file at fault.
        field: the field (a ``config.json`` key, a tensor name) at fault, or ``None``.
    """

    def __init__(self, path: str | os.PathLike[str], detail: str, *, field: str | None = None) -> None:
        self.path = Path(path)
        self.field = field
        super().__init__(
            f"{self.path} {detail}" if detail.startswith(("is ", "has ", "names ")) else f"{self.path}: {detail}"
        )


def short_repr(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters (a crafted file may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
