"""Ranks agreeing on the arguments of a collective call before any data moves.

A collective whose ranks disagree on an option computes a wrong result on every rank, and
one whose ranks disagree on a shape or dtype aborts in the transport (gloo: "Received data
size doesn't match expected size") or waits for ever. :func:`agree` compares, in one small
all-gather, the settings every rank passes, and raises the same ``ValueError`` on every
rank, naming the field and the ranks that differ. A rank whose own arguments were refused
takes part all the same, so that the others raise instead of waiting for it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Setting:
    """One field that every rank must pass alike.

    Attributes:
        field: its name in messages (``"head dim"``).
        value: the value as an integer (see :func:`text_code`, :func:`float_code`).
        show: how any rank's value reads in a message; ``None`` for a code that cannot be
            read back (the message then only says that the ranks differ).
        same: whether the ranks must agree on it (``False``: only gathered, as a shard
            length that differs by design and that the caller checks itself).
    """

    field: str
    value: int
    show: Callable[[int], str] | None = str
    same: bool = True


def text_code(text: str) -> int:
    """An integer that stands for ``text`` on every rank (CRC-32: equal texts give equal
    codes in every process, unlike ``hash``)."""
    return zlib.crc32(text.encode("utf-8"))


def float_code(value: float) -> int:
    """The bits of a float64 as an integer, so that floats compare exactly."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


def code_float(code: int) -> float:
    """The float64 whose bits :func:`float_code` gave."""
    return struct.unpack("<d", struct.pack("<q", code))[0]


def agree(
    what: str, settings: list[Setting] | None, group: dist.ProcessGroup | None, field_count: int
) -> list[list[int]]:
    """Check, in one small all-gather, that every rank passed the same settings.

    Args:
        what: the call, for messages (``"ring attention"``).
        settings: this rank's settings, the same fields in the same order on every rank;
            ``None`` when this rank refused its own arguments (it raises its own error after
            this call, the others raise here).
        group: the process group.
        field_count: how many settings every rank passes (a refusing rank has none to count).

    Returns:
        Every rank's values, in the order of ``settings`` (empty on a refusing rank).

    Raises:
        ValueError: the same on every rank: a rank refused its arguments, or the first field
            in which a rank differs from rank 0, with both values where they can be read.
    """
    world = dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else None
    row = [1] + [0] * field_count if settings is None else [0] + [s.value for s in settings]
    mine = torch.tensor(row, dtype=torch.int64, device=device)  # [1 + field_count]: refused, values
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    rows = [[int(x) for x in t.tolist()] for t in every]
    refused = [str(r) for r, values in enumerate(rows) if values[0]]
    if refused:
        if settings is None:
            return []
        raise ValueError(
            f"{what}: rank {', '.join(refused)} refused its arguments (its own error says why); every rank stops"
        )
    assert settings is not None and len(settings) == field_count
    for i, setting in enumerate(settings, start=1):
        for r, values in enumerate(rows if setting.same else []):
            if values[i] != rows[0][i]:
                if setting.show is None:
                    raise ValueError(f"{what} needs the same {setting.field} on every rank; ranks 0 and {r} differ")
                raise ValueError(
                    f"{what} needs the same {setting.field} on every rank, got {setting.show(rows[0][i])} "
                    f"on rank 0 and {setting.show(values[i])} on rank {r}"
                )
    return [values[1:] for values in rows]
