"""Finding, checking and reading checkpoint folders (Hugging Face layout: ``config.json``
plus safetensors). Nothing is unpickled: only safetensors weights are read.

A safetensors file is an 8-byte little-endian header length, a JSON header that gives each
tensor's dtype, shape and byte range, and the data. The header is checked against the
file's size before any tensor is read, so a truncated or corrupt file is a clear
``ValueError`` rather than a crash deep inside a reader.

Everything a checkpoint folder says is untrusted: a size in ``config.json`` is read with
:func:`config_int` (an integer within sane limits, or a :class:`CheckpointError` naming the
file and the field), and the configuration is compared with the safetensors headers
before any module is built, so a crafted config cannot make loading allocate gigabytes.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from attnkit.models.registry import MANIFEST, MODELS, fetch_hint, home

# Bytes per element of the safetensors dtypes that torch can hold.
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
# A header above this is not a header: real ones are a few hundred kilobytes at most.
_MAX_HEADER = 100 * 2**20
# The most bytes each file read at load may have: far above real ones (a configuration is a
# few kilobytes, a large model's index a few hundred, Gemma 3's tokenizer.json 33 MB), far
# below what would exhaust memory while parsing.
FILE_LIMITS: dict[str, int] = {"tokenizer.json": 100 * 2**20, "model.safetensors.index.json": 64 * 2**20}
_SMALL_FILE_LIMIT = 16 * 2**20
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


# Limits on the sizes a config.json may give, far above any checkpoint attnkit runs on two
# cores but far below what would exhaust memory before the weights are compared.
CONFIG_LIMITS: dict[str, int] = {
    "vocab_size": 2**21,
    "hidden_size": 2**16,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "intermediate_size": 2**18,
    "max_position_embeddings": 2**17,
    "type_vocab_size": 1024,
    "head_dim": 2**12,
}
REQUIRED = object()
# The smallest normal float32: a config value below it computes as 0 (or its inverse as inf).
_FLOAT32_TINY = torch.finfo(torch.float32).tiny


def config_int(
    config: dict[str, Any],
    key: str,
    *,
    path: Path,
    default: Any = REQUIRED,
    minimum: int = 1,
    maximum: int | None = None,
) -> int:
    """An integer field of a ``config.json``, checked.

    Args:
        config: the parsed file.
        key: the field.
        path: the file, for messages.
        default: the value when the field is absent (or ``null``); required without one.
        minimum: the smallest value accepted.
        maximum: the largest (default :data:`CONFIG_LIMITS` of ``key``).

    Raises:
        CheckpointError: a missing field, or one that is not an integer in range.
    """
    value = config.get(key)
    if value is None:
        if default is REQUIRED:
            raise CheckpointError(path, f"{key} is missing, and the model needs it", field=key)
        return default
    maximum = CONFIG_LIMITS.get(key, 2**31 - 1) if maximum is None else maximum
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise CheckpointError(
            path, f"{key} must be an integer from {minimum} to {maximum}, got {short_repr(value)}", field=key
        )
    return value


def config_float(config: dict[str, Any], key: str, *, path: Path, default: float, low: float, high: float) -> float:
    """A number field of a ``config.json``, finite and ``low < value <= high``, and either
    0 or of a size that float32 holds (at least ``1.2e-38``: a smaller one would compute
    as 0, and its inverse as infinity).

    Raises:
        CheckpointError: a field that is not a number in range.
    """
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise CheckpointError(
            path, f"{key} must be a number above {low} and at most {high}, got {short_repr(value)}", field=key
        )
    if value != 0 and abs(value) < _FLOAT32_TINY:
        raise CheckpointError(
            path, f"{key} must be 0 or at least {_FLOAT32_TINY:.3g} in size (float32), got {value!r}", field=key
        )
    return float(value)


def config_bool(config: dict[str, Any], key: str, *, path: Path, default: bool) -> bool:
    """A boolean field of a ``config.json``: JSON ``true`` or ``false`` (``null`` or absent
    is ``default``). A string such as ``"false"`` is refused rather than read as true.

    Raises:
        CheckpointError: a field that is not a boolean.
    """
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(path, f"{key} must be true or false, got {short_repr(value)}", field=key)
    return value


def short_repr(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters (a crafted file may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _strict_json(text: str | bytes) -> Any:
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
        value = _strict_json(read_file(path, limit))
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


def check_weight_map(folder: Path, headers: dict[str, tuple[Path, str, list[int]]]) -> None:
    """Check that a sharded checkpoint's index says where each tensor is: every tensor of
    the shards is in ``weight_map``, under the shard that holds it, and the map names no
    other tensor. A single ``model.safetensors`` has no index to check.

    Args:
        folder: the checkpoint folder.
        headers: what the shards hold (:func:`read_headers`).

    Raises:
        CheckpointError: naming the index and the first tensor where the two disagree.
    """
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file() or not index.is_file():
        return
    weight_map = read_json_object(index)["weight_map"]
    for name, shard in sorted(weight_map.items()):
        if name not in headers:
            raise CheckpointError(index, f"weight_map names {name!r} in {shard}, which no shard holds", field=name)
        if headers[name][0].name != shard:
            raise CheckpointError(
                index, f"weight_map puts {name!r} in {shard}, but {headers[name][0].name} holds it", field=name
            )
    unlisted = sorted(set(headers) - set(weight_map))
    if unlisted:
        raise CheckpointError(
            index,
            f"weight_map does not list {unlisted[0]!r} ({headers[unlisted[0]][0].name} holds it)",
            field=unlisted[0],
        )


def check_safetensors(path: Path) -> dict[str, dict[str, Any]]:
    """Check that a safetensors file is whole, before reading any tensor.

    Args:
        path: the file.

    Returns:
        Its header: tensor name → ``{"dtype", "shape", "data_offsets"}``.

    Raises:
        CheckpointError: a header that does not parse or describes tensors that do not fit
            the file (truncated, padded, overlapping, wrong byte counts, unknown dtypes).
    """
    size = path.stat().st_size
    # Checked before reading: a link to a device or to /proc/self/mem has size 0.
    if size < 8:
        raise CheckpointError(path, f"is not a safetensors file: it is only {size} bytes")
    try:
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if header_len > min(size - 8, _MAX_HEADER):
                raise CheckpointError(
                    path,
                    f"is truncated or not a safetensors file: its header claims {header_len} bytes "
                    f"but the file has {size}",
                )
            header = _strict_json(f.read(header_len))
    except OSError as err:
        raise CheckpointError(path, f"cannot be read: {err.strerror or err}") from None
    except (ValueError, UnicodeDecodeError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(path, f"is corrupt: its header is not valid JSON ({err})") from None
    except RecursionError:
        raise CheckpointError(path, "is corrupt: its header is nested too deeply") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "is corrupt: its header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(path, "is corrupt: __metadata__ must map names to strings", field="__metadata__")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    data_size = size - 8 - header_len
    spans = []
    for name, info in tensors.items():
        if not _valid_entry(info):
            raise CheckpointError(path, f"is corrupt: bad header entry for {name!r}: {short_repr(info)}", field=name)
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPE_BYTES:
            raise CheckpointError(
                path, f"tensor {name!r} has dtype {short_repr(dtype)}, which attnkit cannot load", field=name
            )
        if not 0 <= begin <= end or end - begin != math.prod(shape) * _DTYPE_BYTES[dtype]:
            raise CheckpointError(
                path, f"is corrupt: tensor {name!r} ({dtype} {shape}) has byte range [{begin}, {end})", field=name
            )
        spans.append((begin, end, name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if begin != covered:
            raise CheckpointError(
                path, f"is corrupt: tensor {name!r} starts at byte {begin}, expected {covered}", field=name
            )
        covered = end
    if covered != data_size:
        state = "truncated" if covered > data_size else "corrupt (trailing bytes)"
        raise CheckpointError(
            path, f"is {state}: its tensors need {covered + 8 + header_len} bytes, the file has {size}"
        )
    return tensors


def _valid_entry(info: Any) -> bool:
    """Whether a header entry is ``{"dtype": str, "shape": [int >= 0, ...], "data_offsets":
    [int, int]}`` (booleans are not integers here)."""

    def whole(v: Any) -> bool:
        # Below 2^48: a size beside a zero (an empty tensor needs no bytes) is not bounded
        # by the file, and past 2^63 it would not even fit PyTorch's sizes.
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**48

    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        return False
    shape, offsets = info["shape"], info["data_offsets"]
    return (
        isinstance(info["dtype"], str)
        and isinstance(shape, list)
        and all(whole(n) for n in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(whole(n) for n in offsets)
    )


def read_headers(files: list[Path]) -> dict[str, tuple[Path, str, list[int]]]:
    """The tensors that checked safetensors ``files`` hold, without reading any of them.

    Returns:
        tensor name → ``(file, safetensors dtype, shape)``.

    Raises:
        CheckpointError: a file that fails :func:`check_safetensors`, a tensor in two files.
    """
    out: dict[str, tuple[Path, str, list[int]]] = {}
    for path in files:
        for name, info in check_safetensors(path).items():
            if name in out:
                raise CheckpointError(
                    path, f"tensor {name!r} appears in two weight files (first: {out[name][0]})", field=name
                )
            out[name] = (path, info["dtype"], info["shape"])
    return out


def load_tensors(files: list[Path], *, dtype: torch.dtype) -> dict[str, Tensor]:
    """Every tensor of the checked safetensors ``files``, floating ones cast to ``dtype``.

    The files are memory-mapped: a float32 checkpoint loaded as float32 is not copied.

    Raises:
        CheckpointError: a file that fails :func:`check_safetensors` or that the safetensors
            reader refuses, a tensor in two files.
    """
    safetensors = require("safetensors")
    read_headers(files)
    tensors: dict[str, Tensor] = {}
    for path in files:
        try:
            with safetensors.safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    t = f.get_tensor(key)
                    tensors[key] = _finite(t.to(dtype), path, key) if t.is_floating_point() else t
        except safetensors.SafetensorError as err:
            raise CheckpointError(path, f"is corrupt: the safetensors reader refused it ({err})") from None
    return tensors


def _finite(tensor: Tensor, path: Path, name: str) -> Tensor:
    """``tensor``, checked to hold only finite values in its dtype (after the cast: a float32
    weight of 1e5 is infinite in float16).

    Raises:
        CheckpointError: naming the tensor and how many values are NaN or infinite.
    """
    # aminmax propagates NaN and infinities in one pass with no copy (isfinite is ~15x slower).
    if tensor.numel() and not all(torch.isfinite(end) for end in torch.aminmax(tensor)):
        bad = tensor.numel() - int(torch.isfinite(tensor).sum())
        raise CheckpointError(
            path,
            f"tensor {name!r} has {bad} values that are NaN or infinite in {str(tensor.dtype).removeprefix('torch.')}",
            field=name,
        )
    return tensor


# The in-place initialisers of ``torch.nn.init`` and the tensor fills they end in: on a
# ``meta`` tensor they change no value, since there is none.
_INITIALISERS = frozenset(
    {
        *(name for name in dir(nn.init) if name.endswith("_") and not name.startswith("_")),
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
    }
)


class _SkipInitialisationOnMeta(TorchFunctionMode):
    """Initialising a ``meta`` tensor computes nothing, yet is not free: torch's meta kernels
    for the random fills are Python references whose first call imports the compiler
    (``torch._dynamo``, about 2 s on two cores). This mode returns the tensor untouched."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _INITIALISERS:
            # torch.nn.init passes the tensor by keyword, tensor methods as ``self``
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def build_without_weights(factory: Callable[[], nn.Module]) -> nn.Module:
    """Build a module on the ``meta`` device: parameters with shapes and no storage, for
    weights that a checkpoint replaces right away (``load_state_dict(..., assign=True)``,
    then :func:`materialize_buffers`). Nothing is allocated or initialised: drawing 135M
    random numbers to throw away would cost about a second on two cores, and even the
    initialisers' meta kernels would import the compiler.

    Args:
        factory: builds the module.

    Returns:
        The module, on ``meta``.
    """
    with torch.device("meta"), _SkipInitialisationOnMeta():
        return factory()


