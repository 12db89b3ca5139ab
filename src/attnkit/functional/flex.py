"""The FlexAttention engine: attnkit masks run as compiled FlexAttention kernels.

``flex_core`` turns an attnkit :class:`~attnkit.masks.Mask` into FlexAttention's two inputs
and calls ``flex_attention`` compiled with ``torch.compile``:

- a ``mask_mod`` that calls the mask's function with attnkit's absolute positions (query row
  ``i`` at ``i + s_k - s_q``, or the positions of a permuted layout), on the mask's tensors
  moved to the inputs' device (:meth:`Mask.to`), so the compiled kernel inlines it;
- a ``BlockMask``: from the mask's exact block test when it has one (no pair is evaluated,
  only the block boundaries, so building it costs O(blocks)), otherwise from evaluating the
  mask densely on the device (``create_block_mask``).

Both are cached together by the mask's :attr:`~attnkit.masks.Mask.key` (its description by
value), the shapes, the positions and the device, so a mask rebuilt for every call
(``causal() & ...``) reuses the same ``mask_mod`` object and its compiled code. A mask known
only by its function (a hand-made ``Mask(fn, name)``, a bool tensor) is rebuilt per call; its
compiled code is still reused, since torch.compile guards on the function's code.

``torch.compile`` keeps only ``recompile_limit`` (8 by default) compiled versions of a
function and then falls back *silently* to eager FlexAttention, hundreds of times slower.
The first call here raises that limit (process-wide: torch keeps one setting) to at least
:data:`RECOMPILE_LIMIT`, so that many masks and shapes stay compiled. It is raised once, not
patched around each call: patching dynamo's configuration costs more CPU time than a short
GPU kernel takes.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k``
lengths, ``d``/``d_v`` head dims, ``n_q``/``n_k`` query and key blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional.block_status import FULL, PARTIAL, classify_blocks

# FlexAttention's sparse block size: the granularity at which empty blocks are skipped.
BLOCK = 128
# Compiled versions of flex_attention kept before torch.compile would give up on it.
RECOMPILE_LIMIT = 512
# Block masks (with their mask_mod) kept per process.
_CACHE_SIZE = 64

_block_masks: OrderedDict[Hashable, object] = OrderedDict()
_compiled: Callable | None = None
_limit_raised = False


def flex_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: masks_mod.Mask | None,
    dense: Tensor | None,
    bias: Tensor | None,
    scale: float,
    q_pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    period: int = 0,
    need_lse: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Exact attention on FlexAttention, for validated 4-D inputs.

    Args:
        q: ``[b, h, s_q, d]``; k: ``[b, h_kv, s_k, d]``; v: ``[b, h_kv, s_k, d_v]``.
        mask: the whole mask (causal included), or ``None``.
        dense: a bool tensor ``[b|1, h|1, s_q|1, s_k|1]`` also applied, or ``None``.
        bias: additive float scores ``[b|1, h|1, s_q|1, s_k|1]`` (no gradient), or ``None``.
        scale: score scale.
        q_pos, kv_pos: absolute positions of the rows and keys when they are permuted
            (default: ``arange(s_q) + s_k - s_q`` and ``arange(s_k)``); ``period`` as in
            :func:`attnkit.functional.block_status.spans`.
        need_lse: also return the log-sum-exp (not available from the CPU's compiled Flex).

    Returns:
        ``(out [b, h, s_q, d_v], lse [b, h, s_q] or None)``; rows with nothing allowed get
        zeros and ``lse = -inf``.

    Raises:
        ValueError: gradients or the log-sum-exp asked of FlexAttention on the CPU.
    """
    b, h, s_q, _ = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    if dense is not None:
        expanded = dense.expand(dense.shape[0], dense.shape[1], s_q, s_k)  # [b|1, h|1, s_q, s_k]
        as_mask = masks_mod.from_dense(expanded, reusable=False)
        mask = as_mask if mask is None else mask & as_mask
    block_mask = cached_block_mask(mask, b, h, s_q, s_k, q.device, q_pos, kv_pos, period)
    score_mod = None
    if bias is not None:
        bias_e = bias.expand(b, h, s_q, s_k)  # [b, h, s_q, s_k], a view

        def score_mod(score: Tensor, bi: Tensor, hi: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
            return score + bias_e[bi, hi, qi, ki]

    return _call(q, k, v, score_mod, block_mask, scale, enable_gqa=h != h_kv, need_lse=need_lse)


def _call(
    q: Tensor, k: Tensor, v: Tensor, score_mod, block_mask, scale: float, *, enable_gqa: bool, need_lse: bool
) -> tuple[Tensor, Tensor | None]:
    from torch.nn.attention import flex_attention as fa

    compiled = compiled_flex()
    if q.device.type == "cpu":
        # torch's compiled FlexAttention on the CPU is inference only.
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError(
                "engine='flex' has no backward on the CPU (torch's CPU FlexAttention is forward only); "
                "use engine='blockwise' or 'auto' for inputs that need gradients"
            )
        if need_lse:
            raise ValueError(
                "engine='flex' cannot return the log-sum-exp on the CPU (torch's CPU FlexAttention "
                "does not compute it); use engine='blockwise' or 'auto' with return_lse=True"
            )
    kwargs = {"score_mod": score_mod, "block_mask": block_mask, "scale": scale, "enable_gqa": enable_gqa}
    if not need_lse:
        return compiled(q, k, v, **kwargs), None
    if hasattr(fa, "AuxRequest"):
        out, aux = compiled(q, k, v, return_aux=fa.AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    return compiled(q, k, v, return_lse=True, **kwargs)


def compiled_flex() -> Callable:
    """``flex_attention`` under ``torch.compile``, created on first use (one per process,
    so every call shares its compiled code)."""
    global _compiled
    raise_recompile_limit()
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def raise_recompile_limit() -> None:
    """Raise torch.compile's recompile limits to at least :data:`RECOMPILE_LIMIT` (once per
    process; the config names differ between torch releases)."""
    global _limit_raised
    if _limit_raised:
        return
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
    _limit_raised = True


def cached_block_mask(
    mask: masks_mod.Mask | None,
    b: int,
    h: int,
    s_q: int,
    s_k: int,
    device: torch.device,
    q_pos: Tensor | None,
    kv_pos: Tensor | None,
    period: int,
):
    """The ``BlockMask`` (with its ``mask_mod``) of ``mask`` for these sizes, built once
    and kept while its key is among the last :data:`_CACHE_SIZE` used.

    Args:
        mask: the whole mask, or ``None`` for every pair.
        b, h: batch size and query heads (a mask that varies over neither gets one mask
            for all).
        s_q, s_k: query and key lengths; query row ``i`` is at position ``i + s_k - s_q``.
        device: where the kernel runs.
        q_pos, kv_pos, period: a permuted layout's positions, as in :func:`flex_core`
            (``None``, ``None``, ``0`` for the natural order).

    Returns:
        FlexAttention's ``BlockMask``; a mask known only by its function (no
        :attr:`~attnkit.masks.Mask.key`) is built anew for each call.
    """
    if mask is None:
        mask = masks_mod.full()
    permuted = q_pos is not None or kv_pos is not None
    key: Hashable | None = None
    if mask.key is not None and not permuted:
        key = (mask.key, b if mask.batch_size else 1, h if mask.num_heads else 1, s_q, s_k, str(device))
    elif mask.key is not None and permuted and period > 0:
        # A permuted layout is the residue order of sparse_attention: known by its period.
        key = (mask.key, "residues", period, s_q, s_k, str(device))
    if key is not None and key in _block_masks:
        _block_masks.move_to_end(key)
        return _block_masks[key]
    built = _build_block_mask(mask.to(device), b, h, s_q, s_k, device, q_pos, kv_pos, period)
    if key is not None:
        _block_masks[key] = built
        while len(_block_masks) > _CACHE_SIZE:
            _block_masks.popitem(last=False)
    return built


def _build_block_mask(
    mask: masks_mod.Mask,
    b: int,
    h: int,
    s_q: int,
    s_k: int,
    device: torch.device,
    q_pos: Tensor | None,
    kv_pos: Tensor | None,
    period: int,
):
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    fn = mask.fn
    mask_mod: masks_mod.MaskFn
    if q_pos is None and kv_pos is None:
        offset = s_k - s_q

        def shifted(b_idx: Tensor, h_idx: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return fn(b_idx, h_idx, q_idx + offset, kv_idx)

        # Row i at position i: nothing to add in the kernel's inner loop.
        mask_mod = fn if offset == 0 else shifted
        q_pos = torch.arange(s_q, device=device) + offset
        kv_pos = torch.arange(s_k, device=device)
    else:
        q_pos = torch.arange(s_q, device=device) + (s_k - s_q) if q_pos is None else q_pos.to(device)
        kv_pos = torch.arange(s_k, device=device) if kv_pos is None else kv_pos.to(device)
        q_at, kv_at = q_pos, kv_pos

        def at_positions(b_idx: Tensor, h_idx: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return fn(b_idx, h_idx, q_at[q_idx], kv_at[kv_idx])

        mask_mod = at_positions

    if mask.blocks is None:
        return create_block_mask(
            mask_mod,
            B=mask.batch_size and b,
            H=mask.num_heads and h,
            Q_LEN=s_q,
            KV_LEN=s_k,
            device=device,
            BLOCK_SIZE=BLOCK,
        )
    # The exact block test, taken over every batch entry and head (a block partial for one
    # of them is partial for all: the kernel evaluates mask_mod there).
    status = classify_blocks(mask, None, q_pos, kv_pos, BLOCK, BLOCK, period=period)  # [n_q, n_k]
    partial_num, partial_idx = _ordered(status == PARTIAL)
    full_num, full_idx = _ordered(status == FULL)
    return BlockMask.from_kv_blocks(
        partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(s_q, s_k)
    )


def _ordered(kept: Tensor) -> tuple[Tensor, Tensor]:
    """FlexAttention's block lists from a bool ``[n_q, n_k]``: per query block the number of
    kept key blocks ``[1, 1, n_q]`` and their indices first ``[1, 1, n_q, n_k]`` (int32)."""
    num = kept.sum(-1, dtype=torch.int32)  # [n_q]
    order = torch.argsort((~kept).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # kept first
    return num[None, None].contiguous(), order[None, None].contiguous()


def clear_cache() -> None:
    """Forget every cached block mask (compiled code stays with torch.compile)."""
    _block_masks.clear()
