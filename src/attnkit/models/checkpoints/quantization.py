"""Block-quantized fp8 checkpoints (DeepSeek-V3 and others): read, and dequantized at load.

Such a checkpoint stores a matrix ``W [rows, cols]`` as fp8 (``F8_E4M3``) values ``Q`` and,
beside it, ``<name>_scale_inv`` ``[⌈rows/br⌉, ⌈cols/bc⌉]`` float32: one scale per block of
``br × bc`` values, ``W = Q · scale`` block by block. Its ``config.json`` says so:
``"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [br, bc], ...}``. attnkit multiplies the blocks out in float32 and
casts the result to the dtype asked for, as transformers' fine-grained fp8 dequantization
does; every other kind of quantization is refused in one line before any weight is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.models.checkpoints.errors import CheckpointError, short_repr

SCALE_SUFFIX = "_scale_inv"
FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2"})
_SUPPORTED = "attnkit reads fp8 block-quantized weights (quant_method 'fp8' with weight_block_size)"


@dataclass(frozen=True)
class BlockQuantization:
    """The fp8 block quantization a ``config.json`` declares.

    Attributes:
        block: ``(br, bc)``, the rows and columns each scale covers.
    """

    block: tuple[int, int]


def read_quantization(config: dict[str, Any], path: Path) -> BlockQuantization | None:
    """The checkpoint's ``quantization_config``, or ``None`` without one.

    Raises:
        CheckpointError: a quantization other than fp8 with a block size, in one line.
    """
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise CheckpointError(path, f"must be an object, got {short_repr(quant)}", field="quantization_config")
    method = quant.get("quant_method")
    block = quant.get("weight_block_size")
    if method != "fp8" or quant.get("fmt", "e4m3") != "e4m3":
        raise CheckpointError(
            path, f"quant_method {short_repr(method)} is not supported; {_SUPPORTED}", field="quantization_config"
        )
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 2**16 for n in block)
    ):
        raise CheckpointError(
            path,
            f"weight_block_size must be two block sizes [rows, cols], got {short_repr(block)}; {_SUPPORTED}",
            field="quantization_config",
        )
    return BlockQuantization((block[0], block[1]))


def dequantized_headers(
    headers: dict[str, tuple[Path, str, list[int]]], quantization: BlockQuantization | None
) -> dict[str, tuple[Path, str, list[int]]]:
    """The tensors the checkpoint holds once dequantized: each fp8 weight as a floating
    tensor of its shape, its scales gone. Checks each fp8 weight against its scales.

    Raises:
        CheckpointError: fp8 tensors without a ``quantization_config``, an fp8 weight
            without its scales or scales without their weight, scales of the wrong shape.
    """
    quantized = {key: entry for key, entry in headers.items() if entry[1] in FP8_DTYPES}
    scales = {key.removesuffix(SCALE_SUFFIX): entry for key, entry in headers.items() if key.endswith(SCALE_SUFFIX)}
    if quantization is None:
        if quantized:
            key, (path, _, _) = next(iter(quantized.items()))
            raise CheckpointError(path, f"tensor {key!r} is fp8, but config.json has no quantization_config", field=key)
        return headers
    out = {key: entry for key, entry in headers.items() if key not in quantized and not key.endswith(SCALE_SUFFIX)}
    for key, (path, _, shape) in quantized.items():
        scale = scales.get(key)
        if scale is None or len(shape) != 2:
            raise CheckpointError(
                path, f"fp8 tensor {key!r} {shape} needs a 2-D weight and its {key + SCALE_SUFFIX}", field=key
            )
        want = [math.ceil(n / b) for n, b in zip(shape, quantization.block)]
        if scale[2] != want:
            raise CheckpointError(
                scale[0],
                f"{key + SCALE_SUFFIX} is {scale[2]}, expected {want} for {shape} in blocks of "
                f"{list(quantization.block)}",
                field=key + SCALE_SUFFIX,
            )
        out[key] = (path, "BF16", shape)
    orphans = sorted(set(scales) - set(quantized))
    if orphans:
        raise CheckpointError(
            scales[orphans[0]][0], f"{orphans[0] + SCALE_SUFFIX} scales no fp8 weight", field=orphans[0] + SCALE_SUFFIX
        )
    return out


def dequantize(tensors: dict[str, Tensor], quantization: BlockQuantization, dtype: torch.dtype) -> dict[str, Tensor]:
    """``tensors`` with each fp8 weight multiplied out by its block scales (in float32) and
    cast to ``dtype``, the scales removed. The headers were checked
    (:func:`dequantized_headers`)."""
    br, bc = quantization.block
    out = {key: t for key, t in tensors.items() if not key.endswith(SCALE_SUFFIX)}
    for key, weight in tensors.items():
        scale = tensors.get(key + SCALE_SUFFIX)
        if scale is None:
            continue
        rows, cols = weight.shape
        blocks = scale.float().repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]  # [rows, cols]
        out[key] = (weight.float() * blocks).to(dtype)
    return out
