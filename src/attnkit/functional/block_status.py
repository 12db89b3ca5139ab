"""Block status: which (query block, key block) pairs of a mask are empty, partial or full.

Every block-sparse engine starts here: the tiled schedule (:mod:`attnkit.functional.tiled`)
and the FlexAttention ``BlockMask`` (:mod:`attnkit.functional.flex`). A
:class:`~attnkit.masks.Mask` with a block test is classified from the blocks' position spans
alone; one without is evaluated pair by pair, one query block at a time; a bool tensor is
reduced block by block.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional import masks as masks_mod

EMPTY, PARTIAL, FULL = 0, 1, 2


def spans(pos: Tensor, block: int, period: int = 0) -> masks_mod.Span:
    """The :class:`~attnkit.masks.Span` of each block of ``block`` consecutive entries of
    ``pos`` (the last block may be shorter): ``lo``/``hi`` ``[n_blocks]``."""
    n = pos.numel()
    n_blocks = -(-n // block)
    padded = torch.cat([pos, pos[-1:].expand(n_blocks * block - n)]) if n_blocks * block > n else pos
    grid = padded.view(n_blocks, block)
    lo, hi = grid.amin(1), grid.amax(1)
    residue = None
    if period > 0:
        res = torch.remainder(grid, period)
        residue = torch.where((res == res[:, :1]).all(1), res[:, 0], torch.full_like(res[:, 0], -1))
    return masks_mod.Span(lo, hi, period, residue)


def classify_blocks(
    mask: masks_mod.Mask | None,
    dense: Tensor | None,
    q_pos: Tensor,
    kv_pos: Tensor,
    block_q: int,
    block_k: int,
    *,
    period: int = 0,
) -> Tensor:
    """``[n_q_blocks, n_k_blocks]`` int8 of ``EMPTY``/``PARTIAL``/``FULL``, taken over every
    batch entry and head (a block kept for one of them is computed for all)."""
    s_q, s_k = q_pos.numel(), kv_pos.numel()
    nq, nk = -(-s_q // block_q), -(-s_k // block_k)
    device = q_pos.device
    status = torch.full((nq, nk), FULL, dtype=torch.int8, device=device)
    if nq == 0 or nk == 0:
        return status
    if mask is not None:
        mask = mask.to(device)
        n_b, n_h = mask.batch_size or 1, mask.num_heads or 1
        b_idx = torch.arange(n_b, device=device).view(n_b, 1, 1, 1)
        h_idx = torch.arange(n_h, device=device).view(1, n_h, 1, 1)
        if mask.blocks is not None:
            qs, ks = spans(q_pos, block_q, period), spans(kv_pos, block_k, period)
            q_span = masks_mod.Span(
                qs.lo.view(1, 1, nq, 1),
                qs.hi.view(1, 1, nq, 1),
                qs.period,
                None if qs.residue is None else qs.residue.view(1, 1, nq, 1),
            )
            k_span = masks_mod.Span(
                ks.lo.view(1, 1, 1, nk),
                ks.hi.view(1, 1, 1, nk),
                ks.period,
                None if ks.residue is None else ks.residue.view(1, 1, 1, nk),
            )
            some, every = mask.blocks(b_idx, h_idx, q_span, k_span)
            shape = (n_b, n_h, nq, nk)
            some = torch.as_tensor(some, device=device).expand(shape).any(1).any(0)
            every = torch.as_tensor(every, device=device).expand(shape).all(1).all(0)
        else:
            some, every = _dense_block_bounds(mask, q_pos, kv_pos, block_q, block_k)
        status = _status(some, every)
    if dense is not None:
        status = torch.minimum(status, _tensor_block_status(dense, block_q, block_k, nq, nk))
    return status


def _status(some: Tensor, every: Tensor) -> Tensor:
    return torch.where(~some, EMPTY, torch.where(every, FULL, PARTIAL)).to(torch.int8)


def _dense_block_bounds(
    mask: masks_mod.Mask, q_pos: Tensor, kv_pos: Tensor, block_q: int, block_k: int
) -> tuple[Tensor, Tensor]:
    """Evaluate a mask with no block test pair by pair, one query block at a time."""
    s_q, s_k = q_pos.numel(), kv_pos.numel()
    nq, nk = -(-s_q // block_q), -(-s_k // block_k)
    pad = nk * block_k - s_k
    somes, everies = [], []
    for i in range(nq):
        rows = q_pos[i * block_q : (i + 1) * block_q]
        allowed = mask.evaluate(rows, kv_pos)  # [b|1, h|1, m, s_k]
        some = allowed.any(2).any(1).any(0)  # [s_k]
        every = allowed.all(2).all(1).all(0)
        if pad:
            some = torch.cat([some, some.new_zeros(pad)])
            every = torch.cat([every, every.new_ones(pad)])
        somes.append(some.view(nk, block_k).any(1))
        everies.append(every.view(nk, block_k).all(1))
    return torch.stack(somes), torch.stack(everies)


def _tensor_block_status(dense: Tensor, block_q: int, block_k: int, nq: int, nk: int) -> Tensor:
    """Block status of a bool tensor ``[b|1, h|1, s_q|1, s_k|1]``."""
    t = dense.any(1, keepdim=True).any(0, keepdim=True)[0, 0]  # may-attend somewhere
    a = dense.all(1, keepdim=True).all(0, keepdim=True)[0, 0]

    def reduce(x: Tensor, fill: bool, op) -> Tensor:
        rows, cols = x.shape
        if rows > 1:
            x = torch.cat([x, x.new_full((nq * block_q - rows, cols), fill)]) if nq * block_q > rows else x
            x = op(x.view(nq, block_q, cols), 1)
        if cols > 1:
            r = x.shape[0]
            x = torch.cat([x, x.new_full((r, nk * block_k - cols), fill)], 1) if nk * block_k > cols else x
            x = op(x.view(r, nk, block_k), 2)
        return x.expand(nq, nk)

    some = reduce(t, False, lambda x, dim: x.any(dim))
    every = reduce(a, True, lambda x, dim: x.all(dim))
    return _status(some, every)
