"""A Triton kernel that computes every per-head statistic of the long-context summaries
(:mod:`attnkit.inspect.long_context`) in one launch per layer, without writing a block of
scores to memory.

Each program takes ``BM`` consecutive query rows of one chosen head and streams the keys
those rows may attend to in tiles of ``BN``, every score a ``tl.dot`` with float32
accumulation, in two passes:

1. the row maximum and the softmax normaliser, online (as a flash-attention forward pass
   does), and the ``top_k`` strongest keys: a running set per row of the ``top_k`` best
   scores, into which a tile's best keys are inserted while one of them beats the set's
   weakest (most tiles insert nothing);
2. with the row's maximum and normaliser known, the exact weights ``p`` of every tile again,
   and from them the mass on the sink tokens, the mean distance, the mass within the window,
   the entropy ``log2 Z - Σ p (x - max)`` (scores ``x`` in base 2), the mass at each
   distance (the tile's diagonals, summed over its rows by one ``tl.gather`` that lines the
   diagonals up as columns, added to the head's histogram with one atomic add per diagonal)
   and, when asked, the block-reduced map (one atomic max and add per map block the tile
   touches).

The second pass runs only when one of its statistics is asked. Scores are the layer's own:
``q·k`` times its scale, soft-capped as ``softcap · tanh(q·k · scale / softcap)``, masked by
the causal mask and the sliding window; a masked score is ``-1e30`` (finite, so that a tile
with no key yet for a row leaves no NaN: its first real key's rescaling clears it).

Triton is imported here only: this module is loaded when the ``"triton"`` engine of
:func:`attnkit.inspect.long_context.summarize_layer` runs. Under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is imported) the kernel runs on CPU tensors.

Layouts: ``q [h, s, d]`` and ``k [h_kv, s, d]`` with any head and position strides (the last
dimension contiguous); results float32 (top keys int64). Shape letters: ``n_h`` chosen heads,
``n_r`` chosen rows, ``n_t`` tiles of rows, ``k`` top keys, ``n_b`` map blocks per side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnkit.functional.linear_triton import dot_precision

# The score of a masked key: finite, so that exp2(masked - masked) never meets inf - inf.
MASKED = tl.constexpr(-1.0e30)
LOG2E = tl.constexpr(1.4426950408889634)
# What the planes of the statistics tensor of the second pass hold, in order.
STATISTIC_PLANES = ("sink", "distance", "within_window", "entropy")

# Lengths and counts change from call to call: compiled once for all of them.
_RUNTIME = ("s", "n_r", "group", "window", "sink_tokens", "near", "map_block", "n_blocks")


@triton.jit
def _scores(
    q,
    k_base,
    kt,
    rows,
    row_in,
    p0,
    last,
    stride_ks,
    d,
    k_hi,
    factor,
    softcap,
    window,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    PREC: tl.constexpr,
):
    """Base-2 scores ``[BM, BN]`` of queries ``q [BM, BD]`` (rows ``p0 .. last``) against keys
    ``kt .. kt + BN - 1`` (``MASKED`` where a row may not attend), and those keys' positions
    ``[BN]``. Tiles that every row sees whole (most of them) skip the masks."""
    keys = kt + tl.arange(0, BN)
    dims = tl.arange(0, BD)
    key_in = keys < k_hi
    kk = tl.load(
        k_base + keys[:, None].to(tl.int64) * stride_ks + dims[None, :],
        mask=key_in[:, None] & (dims[None, :] < d),
        other=0.0,
    )
    x = tl.dot(q, tl.trans(kk), input_precision=PREC)  # [BM, BN] float32
    if SOFTCAP:
        y = x * factor
        t = tl.exp2(tl.abs(y) * (-2.0 * LOG2E))
        th = (1.0 - t) / (1.0 + t)
        x = tl.where(y < 0, -th, th) * (softcap * LOG2E)
    else:
        x = x * factor
    edge = (kt + BN > k_hi) | (last - p0 + 1 < BM)
    if CAUSAL:
        edge = edge | (kt + BN - 1 > p0)
    if window > 0:
        edge = edge | (last - kt >= window)
        if not CAUSAL:
            edge = edge | (kt + BN - 1 - p0 >= window)
    if edge:
        allowed = row_in[:, None] & key_in[None, :]
        if CAUSAL:
            allowed = allowed & (keys[None, :] <= rows[:, None])
        if window > 0:
            allowed = allowed & (rows[:, None] - keys[None, :] < window)
            if not CAUSAL:
                allowed = allowed & (keys[None, :] - rows[:, None] < window)
        x = tl.where(allowed, x, MASKED)
    return x, keys


@triton.jit(do_not_specialize=_RUNTIME)
def _statistics_kernel(
    Q,
    K,
    HEADS,
    TILES,
    STATS,
    TOPV,
    TOPI,
    MASS,
    BLOCK_MAX,
    BLOCK_SUM,
    s,
    d,
    n_r,
    group,
    stride_qh,
    stride_qs,
    stride_kh,
    stride_ks,
    factor,
    softcap,
    window,
    sink_tokens,
    near,
    map_block,
    n_blocks,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    TOP_K: tl.constexpr,
    TK: tl.constexpr,
    SECOND: tl.constexpr,
    HISTOGRAM: tl.constexpr,
    MAP: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    W: tl.constexpr,
    PREC: tl.constexpr,
):
    tile = tl.program_id(0)
    chosen = tl.program_id(1)
    head = tl.load(HEADS + chosen)
    first_out = tl.load(TILES + tile * 3)  # index of the tile's first row among the chosen rows
    p0 = tl.load(TILES + tile * 3 + 1)  # its position
    count = tl.load(TILES + tile * 3 + 2)
    a = tl.arange(0, BM)
    rows = p0 + a
    row_in = a < count
    last = p0 + count - 1
    # The keys any row of the tile may attend to.
    if CAUSAL:
        k_hi = last + 1
    else:
        k_hi = tl.where(window > 0, tl.minimum(s, last + window), s)
    k_lo = tl.where(window > 0, tl.maximum(0, p0 - window + 1), 0)
    dims = tl.arange(0, BD)
    q = tl.load(
        Q + head.to(tl.int64) * stride_qh + rows[:, None].to(tl.int64) * stride_qs + dims[None, :],
        mask=row_in[:, None] & (dims[None, :] < d),
        other=0.0,
    )
    k_base = K + (head // group).to(tl.int64) * stride_kh
    factor2 = factor if SOFTCAP else factor * LOG2E
    m, z, top_v, top_i = _first_pass(
        q, k_base, rows, row_in, p0, last, k_lo, k_hi, stride_ks, d, factor2, softcap, window,
        CAUSAL, SOFTCAP, TOP_K, TK, BM, BN, BD, PREC,
    )  # fmt: skip
    at = chosen.to(tl.int64) * n_r + first_out + a  # [BM] the rows' places in the results
    if TOP_K > 0:
        slots = tl.arange(0, TK)
        weight = tl.exp2(top_v - m[:, None]) / z[:, None]
        taken = (top_i >= 0) & (weight > 0)
        keep = row_in[:, None] & (slots[None, :] < TOP_K)
        at_top = at[:, None] * TOP_K + slots[None, :]
        tl.store(TOPV + at_top, tl.where(taken, weight, 0.0), mask=keep)
        tl.store(TOPI + at_top, tl.where(taken, top_i, -1).to(tl.int64), mask=keep)
    if SECOND:
        sink, distance, within, spread = _second_pass(
            q, k_base, rows, row_in, last, k_lo, k_hi, stride_ks, d, s, factor2, softcap, window, m, z,
            p0, chosen, sink_tokens, near, map_block, n_blocks, MASS, BLOCK_MAX, BLOCK_SUM,
            CAUSAL, SOFTCAP, HISTOGRAM, MAP, BM, BN, BD, W, PREC,
        )  # fmt: skip
        plane = n_r * tl.num_programs(1).to(tl.int64)
        tl.store(STATS + at, sink, mask=row_in)  # the planes of STATISTIC_PLANES
        tl.store(STATS + plane + at, distance, mask=row_in)
        tl.store(STATS + 2 * plane + at, within, mask=row_in)
        tl.store(STATS + 3 * plane + at, tl.log2(z) - spread, mask=row_in)


@triton.jit
def _first_pass(
    q, k_base, rows, row_in, p0, last, k_lo, k_hi, stride_ks, d, factor2, softcap, window,
    CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, TOP_K: tl.constexpr, TK: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Each row's maximum and normaliser (base 2) over keys ``k_lo .. k_hi - 1``, and its
    ``TOP_K`` best scores and their keys ``[BM, TK]`` (unordered; ``-1`` where unfilled)."""
    m = tl.full((BM,), MASKED, tl.float32)
    z = tl.zeros((BM,), tl.float32)
    slots = tl.arange(0, TK)
    # Slots beyond TOP_K hold +inf: never the weakest, never replaced.
    top_v = tl.where(slots[None, :] < TOP_K, MASKED, float("inf")) + tl.zeros((BM, TK), tl.float32)
    top_i = tl.full((BM, TK), -1, tl.int32)
    for kt in range(k_lo, k_hi, BN):
        x, keys = _scores(
            q, k_base, kt, rows, row_in, p0, last, stride_ks, d, k_hi, factor2, softcap, window,
            CAUSAL, SOFTCAP, BM, BN, BD, PREC,
        )  # fmt: skip
        m_new = tl.maximum(m, tl.max(x, 1))
        z = z * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), 1)
        m = m_new
        if TOP_K > 0:
            top_v, top_i = _insert_top(x, kt, top_v, top_i, BN, TK)
    return m, z, top_v, top_i


