"""Reading a checkpoint's weights: each safetensors file checked whole before any tensor is
read, and its floating tensors checked finite.

A safetensors file is an 8-byte little-endian header length, a JSON header that gives each
tensor's dtype, shape and byte range, and the data. The header is checked against the
file's size before any tensor is read, so a truncated or corrupt file is a clear
:class:`~attnkit.models.checkpoints.errors.CheckpointError` rather than a crash deep inside
a reader; the configuration is compared with the headers (:func:`read_headers`) before any
module is built, so a crafted config cannot make loading allocate gigabytes.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.models.checkpoints.errors import CheckpointError, require, short_repr
from attnkit.models.checkpoints.files import read_json_object, strict_json

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
    # fp8 weights of block-quantized checkpoints (attnkit.models.checkpoints.quantization)
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
# A header above this is not a header: real ones are a few hundred kilobytes at most.
_MAX_HEADER = 100 * 2**20


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
            header = strict_json(f.read(header_len))
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


def load_tensors(files: list[Path], *, dtype: torch.dtype, exact: Collection[str] = ()) -> dict[str, Tensor]:
    """Every tensor of the checked safetensors ``files``, floating ones cast to ``dtype``
    but those named in ``exact`` (fp8 weights and their scales, dequantized later in
    float32), which are read as float32.

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
                    wanted = torch.float32 if key in exact else dtype
                    tensors[key] = _finite(t.to(wanted), path, key) if t.is_floating_point() else t
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
