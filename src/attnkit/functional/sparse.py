"""Block-sparse attention for structured patterns: work proportional to the blocks kept.

``sparse_attention(q, k, v, mask=...)`` is exact attention under a
:class:`~attnkit.masks.Mask` pattern, run by the tiled kernel
(:mod:`attnkit.functional.tiled`) with ``block_size`` blocks: blocks the pattern leaves
empty are never computed, full blocks are computed without evaluating the mask, and only
partial blocks evaluate it. The patterns of the literature, built from :mod:`attnkit.masks`:

- :func:`strided_pattern` and :func:`fixed_pattern` — Sparse Transformer (Child et al., 2019);
- :func:`longformer_pattern` — sliding window plus global tokens (Beltagy et al., 2020);
- :func:`bigbird_pattern` — window, global tokens and random *blocks* (Zaheer et al., 2020).

A strided pattern (query ``i`` sees keys ``i, i − s, i − 2s, …``) touches every block of the
natural order, so block skipping gains nothing. With ``permute=s`` the tokens are reordered by
position mod ``s`` before blocking: the pattern becomes block-diagonal (block-dense), and the
output is put back in the original order. Positions stay absolute, so any mask, causal
included, keeps its meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional._validate import accepts_single_head
from attnkit.functional.engines import Engine
from attnkit.functional.records import AttentionResult
from attnkit.functional.scores import resolve_scale
from attnkit.functional.tiled import make_plan, tiled_core


@accepts_single_head
def sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: masks_mod.Mask | None = None,
    causal: bool = False,
    scale: float | None = None,
    block_size: int | None = None,
    permute: int | None = None,
    return_lse: bool = False,
    engine: Engine = "auto",
) -> Tensor | AttentionResult:
    """Exact attention restricted to the pattern ``mask``, computing only the blocks it keeps.

    Args:
        q: ``[b, h, s_q, d]`` (or ``[s_q, d]``).
        k: ``[b, h_kv, s_k, d]`` (or ``[s_k, d]``), ``h`` divisible by ``h_kv``.
        v: ``[b, h_kv, s_k, d_v]`` (or ``[s_k, d_v]``).
        mask: where each query may attend (a :class:`~attnkit.masks.Mask`, e.g. from
            :func:`bigbird_pattern`); with a block test it is classified block by block
            without evaluating pairs.
        causal: also apply the bottom-right causal mask.
        scale: score scale, default ``1/sqrt(d)``.
        block_size: tokens per block, for queries and keys; default 64, or with ``permute``
            the largest power of two (8 to 64) that fits in one residue class
            (``s_k / permute`` tokens), so that blocks do not straddle classes.
        permute: reorder queries and keys by position mod ``permute`` first (use the stride
            of a strided pattern), so that the pattern becomes block-dense.
        return_lse: return an :class:`AttentionResult` with the log-sum-exp ``[b, h, s_q]``.
        engine: ``"blockwise"`` (the tiled kernel), ``"flex"`` (compiled FlexAttention on the
            same, possibly permuted, layout; its blocks are 128 tokens and ``block_size``
            does not apply), or ``"auto"``: Flex on GPUs, blockwise on the CPU.

    Returns:
        ``[b, h, s_q, d_v]`` (or ``[s_q, d_v]``); rows the pattern leaves empty are zeros.

    Raises:
        TypeError: ``mask`` is not a Mask; bad tensors as :func:`attnkit.attention`.
        ValueError: ``block_size`` or ``permute`` below 1, a pattern for other sizes, an
            unknown engine.
    """
    if not isinstance(mask, masks_mod.Mask):
        raise TypeError(f"mask must be an attnkit.masks.Mask, got {type(mask).__name__}")
    if permute is not None and (isinstance(permute, bool) or not isinstance(permute, int) or permute < 1):
        raise ValueError(f"permute must be an int >= 1 or None, got {permute!r}")
    s_q, s_k = q.shape[2], k.shape[2]
    scale_f = resolve_scale(scale, q.shape[-1])
    if block_size is None:
        block_size = default_block_size(s_k, permute)
    if permute is None or permute == 1:
        out, lse = tiled_core(
            q,
            k,
            v,
            mask=mask,
            bias=None,
            causal=causal,
            scale=scale_f,
            block_size=(block_size, block_size),
            engine=engine,
            caller="sparse_attention",
            need_lse=return_lse,
        )
    else:
        q_order, q_pos = residue_order(s_q, permute, offset=s_k - s_q, device=q.device)
        k_order, kv_pos = residue_order(s_k, permute, device=q.device)
        out_p, lse_p = tiled_core(
            q.index_select(2, q_order),
            k.index_select(2, k_order),
            v.index_select(2, k_order),
            mask=mask,
            bias=None,
            causal=causal,
            scale=scale_f,
            block_size=(block_size, block_size),
            q_pos=q_pos,
            kv_pos=kv_pos,
            period=permute,
            engine=engine,
            caller="sparse_attention",
            need_lse=return_lse,
        )
        inverse = torch.argsort(q_order)
        out = out_p.index_select(2, inverse)
        lse = None if lse_p is None else lse_p.index_select(2, inverse)
    return AttentionResult(out, None, lse) if return_lse else out


def default_block_size(s_k: int, permute: int | None) -> int:
    """64, or with a permutation the largest power of two in [8, 64] that fits in one
    residue class of ``s_k / permute`` tokens."""
    if permute is None or permute <= 1:
        return 64
    per_class = max(1, s_k // permute)
    return max(8, min(64, 1 << (per_class.bit_length() - 1)))


def residue_order(
    n: int, period: int, *, offset: int = 0, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """Rows ``0..n-1`` at positions ``offset + row``, ordered by (position mod ``period``,
    position): returns ``(order [n], positions [n] in that order)``."""
    pos = torch.arange(n, device=device) + offset
    key = torch.remainder(pos, period) * (n + abs(offset) + 1) + (pos - pos.min() if n else pos)
    order = torch.argsort(key)
    return order, pos[order]


def kept_fraction(
    pattern: masks_mod.Mask,
    s_q: int,
    s_k: int,
    *,
    causal: bool = False,
    block_size: int | None = None,
    permute: int | None = None,
) -> float:
    """Fraction of blocks :func:`sparse_attention` computes for ``pattern`` (same defaults)."""
    if block_size is None:
        block_size = default_block_size(s_k, permute)
    q = torch.empty(1, 1, s_q, 1)
    k = torch.empty(1, 1, s_k, 1)
    q_pos = kv_pos = None
    period = 0
    if permute is not None and permute > 1:
        _, q_pos = residue_order(s_q, permute, offset=s_k - s_q)
        _, kv_pos = residue_order(s_k, permute)
        period = permute
    plan = make_plan(
        q,
        k,
        k,
        mask=pattern,
        bias=None,
        causal=causal,
        scale=1.0,
        block_size=(block_size, block_size),
        q_pos=q_pos,
        kv_pos=kv_pos,
        period=period,
    )
    return plan.kept_fraction


# ---------------------------------------------------------------------------------------
# Patterns.
# ---------------------------------------------------------------------------------------


def strided_pattern(stride: int) -> masks_mod.Mask:
    """Sparse Transformer's strided attention, both heads in one mask: the previous
    ``stride`` tokens, and every ``stride``-th token before. Use with ``causal=True``."""
    return masks_mod.sliding_window(stride - 1, 0) | masks_mod.strided(stride)


def fixed_pattern(block: int, summary: int) -> masks_mod.Mask:
    """Sparse Transformer's fixed attention: the query's own block of ``block`` tokens and
    the last ``summary`` tokens of every block. Use with ``causal=True``."""
    return masks_mod.fixed(block, summary)


def longformer_pattern(window: int, global_indices: Sequence[int] | Tensor = ()) -> masks_mod.Mask:
    """Longformer: a ``±window`` sliding window, plus global tokens that see and are seen by
    every token."""
    pattern = masks_mod.sliding_window(window, window)
    if len(global_indices):
        pattern = pattern | masks_mod.global_tokens(global_indices)
    return pattern


def block_random(block: int, density: float, seed: int = 0) -> masks_mod.Mask:
    """Whole ``block × block`` tiles kept at random with probability ``density``
    (deterministic in ``seed``): BigBird's random attention, aligned to the blocks of the
    kernel when ``block`` is the kernel's block size."""
    masks_mod.check_int("block", block, minimum=1)
    tile = masks_mod.random(density, seed)

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return tile.fn(b, h, torch.div(q, block, rounding_mode="floor"), torch.div(kv, block, rounding_mode="floor"))

    def blocks(b: Tensor, h: Tensor, q: masks_mod.Span, kv: masks_mod.Span) -> tuple[Tensor, Tensor]:
        q_tile, kv_tile = torch.div(q.lo, block, rounding_mode="floor"), torch.div(kv.lo, block, rounding_mode="floor")
        one_tile = (q_tile == torch.div(q.hi, block, rounding_mode="floor")) & (
            kv_tile == torch.div(kv.hi, block, rounding_mode="floor")
        )
        kept = tile.fn(b, h, q_tile, kv_tile)
        return kept | ~one_tile, kept & one_tile

    return masks_mod.Mask(fn, f"block_random(block={block}, density={density}, seed={seed})", blocks=blocks)


def bigbird_pattern(
    window: int,
    global_indices: Sequence[int] | Tensor = (),
    *,
    block: int = 64,
    random_density: float = 0.0,
    seed: int = 0,
) -> masks_mod.Mask:
    """BigBird: a ``±window`` sliding window, global tokens, and random ``block × block``
    tiles kept with probability ``random_density``."""
    pattern = longformer_pattern(window, global_indices)
    if random_density > 0:
        pattern = pattern | block_random(block, random_density, seed)
    return pattern
