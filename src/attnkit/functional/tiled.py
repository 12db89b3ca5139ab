"""Memory-efficient exact attention: online softmax over key blocks, any mask, any bias.

``tiled_attention`` computes exactly ``softmax(q kᵀ · scale + bias, masked) v`` without
ever holding the ``[s_q, s_k]`` scores of a head. Queries are taken ``block_q`` rows at a
time; for each query block, the key blocks are classified once from the mask:

- **empty**: no pair allowed; skipped, never computed;
- **full**: every pair allowed; computed without evaluating the mask;
- **partial**: the mask is evaluated on that block only (positions as index tensors).

A :class:`~attnkit.masks.Mask` with a block test (:attr:`Mask.blocks`: causal, windows,
documents, padding, global tokens, strided, fixed, and their ``&``/``|``/``~``) is
classified from the block boundaries alone; a mask without one is evaluated densely, one
query block at a time, to classify. Runs of neighbouring key blocks of the same kind go to
one block call (:mod:`attnkit.functional.blockwise`), and the partial
results of a query block are merged through their log-sum-exp.

The backward pass is a custom ``autograd.Function`` that recomputes each block from
``q``, ``k``, ``v``, the output and the log-sum-exp (FlashAttention-2), so memory stays
``O(s · block)`` beyond the inputs, outputs and gradients, forward and backward.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``g = h / h_kv``,
``s_q``/``s_k`` lengths, ``d``/``d_v`` head dims, ``m`` rows of a query block, ``l`` keys of
a run. Grouped-query attention folds the ``g`` query heads that share a key/value head into
the rows of one problem, so k and v are never copied per head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnkit.functional import masks as masks_mod
from attnkit.functional._validate import accepts_single_head, check_bias, check_mask_sizes, check_mask_tensor
from attnkit.functional.block_status import EMPTY, PARTIAL, classify_blocks
from attnkit.functional.blockwise import BlockOp, block_backward, block_forward, lse_dtype, merge, use_fused
from attnkit.functional.engines import Engine, choose_masked_engine
from attnkit.functional.flex import flex_core
from attnkit.functional.records import AttentionResult
from attnkit.functional.scores import resolve_scale

# Largest number of keys per block call for calls that materialise [rows, keys] floats
# (a mask/bias block, or every eager call): bounds the working set.
_MAX_KEYS_MATERIALISED = 1024

Run = tuple[int, int, bool]  # keys k0:k1 in one block call; True: the mask is evaluated on them


@dataclass
class TiledPlan:
    """Which key blocks each query block visits, and how (built once, reused by backward).

    Attributes:
        runs: for query block ``i``, a list of ``(k0, k1, partial)``: keys ``k0:k1`` in one
            block call, evaluating the mask on them when ``partial`` (otherwise every pair
            of the run is allowed).
        status: ``[n_q_blocks, n_k_blocks]`` int8, ``EMPTY``/``PARTIAL``/``FULL``.
    """

    b: int
    h: int
    h_kv: int
    s_q: int
    s_k: int
    block_q: int
    block_k: int
    scale: float
    q_pos: Tensor  # [s_q] absolute position of each query row
    kv_pos: Tensor  # [s_k] absolute position of each key
    mask: masks_mod.Mask | None
    dense: Tensor | None  # bool [b|1, h|1, s_q|1, s_k|1]
    bias_shape: tuple[int, int, int, int] | None
    status: Tensor
    runs: list[list[Run]]
    block_op: BlockOp

    @property
    def kept_fraction(self) -> float:
        """Fraction of (query block, key block) pairs computed."""
        return float((self.status != EMPTY).float().mean()) if self.status.numel() else 0.0


@accepts_single_head
def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: masks_mod.Mask | Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = (256, 128),
    return_lse: bool = False,
    engine: Engine = "auto",
) -> Tensor | AttentionResult:
    """Exact attention in O(s · block) memory, skipping key blocks the mask leaves empty.

    Args:
        q: ``[b, h, s_q, d]`` (or ``[s_q, d]``).
        k: ``[b, h_kv, s_k, d]`` (or ``[s_k, d]``), ``h`` divisible by ``h_kv``.
        v: ``[b, h_kv, s_k, d_v]`` (or ``[s_k, d_v]``).
        mask: a :class:`~attnkit.masks.Mask` (positions absolute: query row ``i`` is at
            ``i + s_k - s_q``) or a bool tensor broadcastable to ``[b, h, s_q, s_k]``;
            ``True`` = may attend.
        bias: additive float scores broadcastable to ``[b, h, s_q, s_k]``; ``-inf`` masks.
            It may require grad.
        causal: also apply the bottom-right causal mask.
        scale: score scale, default ``1/sqrt(d)``.
        block_size: ``(block_q, block_k)`` query rows per step and key-block granularity of
            skipping, or one int for both.
        return_lse: return an :class:`AttentionResult` with ``lse`` ``[b, h, s_q]``
            (``-inf`` on rows with nothing to attend to) and ``weights=None``; feed it to
            :func:`attnkit.functional.weights_on_demand` to inspect weights later.
        engine: ``"blockwise"`` (the schedule described above), ``"flex"`` (compiled
            FlexAttention; ``block_size`` does not apply), or ``"auto"``: Flex on GPUs,
            blockwise on the CPU (see :mod:`attnkit.functional.engines`).

    Returns:
        ``[b, h, s_q, d_v]`` (zeros on fully masked rows), or an :class:`AttentionResult`.

    Raises:
        TypeError, ValueError: as :func:`attnkit.attention` for bad inputs, masks and
            biases; ``ValueError`` for a block size below 1 or an unknown engine.
    """
    out, lse = tiled_core(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=resolve_scale(scale, q.shape[-1]),
        block_size=block_size,
        engine=engine,
        need_lse=return_lse,
    )
    return AttentionResult(out, None, lse) if return_lse else out


def tiled_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: masks_mod.Mask | Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    block_size: int | tuple[int, int] = (256, 128),
    q_pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    period: int = 0,
    engine: Engine = "auto",
    block_op: BlockOp = "auto",
    caller: str = "tiled_attention",
    need_lse: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The kernel behind :func:`tiled_attention` on validated 4-D inputs.

    ``q_pos``/``kv_pos`` give each query row's and key's absolute position (default:
    ``arange(s_q) + s_k - s_q`` and ``arange(s_k)``); a permuted layout passes permuted
    positions, and ``period`` > 0 tells the block tests that a block whose positions share
    their residue mod ``period`` is single-residue (see :class:`attnkit.masks.Span`).
    ``engine`` picks FlexAttention or the blockwise schedule (``caller``, the public function
    called, is named in errors); ``block_op`` the block op of the latter.

    Returns:
        ``(out [b, h, s_q, d_v], lse [b, h, s_q])``; ``lse`` may be ``None`` when
        ``need_lse`` is False.
    """
    if choose_masked_engine(engine, q, v, bias, caller) == "flex":
        mask_obj, dense, _ = resolve_mask(q, k, mask=mask, bias=bias, causal=causal)
        bias4 = None if bias is None else masks_mod.unsqueeze_to_4d(bias)
        return flex_core(
            q,
            k,
            v,
            mask=mask_obj,
            dense=dense,
            bias=bias4,
            scale=scale,
            q_pos=q_pos,
            kv_pos=kv_pos,
            period=period,
            need_lse=need_lse,
        )
    plan = make_plan(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        block_size=block_size,
        q_pos=q_pos,
        kv_pos=kv_pos,
        period=period,
        block_op=block_op,
    )
    bias4 = None if bias is None else masks_mod.unsqueeze_to_4d(bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias4)):
        return _TiledFunction.apply(q, k, v, bias4, plan)
    return plan_forward(plan, q, k, v, bias4)


