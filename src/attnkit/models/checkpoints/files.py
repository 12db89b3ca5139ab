"""Finding a checkpoint folder and reading its files (Hugging Face layout: ``config.json``
plus safetensors). Nothing is unpickled: only safetensors weights are named
(:func:`weight_files`), and a pickled ``.bin`` is refused with what to do instead.

Every file a folder holds is untrusted: its size is checked before it is read
(:data:`FILE_LIMITS`), and JSON is parsed strictly (a repeated key is refused).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnkit.models.checkpoints.errors import CheckpointError, ModelNotFound, short_repr
from attnkit.models.checkpoints.registry import MANIFEST, MODELS, fetch_hint, home

# The most bytes each file read at load may have: far above real ones (a configuration is a
# few kilobytes, a large model's index a few hundred, Gemma 3's tokenizer.json 33 MB), far
# below what would exhaust memory while parsing.
FILE_LIMITS: dict[str, int] = {"tokenizer.json": 100 * 2**20, "model.safetensors.index.json": 64 * 2**20}
_SMALL_FILE_LIMIT = 16 * 2**20


def strict_json(text: str | bytes) -> Any:
    """``json.loads`` that refuses repeated keys (which readers resolve differently)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    raise ValueError(f"key {key!r} appears twice")
                seen.add(key)
        return out

    return json.loads(text, object_pairs_hook=pairs)


def resolve(name_or_path: str | os.PathLike[str]) -> tuple[str, Path]:
    """The display name and folder of a known model's name or a local folder.

    Args:
        name_or_path: ``"smollm2"``, ``"minilm"``, or the path of a folder.

    Returns:
        ``(name, folder)``; a folder's name is its last path component.

    Raises:
        ModelNotFound: a known model that is not fetched yet, or neither a known name nor
            an existing path.
        ValueError: a path that is a file, not a folder.
    """
    key = str(name_or_path)
    if key in MODELS:
        folder = home() / key
        if not (folder / MANIFEST).is_file():
            raise ModelNotFound(f"model {key!r} is not fetched yet (looked in {folder}); run {fetch_hint(key)} first")
        return key, folder
    path = Path(key).expanduser()
    if path.is_dir():
        return path.resolve().name, path
    if path.exists():
        raise ValueError(f"{path} is a file; give the folder that holds config.json and the safetensors weights")
    raise ModelNotFound(
        f"no model named {key!r} and no folder at that path; known models: {', '.join(MODELS)} "
        f"(get one with {fetch_hint('NAME')}), or a Hugging Face name ORG/NAME"
    )


def read_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a file of a checkpoint folder, its size checked before anything is read.

    Args:
        path: the file.
        limit: the most bytes it may have (default: :data:`FILE_LIMITS` of its name, 16 MiB
            for the others).

    Raises:
        CheckpointError: not a regular file, larger than ``limit`` (a sparse file of
            gigabytes is refused from its size, unread), or unreadable (a link to
            ``/proc/self/mem``).
    """
    limit = FILE_LIMITS.get(path.name, _SMALL_FILE_LIMIT) if limit is None else limit
    try:
        with path.open("rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(path, "is not a regular file")
            if info.st_size > limit:
                raise CheckpointError(path, f"is {info.st_size} bytes, more than the {limit} attnkit reads from it")
            data = f.read(limit + 1)
    except OSError as err:
        raise CheckpointError(path, f"cannot be read: {err.strerror or err}") from None
    if len(data) > limit:
        raise CheckpointError(path, f"is more than the {limit} bytes attnkit reads from it")
    return data


def read_json_object(path: Path, limit: int | None = None) -> dict[str, Any]:
    """A JSON object file of a checkpoint folder, read by :func:`read_file` and parsed
    strictly (a repeated key is refused).

    Raises:
        CheckpointError: what :func:`read_file` raises, text that is not JSON (or is nested
            too deeply to read), or JSON that is not an object.
    """
    try:
        value = strict_json(read_file(path, limit))
    except (ValueError, UnicodeDecodeError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(path, f"is not valid JSON: {short_repr(str(err), 200)}") from None
    except RecursionError:
        raise CheckpointError(path, "is not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise CheckpointError(path, f"must hold a JSON object, got {type(value).__name__}")
    return value


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder.

    Raises:
        ValueError: no ``config.json``.
        CheckpointError: one that :func:`read_json_object` refuses.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a model folder: it has no config.json")
    return read_json_object(path)


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint: ``model.safetensors``, or the shards named by
    ``model.safetensors.index.json``.

    Raises:
        ValueError: no safetensors weights (pickled ``.bin`` files are refused), or an index
            naming missing shards.
    """
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        contents = read_json_object(index)
        try:
            weight_map = contents["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (KeyError, AttributeError, TypeError) as err:
            raise CheckpointError(
                index, f"is not a valid safetensors index: {short_repr(err)}", field="weight_map"
            ) from None
        bad = [s for s in shards if not _plain_file_name(s)]
        if bad:
            raise CheckpointError(
                index,
                f"shard names must be plain file names of at most {_NAME_MAX} bytes, got {short_repr(bad)}",
                field="weight_map",
            )
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise CheckpointError(index, f"names shards that are missing: {missing}", field="weight_map")
        return [folder / s for s in shards]
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    extra = (
        f" (found {pickled}: pickled weights are never loaded, because unpickling runs arbitrary code; "
        "convert them to safetensors)"
        if pickled
        else ""
    )
    raise ValueError(f"{folder} has no model.safetensors{extra}")


# The longest file name most file systems take, in bytes.
_NAME_MAX = 255


def _plain_file_name(name: object) -> bool:
    """Whether a shard name of an index is a file name in the folder itself: a string with
    no folder part, no NUL, not ``.``/``..``, and short enough to open."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "\0" not in name
        and Path(name).name == name
        and len(name.encode("utf-8", "surrogatepass")) <= _NAME_MAX
    )


def folder_size(folder: Path) -> int:
    """Total bytes of the files directly in ``folder``."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def iter_model_folders(root: Path) -> Iterator[Path]:
    """The complete model folders (with a manifest) under the cache ``root``."""
    if not root.is_dir():
        return
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and (folder / MANIFEST).is_file():
            yield folder
