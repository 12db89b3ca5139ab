"""How a sequence is cut into one shard per rank, and the collectives that cut and rejoin it.

Two layouts, both for any sequence length ``s`` and world size ``n`` (``s`` need not be a
multiple of ``n``):

- ``"contiguous"``: rank ``r`` holds one run of consecutive positions. The sequence is cut
  into ``n`` pieces as :func:`torch.tensor_split` cuts it: the first ``s % n`` ranks hold
  ``s // n + 1`` positions, the others ``s // n``.
- ``"zigzag"``: the sequence is cut the same way into ``2n`` chunks (the first ``s % 2n``
  chunks one position longer), and rank ``r`` holds chunk ``r`` followed by chunk
  ``2n - 1 - r``. Under a causal mask every rank then has about the same number of allowed
  (query, key) pairs: rank 0's early chunk attends to little and its late chunk to much.

A shard always lists its positions in increasing order.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor

Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


def check_layout(layout: str) -> None:
    """Raises:
    ValueError: ``layout`` is not one of :data:`LAYOUTS`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")


def _split_sizes(length: int, pieces: int) -> list[int]:
    """Sizes of ``pieces`` near-equal pieces of ``length``, longer ones first."""
    base, extra = divmod(length, pieces)
    return [base + (1 if i < extra else 0) for i in range(pieces)]


def shard_ranges(seq_len: int, rank: int, world_size: int, layout: Layout = "contiguous") -> list[tuple[int, int]]:
    """The ``[start, stop)`` position ranges that rank ``rank`` holds, in order.

    Raises:
        ValueError: a negative length, a rank outside ``[0, world_size)``, an unknown layout.
    """
    check_layout(layout)
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    pieces = world_size if layout == "contiguous" else 2 * world_size
    sizes = _split_sizes(seq_len, pieces)
    starts = [sum(sizes[:i]) for i in range(pieces)]
    chosen = [rank] if layout == "contiguous" else [rank, pieces - 1 - rank]
    return [(starts[i], starts[i] + sizes[i]) for i in chosen]


def shard_length(seq_len: int, rank: int, world_size: int, layout: Layout = "contiguous") -> int:
    """How many positions rank ``rank`` holds."""
    return sum(stop - start for start, stop in shard_ranges(seq_len, rank, world_size, layout))


def shard_positions(
    seq_len: int, rank: int, world_size: int, layout: Layout = "contiguous", *, device: torch.device | str | None = None
) -> Tensor:
    """The absolute positions ``[s_local]`` (int64, increasing) that rank ``rank`` holds;
    pass them as ``positions`` to a rotary encoding of a sequence-parallel model."""
    ranges = shard_ranges(seq_len, rank, world_size, layout)
    return torch.cat([torch.arange(start, stop, device=device) for start, stop in ranges])


def _group_info(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: start the script with torchrun and call "
            "attnkit.distributed.init() (or torch.distributed.init_process_group) first"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def shard(x: Tensor, *, dim: int = 2, layout: Layout = "contiguous", group: dist.ProcessGroup | None = None) -> Tensor:
    """This rank's shard of the whole sequence ``x`` along ``dim`` (every rank passes the
    same ``x``). Differentiable: the gradient of the shard lands in its positions of ``x``.

    Args:
        x: the whole tensor, e.g. ``[b, h, s, d]`` with ``dim=2``.
        dim: the sequence dim.
        layout: ``"contiguous"`` or ``"zigzag"`` (see the module docs for where the
            remainder of ``s / world_size`` goes).
        group: the process group (default: the whole world).

    Returns:
        ``x`` restricted to this rank's positions along ``dim`` (``s_local`` of them).

    Raises:
        ValueError: an unknown layout or a dim outside ``x``.
        RuntimeError: torch.distributed is not initialised.
    """
    check_layout(layout)
    rank, world = _group_info(group)
    dim = _check_dim(x, dim)
    ranges = shard_ranges(x.shape[dim], rank, world, layout)
    return torch.cat([x.narrow(dim, start, stop - start) for start, stop in ranges], dim)


def gather(
    x_local: Tensor, *, dim: int = 2, layout: Layout = "contiguous", group: dist.ProcessGroup | None = None
) -> Tensor:
    """The whole sequence from every rank's shard (the inverse of :func:`shard`); every rank
    gets it. Shards may differ in length by the layout's rule.

    Differentiable: the gradient of each rank's shard is the sum, over ranks, of the
    gradients of its positions in their copies of the result (as for any all-gather).

    Args:
        x_local: this rank's shard, e.g. ``[b, h, s_local, d]`` with ``dim=2``; the other
            dims must match on every rank.
        dim: the sequence dim.
        layout: the layout the shards were cut with.
        group: the process group (default: the whole world).

    Returns:
        The whole tensor, ``s = sum of s_local`` along ``dim``.

    Raises:
        ValueError: an unknown layout, a dim outside the tensor, or shard lengths that no
            sequence length gives in this layout.
        RuntimeError: torch.distributed is not initialised.
    """
    check_layout(layout)
    _group_info(group)
    dim = _check_dim(x_local, dim)
    return _Gather.apply(x_local, dim, layout, group)


def _check_dim(x: Tensor, dim: int) -> int:
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim must index a dim of a {x.ndim}-D tensor, got dim={dim}")
    return dim % x.ndim


def gather_lengths(local_length: int, device: torch.device, group: dist.ProcessGroup | None) -> list[int]:
    """Every rank's shard length (one small all-gather)."""
    world = dist.get_world_size(group)
    mine = torch.tensor([local_length], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [int(t) for t in every]


def check_lengths(lengths: list[int], layout: Layout) -> int:
    """The sequence length whose shards have ``lengths`` (one per rank) in ``layout``.

    Raises:
        ValueError: lengths that this layout does not produce for any sequence length.
    """
    world = len(lengths)
    seq_len = sum(lengths)
    expected = [shard_length(seq_len, r, world, layout) for r in range(world)]
    if expected != lengths:
        raise ValueError(
            f"shard lengths {lengths} do not come from cutting a sequence of {seq_len} in the {layout!r} layout "
            f"over {world} ranks (that gives {expected}); cut sequences with attnkit.distributed.shard"
        )
    return seq_len


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_local: Tensor, dim: int, layout: Layout, group: dist.ProcessGroup | None):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        lengths = gather_lengths(x_local.shape[dim], x_local.device, group)
        seq_len = check_lengths(lengths, layout)
        longest = max(lengths)
        padded = x_local.contiguous()
        if padded.shape[dim] < longest:  # all_gather wants equal shapes
            pad_shape = list(padded.shape)
            pad_shape[dim] = longest - padded.shape[dim]
            padded = torch.cat([padded, padded.new_zeros(pad_shape)], dim)
        pieces = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(pieces, padded, group=group)
        out_shape = list(x_local.shape)
        out_shape[dim] = seq_len
        out = x_local.new_empty(out_shape)
        for r, piece in enumerate(pieces):
            offset = 0
            for start, stop in shard_ranges(seq_len, r, world, layout):
                out.narrow(dim, start, stop - start).copy_(piece.narrow(dim, offset, stop - start))
                offset += stop - start
        ctx.dim, ctx.layout, ctx.group, ctx.rank, ctx.world, ctx.seq_len = dim, layout, group, rank, world, seq_len
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        total = grad_out.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        ranges = shard_ranges(ctx.seq_len, ctx.rank, ctx.world, ctx.layout)
        grad = torch.cat([total.narrow(ctx.dim, start, stop - start) for start, stop in ranges], ctx.dim)
        return grad, None, None, None