def make_plan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: masks_mod.Mask | Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    block_size: int | tuple[int, int] = (256, 128),
    q_pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    period: int = 0,
    block_op: BlockOp = "auto",
) -> TiledPlan:
    """Validate the mask and bias, classify every (query block, key block) pair, and group
    the kept key blocks of each query block into runs."""
    b, h, s_q, _ = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    block_q, block_k = (block_size, block_size) if isinstance(block_size, int) else block_size
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    # Blocks longer than the sequences would only pad (and allocate) for nothing.
    block_q, block_k = min(block_q, max(s_q, 1)), min(block_k, max(s_k, 1))
    device = q.device
    mask_obj, dense, bias_shape = resolve_mask(q, k, mask=mask, bias=bias, causal=causal)
    if q_pos is None:
        q_pos = torch.arange(s_q, device=device) + (s_k - s_q)
    if kv_pos is None:
        kv_pos = torch.arange(s_k, device=device)

    status = classify_blocks(mask_obj, dense, q_pos, kv_pos, block_q, block_k, period=period)
    plan = TiledPlan(
        b=b,
        h=h,
        h_kv=h_kv,
        s_q=s_q,
        s_k=s_k,
        block_q=block_q,
        block_k=block_k,
        scale=scale,
        q_pos=q_pos,
        kv_pos=kv_pos,
        mask=mask_obj,
        dense=dense,
        bias_shape=bias_shape,
        status=status,
        runs=[],
        block_op=block_op,
    )
    # Calls that build a [rows, keys] bias block, and every eager call, are cut short.
    materialise_all = not use_fused(q, v, block_op) or bias is not None
    plan.runs = _runs(status, block_k, s_k, materialise_all=materialise_all)
    return plan


