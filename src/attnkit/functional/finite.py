"""Refusing numbers that are not finite before they reach a file, a picture, a response or
a sampled token: one check, whose message names what holds them and where the first is."""

from __future__ import annotations

import torch
from torch import Tensor


def check_finite(values: Tensor, what: str) -> None:
    """Refuse a tensor with a NaN or an infinity.

    The common case (every value finite) costs one ``aminmax`` pass, which propagates NaN
    and infinities without allocating a mask.

    Args:
        values: any floating tensor (others are always finite).
        what: what the values are, for the message (``"the attention weights of layer 3"``).

    Raises:
        ValueError: naming ``what``, how many values are not finite, and the index of the
            first.
    """
    if not values.is_floating_point() or values.numel() == 0:
        return
    low, high = torch.aminmax(values.detach())
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return
    bad = ~torch.isfinite(values.detach())
    first = [int(i) for i in bad.nonzero()[0]]
    raise ValueError(
        f"{what} has {int(bad.sum())} of {values.numel()} values that are NaN or infinite (the first at index {first})"
    )
