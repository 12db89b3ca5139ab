"""Finding, checking and reading checkpoint folders (Hugging Face layout: ``config.json``
plus safetensors). Nothing is unpickled: only safetensors weights are read.

A safetensors file is an 8-byte little-endian header length, a JSON header that gives each
tensor's dtype, shape and byte range, and the data. The header is checked against the
file's size before any tensor is read, so a truncated or corrupt file is a clear
``ValueError`` rather than a crash deep inside a reader.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from attnkit.models.registry import MANIFEST, MODELS, fetch_hint, home

# Bytes per element of the safetensors dtypes that torch can hold.
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}
# A header above this is not a header: real ones are a few hundred kilobytes at most.
_MAX_HEADER = 100 * 2**20
_CHUNK = 2**20


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
            raise ModelNotFound(
                f"model {key!r} is not fetched yet (looked in {folder}); run {fetch_hint(key)} first"
            )
        return key, folder
    path = Path(key).expanduser()
    if path.is_dir():
        return path.resolve().name, path
    if path.exists():
        raise ValueError(f"{path} is a file; give the folder that holds config.json and the safetensors weights")
    raise ModelNotFound(
        f"no model named {key!r} and no folder at that path; known models: {', '.join(MODELS)} "
        f"(get one with {fetch_hint('NAME')})"
    )


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder.

    Raises:
        ValueError: no ``config.json``, or one that is not a JSON object.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a model folder: it has no config.json")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


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
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
            raise ValueError(f"{index} is not a valid safetensors index: {err!r}") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ValueError(f"{index} names shards that are missing: {missing}")
        return [folder / s for s in shards]
    pickled = sorted(p.name for p in folder.glob("*.bin"))
    extra = f" (found {pickled}: pickled weights are never loaded; convert them to safetensors)" if pickled else ""
    raise ValueError(f"{folder} has no model.safetensors{extra}")


def check_safetensors(path: Path) -> dict[str, dict[str, Any]]:
    """Check that a safetensors file is whole, before reading any tensor.

    Args:
        path: the file.

    Returns:
        Its header: tensor name → ``{"dtype", "shape", "data_offsets"}``.

    Raises:
        ValueError: a header that does not parse or describes tensors that do not fit the
            file (truncated, padded, overlapping, wrong byte counts, unknown dtypes).
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{path} is not a safetensors file: it is only {size} bytes")
        header_len = int.from_bytes(prefix, "little")
        if header_len > min(size - 8, _MAX_HEADER):
            raise ValueError(
                f"{path} is truncated or not a safetensors file: its header claims {header_len} bytes "
                f"but the file has {size}"
            )
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path} is corrupt: its header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is corrupt: its header is not a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    data_size = size - 8 - header_len
    spans = []
    for name, info in tensors.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            numel = math.prod(shape)
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{path} is corrupt: bad header entry for {name!r}: {info!r}") from None
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}, which attnkit cannot load")
        if not 0 <= begin <= end or end - begin != numel * _DTYPE_BYTES[dtype]:
            raise ValueError(
                f"{path} is corrupt: tensor {name!r} ({dtype} {shape}) has byte range [{begin}, {end})"
            )
        spans.append((begin, end, name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if begin != covered:
            raise ValueError(f"{path} is corrupt: tensor {name!r} starts at byte {begin}, expected {covered}")
        covered = end
    if covered != data_size:
        state = "truncated" if covered > data_size else "corrupt (trailing bytes)"
        raise ValueError(
            f"{path} is {state}: its tensors need {covered + 8 + header_len} bytes, the file has {size}"
        )
    return tensors


def load_tensors(files: list[Path], *, dtype: torch.dtype) -> dict[str, Tensor]:
    """Every tensor of the checked safetensors ``files``, floating ones cast to ``dtype``.

    The files are memory-mapped: a float32 checkpoint loaded as float32 is not copied.

    Raises:
        ValueError: a file that fails :func:`check_safetensors`, a tensor in two files.
    """
    safe_open = require("safetensors").safe_open
    tensors: dict[str, Tensor] = {}
    for path in files:
        check_safetensors(path)
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if key in tensors:
                    raise ValueError(f"tensor {key!r} appears in two weight files (second: {path})")
                t = f.get_tensor(key)
                tensors[key] = t.to(dtype) if t.is_floating_point() else t
    return tensors


class without_init(TorchFunctionMode):  # noqa: N801 - used as a context manager, like torch.no_grad
    """Build modules without random initialisation, for weights that a checkpoint replaces
    right away.

    Every ``torch.nn.init`` function becomes a no-op inside the block (parameters keep the
    uninitialised memory ``torch.empty`` gave them), which saves drawing 135M random numbers
    to throw away: about a second on two cores. Computed buffers (rotary frequencies) are
    built as usual. Torch-function modes are per thread, so other threads are unaffected.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def sha256_file(path: Path, *, progress: bool = False, label: str | None = None) -> str:
    """The SHA-256 of a file, hex, read in 1 MiB chunks (with a progress bar if asked)."""
    tqdm = require("tqdm.auto").tqdm
    digest = hashlib.sha256()
    with path.open("rb") as f, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, desc=label or f"sha256 {path.name}",
        disable=not progress, leave=False,
    ) as bar:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest ``attnkit models fetch`` wrote into a folder, or ``None``."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is corrupt ({err}); fetch the model again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{path} is corrupt; fetch the model again")
    return manifest


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
            raise ValueError(
                f"{path} is truncated or changed: {stat.st_size} bytes, expected {info['size']}{hint}"
            )
        if stat.st_mtime_ns != info.get("mtime_ns") and sha256_file(path) != info["sha256"]:
            raise ValueError(f"{path} is corrupt: its SHA-256 differs from the one recorded at fetch time{hint}")


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