def resolve_mask(
    q: Tensor, k: Tensor, *, mask: masks_mod.Mask | Tensor | None, bias: Tensor | None, causal: bool
) -> tuple[masks_mod.Mask | None, Tensor | None, tuple[int, int, int, int] | None]:
    """Validate ``mask`` and ``bias`` against q and k, and fold ``causal`` into the mask.

    Returns:
        ``(mask, dense, bias_shape)``: the whole :class:`~attnkit.masks.Mask` on q's device
        (or ``None``), a bool tensor mask ``[b|1, h|1, s_q|1, s_k|1]`` (or ``None``), and the
        bias's shape as 4-D (or ``None``).
    """
    b, h, s_q, _ = q.shape
    s_k = k.shape[2]
    mask_obj: masks_mod.Mask | None = None
    dense: Tensor | None = None
    if isinstance(mask, masks_mod.Mask):
        check_mask_sizes(mask, b=b, h=h)
        if mask.shape is not None and mask.shape != (s_q, s_k):
            raise ValueError(f"mask {mask.name} is defined for (s_q, s_k) = {mask.shape}, got ({s_q}, {s_k})")
        mask_obj = mask.to(q.device)
    elif isinstance(mask, Tensor):
        dense = check_mask_tensor(mask, b=b, h=h, s_q=s_q, s_k=s_k, device=q.device)
        dense = masks_mod.unsqueeze_to_4d(dense)
    elif mask is not None:
        raise TypeError(f"mask must be an attnkit.masks.Mask or a bool tensor, got {type(mask).__name__}")
    if causal:
        mask_obj = masks_mod.causal() if mask_obj is None else masks_mod.causal() & mask_obj
    bias_shape: tuple[int, int, int, int] | None = None
    if bias is not None:
        check_bias(bias, q, b=b, h=h, s_q=s_q, s_k=s_k)
        n0, n1, n2, n3 = masks_mod.unsqueeze_to_4d(bias).shape
        bias_shape = (n0, n1, n2, n3)
    return mask_obj, dense, bias_shape


