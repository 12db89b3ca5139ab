"""The manifest ``attnkit models fetch`` writes into a model folder (each file's size and
SHA-256), read back strictly and checked at load."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from attnkit.models.checkpoints.errors import require
from attnkit.models.checkpoints.registry import MANIFEST, MODELS, fetch_hint

_CHUNK = 2**20


def sha256_file(path: Path, *, progress: bool = False, label: str | None = None) -> str:
    """The SHA-256 of a file, hex, read in 1 MiB chunks (with a progress bar if asked)."""
    tqdm = require("tqdm.auto").tqdm
    digest = hashlib.sha256()
    with (
        path.open("rb") as f,
        tqdm(
            total=path.stat().st_size,
            unit="B",
            unit_scale=True,
            desc=label or f"sha256 {path.name}",
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


# A manifest lists a handful of files; a larger one is not one attnkit wrote.
_MAX_MANIFEST_BYTES = 2**20
# The names of the files a manifest may list: plain names inside the folder.
_MANIFEST_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest ``attnkit models fetch`` wrote into a folder, or ``None``.

    Raises:
        ValueError: a manifest that is not one attnkit wrote: too large, not JSON (or
            nested too deep to read), or whose ``files`` are not plain file names in the
            folder, each with an integer ``size``, a hex ``sha256`` and an optional
            integer ``mtime_ns``; the message names the field.
    """
    path = folder / MANIFEST
    if not path.is_file():
        return None
    again = "; fetch the model again"
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_MANIFEST_BYTES + 1)
        if len(data) > _MAX_MANIFEST_BYTES:
            raise ValueError(f"{path} is corrupt: larger than {_MAX_MANIFEST_BYTES} bytes{again}")
        manifest = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is corrupt ({err}){again}") from None
    except RecursionError:
        raise ValueError(f"{path} is corrupt: nested too deep to read{again}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{path} is corrupt: it has no 'files' object{again}")
    if not isinstance(manifest.get("family", ""), str):
        raise ValueError(f"{path} is corrupt: 'family' must be a string{again}")
    for name, info in manifest["files"].items():
        where = f"{path} is corrupt: files[{name[:80]!r}]"
        if not _MANIFEST_FILE_NAME.fullmatch(name):
            raise ValueError(f"{where} is not the name of a file in the folder{again}")
        if not isinstance(info, dict):
            raise ValueError(f"{where} must be an object with size and sha256{again}")
        for key, valid in (("size", _is_count), ("sha256", _is_sha256), ("mtime_ns", _is_count)):
            if (key in info or key != "mtime_ns") and not valid(info.get(key)):
                raise ValueError(f"{where}.{key} is missing or not valid: {str(info.get(key))[:80]!r}{again}")
    return manifest


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def verify_manifest(folder: Path, manifest: dict[str, Any], name: str) -> None:
    """Check the files a manifest lists against their recorded size and SHA-256.

    Hashing half a gigabyte at every load would cost seconds, so a file is re-hashed only
    when its modification time differs from the one recorded at fetch time; a changed
    size fails at once.

    Raises:
        ValueError: a file that is missing, of another size, or whose hash differs.
    """
    for file_name, info in manifest["files"].items():
        path = folder / file_name
        hint = f"; fetch it again with {fetch_hint(name)}" if name in MODELS else ""
        if not path.is_file():
            raise ValueError(f"{path} is missing{hint}")
        stat = path.stat()
        if stat.st_size != info["size"]:
            raise ValueError(f"{path} is truncated or changed: {stat.st_size} bytes, expected {info['size']}{hint}")
        if stat.st_mtime_ns != info.get("mtime_ns") and sha256_file(path) != info["sha256"]:
            raise ValueError(f"{path} is corrupt: its SHA-256 differs from the one recorded at fetch time{hint}")