@triton.jit
def _insert_top(x, kt, top_v, top_i, BN: tl.constexpr, TK: tl.constexpr):
    """Insert the best scores of a tile ``x [BM, BN]`` of keys ``kt ..`` into each row's set
    of best scores ``top_v`` and keys ``top_i``, one per row at a time, replacing the set's
    weakest, while any row's best remaining score beats its set's weakest."""
    slots = tl.arange(0, TK)
    cols = tl.arange(0, BN)
    weakest = tl.min(top_v, 1)
    go = tl.max((tl.max(x, 1) > weakest).to(tl.int32), 0)
    while go > 0:
        best = tl.max(x, 1)
        at = tl.argmax(x, 1)
        slot = tl.argmin(top_v, 1)
        hit = (slots[None, :] == slot[:, None]) & (best > weakest)[:, None]
        top_v = tl.where(hit, best[:, None], top_v)
        top_i = tl.where(hit, (kt + at)[:, None], top_i)
        x = tl.where(cols[None, :] == at[:, None], MASKED, x)
        weakest = tl.min(top_v, 1)
        go = tl.max((tl.max(x, 1) > weakest).to(tl.int32), 0)
    return top_v, top_i


@triton.jit
def _second_pass(
    q, k_base, rows, row_in, last, k_lo, k_hi, stride_ks, d, s, factor2, softcap, window, m, z,
    p0, chosen, sink_tokens, near, map_block, n_blocks, MASS, BLOCK_MAX, BLOCK_SUM,
    CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, HISTOGRAM: tl.constexpr, MAP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, W: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The exact weights of every tile again, from each row's maximum ``m`` and normaliser
    ``z``: each row's sink mass, mean distance, mass within ``near`` and ``Σ p (x - m)``
    ``[BM]``; the mass at each distance and the map blocks are added to ``MASS`` and
    ``BLOCK_MAX``/``BLOCK_SUM`` on the way."""
    inv_z = tl.where(row_in, 1.0 / z, 0.0)
    counted = row_in & (rows >= 1)  # query 0 is left out of the mass at each distance
    sink = tl.zeros((BM,), tl.float32)
    distance = tl.zeros((BM,), tl.float32)
    within = tl.zeros((BM,), tl.float32)
    spread = tl.zeros((BM,), tl.float32)
    for kt in range(k_lo, k_hi, BN):
        x, keys = _scores(
            q, k_base, kt, rows, row_in, p0, last, stride_ks, d, k_hi, factor2, softcap, window,
            CAUSAL, SOFTCAP, BM, BN, BD, PREC,
        )  # fmt: skip
        shifted = x - m[:, None]
        p = tl.exp2(shifted) * inv_z[:, None]  # [BM, BN]; 0 where masked
        gap = rows[:, None] - keys[None, :]
        if not CAUSAL:
            gap = tl.abs(gap)
        distance += tl.sum(p * gap.to(tl.float32), 1)
        within += tl.sum(tl.where(gap < near, p, 0.0), 1)
        spread += tl.sum(p * shifted, 1)
        if kt < sink_tokens:
            sink += tl.sum(tl.where(keys[None, :] < sink_tokens, p, 0.0), 1)
        if HISTOGRAM:
            _add_histogram(tl.where(counted[:, None], p, 0.0), p0 - kt, chosen, s, MASS, BM, BN, W)
        if MAP:
            _fold_map(p, rows, keys, row_in, k_hi, chosen, map_block, n_blocks, BLOCK_MAX, BLOCK_SUM)
    return sink, distance, within, spread


@triton.jit
def _add_histogram(p, offset, chosen, s, MASS, BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr):
    """Add the weights ``p [BM, BN]`` of a tile whose row ``a`` and key ``b`` are ``offset +
    a - b`` apart to the head's mass at each distance: the tile's ``BM + BN - 1`` diagonals
    lined up as columns (column ``c`` of row ``a`` holds key ``c + a - (BM - 1)``) by one
    gather, summed over the rows, one atomic add each."""
    a = tl.arange(0, BM)
    c = tl.arange(0, W)
    lined = c[None, :] + a[:, None] - (BM - 1)
    in_tile = (lined >= 0) & (lined < BN)
    diagonals = tl.sum(tl.where(in_tile, tl.gather(p, tl.where(in_tile, lined, 0), 1), 0.0), 0)  # [W]
    distance = tl.abs(offset + BM - 1 - c)
    tl.atomic_add(
        MASS + chosen.to(tl.int64) * s + distance, diagonals, mask=(diagonals != 0) & (distance < s), sem="relaxed"
    )


@triton.jit
def _fold_map(p, rows, keys, row_in, k_hi, chosen, map_block, n_blocks, BLOCK_MAX, BLOCK_SUM):
    """Add the weights ``p [BM, BN]`` of a tile to the maxima and sums of the ``map_block``
    blocks of the map it touches: each block row's rows reduced to one value per key, those
    reduced per block (one atomic max and add per block)."""
    row_block = rows // map_block
    key_block = keys // map_block
    first_row, last_row = tl.min(row_block, 0), tl.max(tl.where(row_in, row_block, 0), 0)
    first_key = tl.min(key_block, 0)
    last_key = tl.max(tl.where(keys < k_hi, key_block, 0), 0)
    base = chosen.to(tl.int64) * n_blocks * n_blocks
    for i in range(first_row, last_row + 1):
        part = tl.where(((row_block == i) & row_in)[:, None], p, 0.0)
        column_max = tl.max(part, 0)  # [BN]
        column_sum = tl.sum(part, 0)
        for j in range(first_key, last_key + 1):
            inside = key_block == j
            at = base + i * n_blocks + j
            tl.atomic_max(BLOCK_MAX + at, tl.max(tl.where(inside, column_max, 0.0), 0), sem="relaxed")
            tl.atomic_add(BLOCK_SUM + at, tl.sum(tl.where(inside, column_sum, 0.0), 0), sem="relaxed")


@dataclass(frozen=True)
class LaunchSettings:
    """How the kernel is launched: query rows and keys of one tile (powers of two, at least
    16), warps per program and loads in flight per loop. Compiled for an H100 (sm_90, bfloat16,
    head dim 128, every statistic), 64 × 64 tiles take 170 registers a thread with eight warps
    and none spilled; with four warps, or with 128 rows or keys, registers spill."""

    block_rows: int = 64
    block_keys: int = 64
    num_warps: int = 8
    num_stages: int = 2


DEFAULT_LAUNCH = LaunchSettings()


@dataclass
class KernelStatistics:
    """What :func:`layer_statistics` returns, float32 (keys int64), on the inputs' device.

    Attributes:
        stats: ``[4, n_h, n_r]`` sink mass, mean distance, mass within the window and entropy
            in bits of every row (zeros when the second pass did not run).
        top_weights, top_keys: ``[n_h, n_r, k]`` unordered (``0`` and ``-1`` padding).
        mass: ``[n_h, s]`` the weights at each distance summed over the rows ``>= 1``, or ``None``.
        block_max, block_sum: ``[n_h, n_b, n_b]``, or ``None``.
    """

    stats: Tensor
    top_weights: Tensor
    top_keys: Tensor
    mass: Tensor | None
    block_max: Tensor | None
    block_sum: Tensor | None


def row_tiles(rows: Tensor, block_rows: int) -> Tensor:
    """Tiles ``[n_t, 3]`` int32 of sorted distinct ``rows [n_r]``: runs of consecutive
    positions cut every ``block_rows``, as (index of the first row in ``rows``, its position,
    rows), the longest causal rows (the last tiles) first."""
    n = rows.numel()
    index = torch.arange(n, device=rows.device)
    starts_run = torch.ones(n, dtype=torch.bool, device=rows.device)
    starts_run[1:] = rows[1:] != rows[:-1] + 1
    run_start = torch.cummax(torch.where(starts_run, index, 0), 0).values  # [n_r]
    run_id = torch.cumsum(starts_run.long(), 0) - 1
    run_end = torch.zeros(int(run_id[-1]) + 1, dtype=torch.long, device=rows.device)
    run_end.scatter_reduce_(0, run_id, index + 1, reduce="amax")
    first = ((index - run_start) % block_rows == 0).nonzero()[:, 0]  # [n_t]
    counts = torch.minimum(run_end[run_id[first]] - first, torch.full_like(first, block_rows))
    tiles = torch.stack([first, rows[first], counts], dim=1)
    return tiles.flip(0).to(torch.int32).contiguous()


def layer_statistics(
    q: Tensor,
    k: Tensor,
    heads: Tensor,
    rows: Tensor,
    *,
    factor: float,
    softcap: float | None,
    causal: bool,
    window: int | None,
    top_k: int,
    sink_tokens: int,
    near: int,
    second_pass: bool,
    histogram: bool,
    map_block: int | None,
    launch: LaunchSettings = DEFAULT_LAUNCH,
) -> KernelStatistics:
    """Run the kernel over the chosen ``heads [n_h]`` and sorted distinct ``rows [n_r]`` of
    queries ``q [h, s, d]`` and keys ``k [h_kv, s, d]``.

    Args:
        factor: what ``q·k`` is multiplied by (the layer's scale, over ``softcap`` if any).
        softcap, causal, window: the layer's scoring.
        top_k: keys kept per row (0: none).
        sink_tokens, near: the first tokens counted as the sink; the distance below which
            attention is within the window.
        second_pass: compute :attr:`KernelStatistics.stats` (and what follows).
        histogram: the mass at each distance (needs ``second_pass``).
        map_block: the block-reduced map's block side (needs ``second_pass`` and every row).
        launch: tile sizes, warps and pipelined loads.
    """
    h, s, d = q.shape
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    n_h, n_r = heads.numel(), rows.numel()
    device = q.device
    tiles = row_tiles(rows, launch.block_rows)
    f32 = torch.float32
    stats = torch.zeros(4, n_h, n_r, dtype=f32, device=device)
    top_weights = torch.zeros(n_h, n_r, top_k, dtype=f32, device=device)
    top_keys = torch.full((n_h, n_r, top_k), -1, dtype=torch.long, device=device)
    mass = torch.zeros(n_h, s, dtype=f32, device=device) if histogram else None
    n_blocks = math.ceil(s / map_block) if map_block else 0
    block_max = torch.zeros(n_h, n_blocks, n_blocks, dtype=f32, device=device) if map_block else None
    block_sum = torch.zeros_like(block_max) if block_max is not None else None
    unused = stats  # pointer for outputs a launch does not write
    _statistics_kernel[(tiles.shape[0], n_h)](
        q,
        k,
        heads.to(torch.int32),
        tiles,
        stats,
        top_weights,
        top_keys,
        unused if mass is None else mass,
        unused if block_max is None else block_max,
        unused if block_sum is None else block_sum,
        s,
        d,
        n_r,
        h // k.shape[0],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        factor,
        1.0 if softcap is None else float(softcap),
        window or 0,
        sink_tokens,
        near,
        map_block or 1,
        n_blocks,
        CAUSAL=causal,
        SOFTCAP=softcap is not None,
        TOP_K=top_k,
        TK=triton.next_power_of_2(max(top_k, 1)),
        SECOND=second_pass,
        HISTOGRAM=histogram,
        MAP=map_block is not None,
        BM=launch.block_rows,
        BN=launch.block_keys,
        BD=max(16, triton.next_power_of_2(d)),
        W=triton.next_power_of_2(launch.block_rows + launch.block_keys - 1),
        PREC=dot_precision(q.dtype),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    return KernelStatistics(stats, top_weights, top_keys, mass, block_max, block_sum)