def _runs(status: Tensor, block_k: int, s_k: int, *, materialise_all: bool) -> list[list[Run]]:
    """Group the kept key blocks of each query block into block calls.

    Neighbouring blocks of the same kind form a segment, one call, cut so that calls which
    materialise ``[rows, keys]`` stay within ``_MAX_KEYS_MATERIALISED`` keys. (Merging a
    partial segment with its full neighbours into one masked call was measured on the CPU
    with a document + causal mask at 16K: no gain, 0.74 s against 0.70 s.)"""
    nq, nk = status.shape
    if nq == 0:
        return []
    st = status.to(torch.int16).cpu()
    edge = torch.ones(nq, nk, dtype=torch.bool)
    edge[:, 1:] = st[:, 1:] != st[:, :-1]
    starts = edge.nonzero().tolist()  # [(row, col)] where a segment of equal status begins
    cut = max(block_k, _MAX_KEYS_MATERIALISED // block_k * block_k)
    runs: list[list[Run]] = [[] for _ in range(nq)]
    for idx, (row, col) in enumerate(starts):
        end = starts[idx + 1][1] if idx + 1 < len(starts) and starts[idx + 1][0] == row else nk
        kind = int(st[row, col])
        if kind == EMPTY:
            continue
        k0, k1, partial = col * block_k, min(end * block_k, s_k), kind == PARTIAL
        step = cut if (partial or materialise_all) else k1 - k0
        for c0 in range(k0, k1, step):
            runs[row].append((c0, min(c0 + step, k1), partial))
    return runs


# ---------------------------------------------------------------------------------------
# Forward and backward over the plan.
# ---------------------------------------------------------------------------------------


def _allowed_range(plan: TiledPlan, r0: int, r1: int, a: int, b: int) -> Tensor:
    """The mask (and bool tensor mask) on rows ``r0:r1`` and keys ``a:b``:
    ``[b|1, h|1, m, b - a]`` bool."""
    m, n_keys = r1 - r0, b - a
    allowed = None
    if plan.mask is not None:
        allowed = plan.mask.evaluate(plan.q_pos[r0:r1], plan.kv_pos[a:b])  # [b|1, h|1, m, n_keys]
    if plan.dense is not None:
        d = plan.dense
        d = d[:, :, r0:r1] if d.shape[2] > 1 else d
        d = d[:, :, :, a:b] if d.shape[3] > 1 else d
        allowed = d if allowed is None else allowed & d
    assert allowed is not None, "a partial block needs a mask"
    return allowed.expand(allowed.shape[0], allowed.shape[1], m, n_keys)


def _block_bias(
    plan: TiledPlan, bias4: Tensor | None, r0: int, r1: int, c0: int, c1: int, partial: bool, dtype: torch.dtype
) -> tuple[Tensor | None, Tensor | None]:
    """Additive float bias of one call in grouped layout ``[b|1, h_kv|1, g*m, l]`` (or None),
    and, when known cheaply, which of its rows allow some key ``[b|1, h_kv|1, g*m]``."""
    if not partial and bias4 is None:
        return None, None
    m, n_keys, g = r1 - r0, c1 - c0, plan.h // plan.h_kv
    device = plan.q_pos.device
    allowed = _allowed_range(plan, r0, r1, c0, c1) if partial else None  # [b|1, h|1, m, l]
    neg_inf = torch.full((), float("-inf"), dtype=dtype, device=device)
    alive = None
    if bias4 is not None:
        bb = bias4[:, :, r0:r1] if bias4.shape[2] > 1 else bias4
        bb = bb[:, :, :, c0:c1] if bb.shape[3] > 1 else bb
        bb = bb.to(dtype)
        out = bb if allowed is None else torch.where(allowed, bb, neg_inf)
    else:
        assert allowed is not None
        alive = allowed.any(-1)  # [b|1, h|1, m]
        out = torch.where(allowed, torch.zeros((), dtype=dtype, device=device), neg_inf)
    out = out.expand(out.shape[0], out.shape[1], m, n_keys)
    if alive is not None:
        alive = _group_rows(alive.expand(alive.shape[0], alive.shape[1], m), plan.h_kv, g)
    return _group_rows(out, plan.h_kv, g), alive


def _group_rows(x: Tensor, h_kv: int, g: int) -> Tensor:
    """``[n0, 1|h, m, ...]`` to the grouped layout ``[n0, 1|h_kv, g*m, ...]``."""
    n0, n1, m = x.shape[:3]
    rest = tuple(x.shape[3:])
    if n1 == 1:
        # Same for every head: repeat over the g heads folded into the rows.
        return x.unsqueeze(2).expand(n0, 1, g, m, *rest).reshape(n0, 1, g * m, *rest) if g > 1 else x
    return x.reshape(n0, h_kv, g * m, *rest)


def _rows(x: Tensor, plan: TiledPlan, r0: int, r1: int) -> Tensor:
    """Rows ``r0:r1`` of ``[b, h, s, e]`` in grouped layout ``[b, h_kv, g*m, e]``."""
    b, _, s, e = x.shape
    g = plan.h // plan.h_kv
    return x.view(b, plan.h_kv, g, s, e)[:, :, :, r0:r1].reshape(b, plan.h_kv, g * (r1 - r0), e)


def plan_forward(plan: TiledPlan, q: Tensor, k: Tensor, v: Tensor, bias4: Tensor | None) -> tuple[Tensor, Tensor]:
    """Run a plan's forward pass (no autograd): every run of every query block, merged.

    Args:
        plan: from :func:`make_plan` on these inputs (or inputs of the same shapes).
        q: ``[b, h, s_q, d]``; k: ``[b, h_kv, s_k, d]``; v: ``[b, h_kv, s_k, d_v]``.
        bias4: the additive bias as 4-D ``[b|1, h|1, s_q|1, s_k|1]``, or ``None``.

    Returns:
        ``(out [b, h, s_q, d_v], lse [b, h, s_q])``: zeros and ``-inf`` on rows the plan
        leaves without a key; :func:`attnkit.functional.blockwise.merge` combines them with
        the results of other key sets (as ring attention does).
    """
    b, h, h_kv, s_q = plan.b, plan.h, plan.h_kv, plan.s_q
    g, d_v = h // h_kv, v.shape[-1]
    out = q.new_zeros(b, h, s_q, d_v)
    lse = torch.full((b, h, s_q), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    out_g, lse_g = out.view(b, h_kv, g, s_q, d_v), lse.view(b, h_kv, g, s_q)
    for i, runs in enumerate(plan.runs):
        if not runs:
            continue
        r0, r1 = i * plan.block_q, min(s_q, (i + 1) * plan.block_q)
        m = r1 - r0
        q_i = _rows(q, plan, r0, r1)  # [b, h_kv, g*m, d]
        acc_o, acc_l = None, None
        for c0, c1, partial in runs:
            bias_blk, alive = _block_bias(plan, bias4, r0, r1, c0, c1, partial, q.dtype)
            o, l_ = block_forward(q_i, k[:, :, c0:c1], v[:, :, c0:c1], bias_blk, plan.scale, plan.block_op, alive)
            acc_o, acc_l = (o, l_) if acc_o is None or acc_l is None else merge(acc_o, acc_l, o, l_)
        assert acc_o is not None and acc_l is not None  # runs is not empty
        out_g[:, :, :, r0:r1] = acc_o.view(b, h_kv, g, m, d_v)
        lse_g[:, :, :, r0:r1] = acc_l.view(b, h_kv, g, m)
    return out, lse


def plan_backward(
    plan: TiledPlan,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias4: Tensor | None,
    out: Tensor,
    lse: Tensor,
    need_dbias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of a plan's call, given the *final* ``out`` and ``lse`` of its rows (which
    may hold the keys of other plans too: the gradients of separate key sets add up).

    Args:
        plan, q, k, v, bias4: as in :func:`plan_forward`.
        dout: the output's gradient ``[b, h, s_q, d_v]``.
        out: ``[b, h, s_q, d_v]``; lse: ``[b, h, s_q]``, the rows' final results.
        need_dbias: also compute the gradient of ``bias4``.

    Returns:
        ``(dq, dk, dv, dbias)``, ``dbias`` in ``bias4``'s shape or ``None``.
    """
    b, h, h_kv = plan.b, plan.h, plan.h_kv
    g = h // h_kv
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    dbias = None
    if need_dbias:
        assert bias4 is not None
        dbias = torch.zeros(
            bias4.shape, dtype=torch.float64 if bias4.dtype == torch.float64 else torch.float32, device=q.device
        )
    dq_g = dq.view(b, h_kv, g, plan.s_q, q.shape[-1])
    for i, runs in enumerate(plan.runs):
        if not runs:
            continue
        r0, r1 = i * plan.block_q, min(plan.s_q, (i + 1) * plan.block_q)
        m = r1 - r0
        q_i, do_i, o_i = _rows(q, plan, r0, r1), _rows(dout, plan, r0, r1), _rows(out, plan, r0, r1)
        lse_i = lse.view(b, h_kv, g, plan.s_q)[:, :, :, r0:r1].reshape(b, h_kv, g * m)
        dq_i = None
        for c0, c1, partial in runs:
            bias_blk, _ = _block_bias(plan, bias4, r0, r1, c0, c1, partial, q.dtype)
            dq_p, dk_p, dv_p, ds = block_backward(
                do_i,
                q_i,
                k[:, :, c0:c1],
                v[:, :, c0:c1],
                o_i,
                lse_i,
                bias_blk,
                plan.scale,
                need_dbias=need_dbias,
                op=plan.block_op,
            )
            dq_i = dq_p if dq_i is None else dq_i.add_(dq_p)
            dk[:, :, c0:c1] += dk_p
            dv[:, :, c0:c1] += dv_p
            if dbias is not None:
                assert ds is not None
                _accumulate_dbias(dbias, ds.reshape(b, h, m, c1 - c0), r0, r1, c0, c1)
        assert dq_i is not None  # runs is not empty
        dq_g[:, :, :, r0:r1] = dq_i.view(b, h_kv, g, m, q.shape[-1])
    return dq, dk, dv, (None if dbias is None or bias4 is None else dbias.to(bias4.dtype))


def _accumulate_dbias(dbias: Tensor, ds: Tensor, r0: int, r1: int, c0: int, c1: int) -> None:
    """Add the score gradient of one call ``[b, h, m, l]`` into ``dbias`` (bias's shape),
    summing over the dims along which the bias is broadcast."""
    for dim in range(4):
        if dbias.shape[dim] == 1 and ds.shape[dim] != 1:
            ds = ds.sum(dim, keepdim=True)
    target = dbias[:, :, r0:r1] if dbias.shape[2] > 1 else dbias
    target = target[:, :, :, c0:c1] if dbias.shape[3] > 1 else target
    target += ds.to(dbias.dtype)


class _TiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias4: Tensor | None, plan: TiledPlan):
        out, lse = plan_forward(plan, q, k, v, bias4)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, bias4, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor, _dlse: Tensor):
        q, k, v, bias4, out, lse = ctx.saved_tensors
        need_dbias = bias4 is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = plan_backward(ctx.plan, dout.contiguous(), q, k, v, bias4, out, lse, need_dbias)
        return dq, dk, dv, dbias, None
