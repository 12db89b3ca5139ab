"""Attention kernels by name, for modules that select one by option.

Every kernel takes ``(q, k, v, *, causal=..., **options)`` with q ``[b, h, s_q, d]`` and
k/v ``[b, h_kv, s_k, d|d_v]`` and returns ``[b, h, s_q, d_v]``, so a module can dispatch with
one line: ``get_kernel(name)(q, k, v, causal=causal, **options)``.

========  ================================================  ==============================
name      function                                          options
========  ================================================  ==============================
dense     :func:`attnkit.functional.attention`              mask, bias, scale, dropout_p
tiled     :func:`attnkit.functional.tiled_attention`        mask, bias, scale, block_size
local     :func:`attnkit.functional.local_attention`        window (required), scale
sparse    :func:`attnkit.functional.sparse_attention`       pattern (required), permute, block_size
linear    :func:`attnkit.functional.linear_attention`       feature_map, projection, chunk_size
========  ================================================  ==============================

``ring`` (:func:`attnkit.distributed.ring_attention`: mask, scale, layout, group,
block_size) runs one sequence across the ranks of a torchrun job; ``import
attnkit.distributed`` registers it (:func:`register_kernel`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from attnkit.functional.attention import attention
from attnkit.functional.linear import linear_attention
from attnkit.functional.local import local_attention
from attnkit.functional.sparse import sparse_attention
from attnkit.functional.tiled import tiled_attention

KERNELS: dict[str, Callable[..., Tensor]] = {
    "dense": attention,
    "tiled": tiled_attention,
    "local": local_attention,
    "sparse": sparse_attention,
    "linear": linear_attention,
}


def register_kernel(name: str, kernel: Callable[..., Tensor]) -> None:
    """Make ``kernel`` available as ``name`` to :func:`get_kernel` (and so to
    ``MultiHeadAttention(kernel=name)``). Layers above this one add their kernels this way
    when imported, e.g. ``import attnkit.distributed`` adds ``"ring"``.

    Raises:
        ValueError: ``name`` is already taken by another kernel.
    """
    if KERNELS.get(name, kernel) is not kernel:
        raise ValueError(f"attention kernel {name!r} is already registered as {KERNELS[name]!r}")
    KERNELS[name] = kernel


def get_kernel(name: str) -> Callable[..., Tensor]:
    """The kernel called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        return KERNELS[name]
    except (KeyError, TypeError):
        hint = " (import attnkit.distributed to add it)" if name == "ring" else ""
        raise ValueError(f"unknown attention kernel {name!r}{hint}; expected one of {sorted(KERNELS)}") from None
