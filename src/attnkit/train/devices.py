"""The device a training run computes on."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """The torch device called ``name``, checked to be usable.

    Raises:
        ValueError: an unknown device, or CUDA asked for where there is none.
    """
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this torch build sees no CUDA GPU")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        raise ValueError(f"device {name!r} is not usable: {err}") from None
    return device