def materialize_buffers(module: nn.Module, device: torch.device | str = "cpu") -> None:
    """Compute again, on ``device``, the buffers that a module built by
    :func:`build_without_weights` still has on ``meta`` (rotary frequencies and tables,
    ALiBi slopes): every submodule holding one implements ``reset_buffers(device)``.

    Raises:
        TypeError: a submodule with a ``meta`` buffer and no ``reset_buffers``.
    """
    for sub in module.modules():
        if any(b is not None and b.is_meta for b in sub.buffers(recurse=False)):
            reset = getattr(sub, "reset_buffers", None)
            if not callable(reset):
                raise TypeError(f"{type(sub).__name__} has buffers on the meta device and no reset_buffers()")
            reset(device)


def buffer_bytes(module: nn.Module) -> int:
    """The bytes :func:`materialize_buffers` will allocate for ``module``: each submodule's
    ``buffer_bytes()`` where it says (rotary tables are ``None`` on ``meta`` until then),
    otherwise its ``meta`` buffers' own size in float32."""
    total = 0
    for sub in module.modules():
        if any(b is not None and b.is_meta for b in sub.buffers(recurse=False)):
            planned = getattr(sub, "buffer_bytes", None)
            if callable(planned):
                total += int(planned())
            else:
                total += sum(4 * b.numel() for b in sub.buffers(recurse=False) if b is not None)
    return total


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
