"""Packed projections: several ``nn.Linear`` that read the same input, their weights stored
as row blocks of one matrix, so that inference runs one matrix product instead of several.

Shape letters: ``e`` input dim, ``n_i`` output dim of the ``i``-th linear, ``n = Σ n_i``.

Why: when decoding one token at a time, each projection is a small matrix-vector product
whose cost is mostly the call itself and, on a multi-threaded CPU, the synchronisation of
its parallel region. Attention's query/key/value projections become one product, and so do
SwiGLU's gate and up projections. The result is bit-identical: each output row of a
matrix product depends only on its own weight row.

Only for a few rows: the outputs of one product are strided views of its result, and the
element-wise operations that follow (the gate's activation and product, the rotation) run
slower on strided views. Measured on a CPU with one and two threads, from 4 rows on the
separate products are faster (by 5–20%); over a prompt of 512 tokens the packed path cost
about 3% of a LLaMA-style prefill.

The linears keep their parameters (same names, same ``state_dict``), which become views of
the packed matrix: in-place updates (``load_state_dict``, optimisers) reach both. The
packed product stands in for the linears only on a few rows, while no gradient is recorded
and while the parameters are still those views; replacing a parameter, or converting the
module with ``.to(dtype)``, silently returns to the separate products.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACKED_ROWS = 2
"""The most input rows (tokens times batch) for which the packed product stands in: a
decoding step of one or two sequences."""


class PackedLinears:
    """The packed weights of several linears with the same input dim.

    Args:
        linears: the ``nn.Linear`` modules, in the order their outputs are concatenated;
            all with a bias or all without.

    Raises:
        ValueError: no linears, different input dims, devices or dtypes, or a mix of
            linears with and without a bias.

    Attributes:
        weight: ``[n, e]``.
        bias: ``[n]`` or ``None``.
        sizes: ``(n_1, n_2, ...)``.
    """

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        if not linears:
            raise ValueError("nothing to pack")
        first = linears[0].weight
        if any(
            lin.in_features != linears[0].in_features
            or lin.weight.dtype != first.dtype
            or lin.weight.device != first.device
            for lin in linears
        ):
            raise ValueError("packed linears must share input dim, dtype and device")
        if len({lin.bias is None for lin in linears}) > 1:
            raise ValueError("packed linears must all have a bias or all have none")
        with torch.no_grad():
            self.weight = torch.cat([lin.weight for lin in linears])  # [n, e]
            self.bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])  # [n]
        self.sizes = tuple(lin.out_features for lin in linears)
        start = 0
        for lin, size in zip(linears, self.sizes):
            lin.weight = nn.Parameter(self.weight[start : start + size], requires_grad=lin.weight.requires_grad)
            if self.bias is not None:
                lin.bias = nn.Parameter(self.bias[start : start + size], requires_grad=lin.bias.requires_grad)
            start += size
        # Each parameter as made here, with the address of its data: a parameter replaced,
        # or its data swapped (``.to(dtype)`` does that), no longer reads the packed matrix.
        names = ("weight",) if self.bias is None else ("weight", "bias")
        self._views: list[tuple[nn.Linear, str, Tensor, int]] = []
        for lin in linears:
            for name in names:
                view = getattr(lin, name)
                self._views.append((lin, name, view, view.data_ptr()))

    def usable(self, x: Tensor) -> bool:
        """Whether the packed product stands in for the linears on ``x [..., e]`` now: ``x``
        has at most :data:`PACKED_ROWS` rows, no gradient is being recorded and every
        parameter is still the view made at packing time."""
        if torch.is_grad_enabled() or x.numel() > PACKED_ROWS * x.shape[-1]:
            return False
        # Checked once per layer and decoding step: one lookup and one address per parameter.
        for linear, name, view, pointer in self._views:
            if getattr(linear, name, None) is not view or view.data_ptr() != pointer:
                return False
        return True

    def __call__(self, x: Tensor) -> Tensor:
        """All the linears' outputs side by side: ``[..., e]`` → ``[..., n]``."""
        return F.linear(x, self.weight, self.bias)


@runtime_checkable
class Packable(Protocol):
    """A module that can pack its own projections."""

    @property
    def packable(self) -> bool: ...

    def pack_projections(self) -> None: ...


def pack_projections(module: nn.Module) -> int:
    """Pack the projections of every submodule of ``module`` that can pack its own (a
    :class:`attnkit.nn.MultiHeadAttention` that projects self-attention, a gated
    :class:`attnkit.nn.FeedForward`), for faster inference: each says so with its
    ``packable`` property and packs with its ``pack_projections()``.

    Args:
        module: any module, e.g. a :class:`attnkit.nn.DecoderLM`.

    Returns:
        How many submodules were packed.
    """
    packed = 0
    for sub in module.modules():
        if isinstance(sub, Packable) and sub.packable:
            sub.pack_projections()
            packed += 1
    return packed
