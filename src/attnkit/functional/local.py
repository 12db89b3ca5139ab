"""Local (sliding-window) attention: each query attends to the keys within a window around
its own position. Time and memory O(s · w): no ``[s_q, s_k]`` tensor, forward or backward.

How: queries are cut into blocks of ``bs`` rows. Block ``j`` needs the keys from
``bs·j − left`` to ``bs·j + bs − 1 + right`` — one window of ``W = bs + left + right``
keys (rounded up to whole blocks). All windows are *views* of one flat key buffer
(``as_strided`` with a step of ``bs`` rows, no copy), so one batched block call
computes every block of every head at once: ``[blocks, rows, d] × [blocks, W, d]``. A fixed
band mask ``[bs, W]`` keeps each row's own window. The few blocks whose window runs past
either end of the sequence are recomputed with their exact mask in a second, small call.

The backward pass recomputes the same blocks from the saved log-sum-exp (custom
``autograd.Function``); the key/value gradients of overlapping windows are summed back with
``W / bs`` strided adds.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``g = h / h_kv``,
``s_q``/``s_k`` lengths, ``d``/``d_v`` head dims, ``bs`` block rows, ``W`` window keys,
``P`` blocks per head in the flat layout, ``B = b · h_kv · P`` blocks in all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional._validate import accepts_single_head
from attnkit.functional.blockwise import BlockOp, block_backward, block_forward, lse_dtype, use_fused
from attnkit.functional.engines import Engine, choose_masked_engine
from attnkit.functional.flex import flex_core
from attnkit.functional.recompute import recomputed_attention
from attnkit.functional.records import AttentionResult
from attnkit.functional.scores import resolve_scale

# Bytes of [rows, W] scores (eager block op) or of key-window gradients (backward) per block
# call: bounds the working set. The fused forward materialises neither and runs in one call.
_CHUNK_BYTES = 32 << 20


@accepts_single_head
def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int | tuple[int, int],
    causal: bool = False,
    scale: float | None = None,
    block_size: int | None = None,
    return_lse: bool = False,
    engine: Engine = "auto",
) -> Tensor | AttentionResult:
    """Sliding-window attention: the query at position ``i`` attends to keys in
    ``[i - left, i + right]``.

    Positions are absolute as everywhere in attnkit: query row ``i`` sits at ``i + s_k - s_q``.
    The result equals ``attention(q, k, v, mask=masks.sliding_window(left, right))``
    (and ``& causal``), computed in O(s · w).

    Args:
        q: ``[b, h, s_q, d]`` (or ``[s_q, d]``).
        k: ``[b, h_kv, s_k, d]`` (or ``[s_k, d]``), ``h`` divisible by ``h_kv``.
        v: ``[b, h_kv, s_k, d_v]`` (or ``[s_k, d_v]``).
        window: ``w`` — keys ``[i - w, i]`` when ``causal``, ``[i - w, i + w]`` otherwise —
            or ``(left, right)``.
        causal: no keys after the query (``right`` must then be 0).
        scale: score scale, default ``1/sqrt(d)``.
        block_size: query rows per block (default: chosen from the window).
        return_lse: return an :class:`AttentionResult` with the log-sum-exp ``[b, h, s_q]``.
        engine: ``"blockwise"`` (the strided-window schedule described above), ``"flex"``
            (compiled FlexAttention with a sliding-window block mask; ``block_size`` does not
            apply), or ``"auto"``: Flex on GPUs, blockwise on the CPU.

    Returns:
        ``[b, h, s_q, d_v]`` (or ``[s_q, d_v]``); rows whose window holds no key are zeros.

    Raises:
        TypeError, ValueError: bad tensors (as :func:`attnkit.attention`), a negative window,
            a right-hand window with ``causal=True``, a block size below 1.
    """
    left, right = _window(window, causal)
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"block_size must be an int >= 1 or None, got {block_size!r}")
    scale_f = resolve_scale(scale, q.shape[-1])
    if choose_masked_engine(engine, q, v, None, "local_attention") == "flex":
        window_mask = masks_mod.sliding_window(left, right)
        out, lse = flex_core(q, k, v, mask=window_mask, dense=None, bias=None, scale=scale_f, need_lse=return_lse)
    else:
        out, lse = local_core(q, k, v, left=left, right=right, scale=scale_f, block_size=block_size)
    return AttentionResult(out, None, lse) if return_lse else out


def _window(window: int | tuple[int, int], causal: bool) -> tuple[int, int]:
    if isinstance(window, tuple) and len(window) == 2:
        left, right = window
    elif isinstance(window, int) and not isinstance(window, bool):
        left, right = window, (0 if causal else window)
    else:
        raise TypeError(f"window must be an int or a (left, right) pair of ints, got {window!r}")
    for name, value in (("left", left), ("right", right)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"window {name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"window must be >= 0 on both sides, got (left, right) = ({left}, {right})")
    if causal and right > 0:
        raise ValueError(
            f"causal local attention sees no keys to the right, got window (left, right) = ({left}, {right})"
        )
    return left, right


def default_block_size(left: int, right: int, s_q: int) -> int:
    """Query rows per block: about a quarter of the window, a power of two in [16, 128],
    and no more than the queries need."""
    span = max(left + right, 1)
    bs = 1 << max(4, min(7, int(math.log2(span)) - 2))
    return max(1, min(bs, 1 << max(0, math.ceil(math.log2(max(s_q, 1))))))


@dataclass(frozen=True)
class _Geometry:
    b: int
    h: int
    h_kv: int
    s_q: int
    s_k: int
    left: int
    right: int
    bs: int
    scale: float
    block_op: BlockOp

    @property
    def g(self) -> int:
        return self.h // self.h_kv

    @property
    def offset(self) -> int:  # absolute position of query row 0
        return self.s_k - self.s_q

    @property
    def n_left(self) -> int:
        return -(-self.left // self.bs)

    @property
    def n_right(self) -> int:
        return -(-self.right // self.bs)

    @property
    def width(self) -> int:  # W
        return (self.n_left + 1 + self.n_right) * self.bs

    @property
    def n_blocks(self) -> int:  # real query blocks per head
        return -(-self.s_q // self.bs)

    @property
    def per_head(self) -> int:  # P: real blocks plus phantom ones that keep the stride uniform
        return self.n_blocks + self.n_left + self.n_right

    @property
    def total(self) -> int:  # B
        return self.b * self.h_kv * self.per_head

    @property
    def key_front(self) -> int:  # buffer row 0 holds key position key_front
        return self.offset - self.n_left * self.bs


def local_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    block_size: int | None = None,
    block_op: BlockOp = "auto",
) -> tuple[Tensor, Tensor]:
    """Local attention on validated 4-D inputs; returns ``(out, lse)``."""
    b, h, s_q, _ = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    # A window wider than the sequence changes nothing; clamp it so the blocks stay small.
    left = min(left, max(s_k - 1 + max(s_q - s_k, 0), 0))
    right = min(right, max(s_k + s_q, 0))
    # More rows per block than there are queries would only pad (and allocate) for nothing.
    bs = min(block_size or default_block_size(left, right, s_q), max(s_q, 1))
    geo = _Geometry(b, h, h_kv, s_q, s_k, left, right, bs, scale, block_op)
    if s_q == 0 or s_k == 0:
        out = q.new_zeros(b, h, s_q, v.shape[-1])
        return out, torch.full((b, h, s_q), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    return recomputed_attention(_forward, _backward, geo, q, k, v)


# ---------------------------------------------------------------------------------------
# Layout: queries as [B, 1, g*bs, d] blocks, keys as one flat buffer with strided windows.
# ---------------------------------------------------------------------------------------


def _query_blocks(x: Tensor, geo: _Geometry) -> Tensor:
    """``[b, h, s_q, e]`` to ``[B, 1, g*bs, e]`` (zero rows for padding and phantom blocks),
    in one pass over ``x``."""
    e = x.shape[-1]
    buf = x.new_empty(geo.b, geo.h_kv, geo.per_head, geo.g, geo.bs, e)
    view = buf.permute(0, 1, 3, 2, 4, 5)  # [b, h_kv, g, P, bs, e]
    grouped = x.view(geo.b, geo.h_kv, geo.g, geo.s_q, e)
    whole, rest = divmod(geo.s_q, geo.bs)
    view[:, :, :, :whole] = grouped[:, :, :, : whole * geo.bs].view(geo.b, geo.h_kv, geo.g, whole, geo.bs, e)
    if rest:
        view[:, :, :, whole, :rest] = grouped[:, :, :, whole * geo.bs :]
        view[:, :, :, whole, rest:] = 0
    view[:, :, :, whole + (1 if rest else 0) :] = 0  # phantom blocks: zeros, so no NaN can leak
    return buf.view(geo.total, 1, geo.g * geo.bs, e)


def _from_query_blocks(x: Tensor, geo: _Geometry) -> Tensor:
    """Inverse of :func:`_query_blocks` (``[B, 1, g*bs, ...]`` to ``[b, h, s_q, ...]``); a
    view (not contiguous) when ``g == 1``."""
    rest = tuple(x.shape[3:])
    if geo.g == 1:
        return x.view(geo.b, geo.h, geo.per_head * geo.bs, *rest)[:, :, : geo.s_q]
    x = x.view(geo.b, geo.h_kv, geo.per_head, geo.g, geo.bs, *rest)[:, :, : geo.n_blocks]
    x = x.permute(0, 1, 3, 2, 4, *range(5, 5 + len(rest)))
    return x.reshape(geo.b, geo.h, geo.n_blocks * geo.bs, *rest)[:, :, : geo.s_q]


def _key_pads(geo: _Geometry) -> tuple[int, int]:
    front = -geo.key_front  # negative: crop keys no query can see
    back = geo.key_front + geo.per_head * geo.bs - geo.s_k
    return front, back


def _key_buffer(x: Tensor, geo: _Geometry) -> Tensor:
    """``[b, h_kv, s_k, e]`` to the flat buffer ``[(B + W/bs - 1) * bs, e]``: head by head,
    key positions ``key_front .. key_front + P*bs - 1`` (zeros outside the sequence)."""
    e = x.shape[-1]
    rows = geo.per_head * geo.bs
    buf = x.new_empty(geo.total * geo.bs + geo.width - geo.bs, e)
    heads = buf[: geo.total * geo.bs].view(geo.b, geo.h_kv, rows, e)
    lo, hi = max(0, geo.key_front), min(geo.s_k, geo.key_front + rows)  # key positions held
    heads[:, :, : max(0, lo - geo.key_front)].zero_()
    heads[:, :, max(0, hi - geo.key_front) :].zero_()
    if hi > lo:
        heads[:, :, lo - geo.key_front : hi - geo.key_front] = x[:, :, lo:hi]
    buf[geo.total * geo.bs :].zero_()
    return buf


def _from_key_buffer(x: Tensor, geo: _Geometry) -> Tensor:
    """Gradient of :func:`_key_buffer`: back to ``[b, h_kv, s_k, e]``."""
    e = x.shape[-1]
    x = x[: geo.total * geo.bs].view(geo.b, geo.h_kv, geo.per_head * geo.bs, e)
    front, back = _key_pads(geo)
    if front >= 0 and back >= 0:  # the buffer holds every key: a view is enough
        return x[:, :, front : front + geo.s_k]
    return F.pad(x, (0, 0, -front, -back))


def _windows(buf: Tensor, geo: _Geometry) -> Tensor:
    """Every block's key window as a view ``[B, 1, W, e]`` of the flat buffer (no copy)."""
    e = buf.shape[-1]
    return buf.as_strided((geo.total, 1, geo.width, e), (geo.bs * e, geo.bs * e, e, 1), buf.storage_offset())


def _band(geo: _Geometry, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[g*bs, W]`` bool: row ``r`` of a block may see window column ``c``."""
    r = torch.arange(geo.bs, device=device).view(-1, 1)
    c = torch.arange(geo.width, device=device).view(1, -1)
    rel = c - geo.n_left * geo.bs - r  # key position minus query position
    band = (rel >= -geo.left) & (rel <= geo.right)
    return band.repeat(geo.g, 1)


def _edges(geo: _Geometry, device: torch.device) -> tuple[Tensor, Tensor]:
    """Blocks whose window runs past either end of the keys: flat indices ``[E]`` (head by
    head, ``e`` per head) and the exact masks of one head's ``[e, 1, g*bs, W]`` (bool; the
    mask of flat edge ``i`` is entry ``i % e``)."""
    j = torch.arange(geo.n_blocks, device=device)
    first_row_pos = j * geo.bs + geo.offset
    last_row_pos = torch.clamp(j * geo.bs + geo.bs - 1, max=geo.s_q - 1) + geo.offset
    is_edge = (first_row_pos - geo.left < 0) | (last_row_pos + geo.right > geo.s_k - 1)
    j_edge = j[is_edge]  # [e]
    heads = torch.arange(geo.b * geo.h_kv, device=device)
    flat = (heads.view(-1, 1) * geo.per_head + j_edge.view(1, -1)).reshape(-1)  # [E]
    key_pos = geo.key_front + j_edge.view(-1, 1) * geo.bs + torch.arange(geo.width, device=device).view(1, -1)
    valid = (key_pos >= 0) & (key_pos < geo.s_k)  # [e, W]
    allowed = _band(geo, torch.bool, device).unsqueeze(0) & valid.unsqueeze(1)  # [e, g*bs, W]
    return flat, allowed.unsqueeze(1)


def _additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), float("-inf"), dtype=dtype, device=allowed.device))


def _chunk(geo: _Geometry, itemsize: int) -> int:
    per_block = geo.g * geo.bs * geo.width * itemsize
    return max(1, _CHUNK_BYTES // per_block)


# ---------------------------------------------------------------------------------------
# Forward and backward.
# ---------------------------------------------------------------------------------------


def _forward_flat(geo: _Geometry, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(out_blocks [B, 1, g*bs, d_v], lse_blocks [B, 1, g*bs], edge_flat [E])``."""
    qb = _query_blocks(q, geo)
    kw, vw = _windows(_key_buffer(k, geo), geo), _windows(_key_buffer(v, geo), geo)
    band = _additive(_band(geo, torch.bool, q.device), q.dtype).view(1, 1, geo.g * geo.bs, geo.width)
    alive = torch.ones((), dtype=torch.bool, device=q.device)  # every row of the band sees a key
    step = _chunk(geo, q.element_size())
    if use_fused(qb, vw, geo.block_op):
        out, lse = block_forward(qb, kw, vw, band, geo.scale, geo.block_op, alive)
    else:
        out = q.new_empty(geo.total, 1, geo.g * geo.bs, v.shape[-1])
        lse = q.new_empty(geo.total, 1, geo.g * geo.bs, dtype=lse_dtype(q.dtype))
        for c0 in range(0, geo.total, step):
            c1 = min(geo.total, c0 + step)
            out[c0:c1], lse[c0:c1] = block_forward(
                qb[c0:c1], kw[c0:c1], vw[c0:c1], band, geo.scale, geo.block_op, alive
            )
    flat, allowed = _edges(geo, q.device)
    for c0 in range(0, flat.numel(), step):
        idx = flat[c0 : c0 + step]
        bias = _additive(allowed[torch.arange(c0, c0 + idx.numel(), device=q.device) % allowed.shape[0]], q.dtype)
        o, l_ = block_forward(qb[idx], kw[idx], vw[idx], bias, geo.scale, geo.block_op)
        out[idx], lse[idx] = o, l_
    return out, lse, flat


def _forward(geo: _Geometry, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    out, lse, _ = _forward_flat(geo, q, k, v)
    return _from_query_blocks(out, geo), _from_query_blocks(lse, geo)


def _add_windows(buf: Tensor, grad_windows: Tensor, c0: int, geo: _Geometry) -> None:
    """Sum the gradients of windows ``c0 ..`` ``[n, 1, W, e]`` into the flat buffer."""
    n, e = grad_windows.shape[0], grad_windows.shape[-1]
    blocks = buf.view(-1, geo.bs, e)
    per = geo.width // geo.bs
    parts = grad_windows.view(n, per, geo.bs, e)
    for t in range(per):
        blocks[c0 + t : c0 + t + n] += parts[:, t]


def _backward(
    geo: _Geometry, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    qb = _query_blocks(q, geo)
    kbuf, vbuf = _key_buffer(k, geo), _key_buffer(v, geo)
    kw, vw = _windows(kbuf, geo), _windows(vbuf, geo)
    dob, ob = _query_blocks(dout, geo), _query_blocks(out, geo)
    lseb = _query_blocks(lse.unsqueeze(-1), geo).squeeze(-1)
    flat, allowed = _edges(geo, q.device)
    edge_inputs = (dob[flat], lseb[flat])
    # Edge blocks are done apart with their exact mask: silence them in the main pass.
    dob[flat] = 0
    lseb[flat] = float("inf")
    band = _additive(_band(geo, torch.bool, q.device), q.dtype).view(1, 1, geo.g * geo.bs, geo.width)
    dqb = torch.empty_like(qb)
    dkbuf, dvbuf = torch.zeros_like(kbuf), torch.zeros_like(vbuf)
    step = _chunk(geo, q.element_size())
    for c0 in range(0, geo.total, step):
        c1 = min(geo.total, c0 + step)
        dq, dkw, dvw, _ = block_backward(
            dob[c0:c1],
            qb[c0:c1],
            kw[c0:c1],
            vw[c0:c1],
            ob[c0:c1],
            lseb[c0:c1],
            band,
            geo.scale,
            op=geo.block_op,
        )
        dqb[c0:c1] = dq
        _add_windows(dkbuf, dkw, c0, geo)
        _add_windows(dvbuf, dvw, c0, geo)
    offsets = torch.arange(geo.width, device=q.device)
    for c0 in range(0, flat.numel(), step):
        idx = flat[c0 : c0 + step]
        bias = _additive(allowed[torch.arange(c0, c0 + idx.numel(), device=q.device) % allowed.shape[0]], q.dtype)
        do_e, lse_e = edge_inputs[0][c0 : c0 + step], edge_inputs[1][c0 : c0 + step]
        dq, dkw, dvw, _ = block_backward(
            do_e, qb[idx], kw[idx], vw[idx], ob[idx], lse_e, bias, geo.scale, op=geo.block_op
        )
        dqb[idx] = dq
        rows = (idx.view(-1, 1) * geo.bs + offsets.view(1, -1)).reshape(-1)
        dkbuf.index_add_(0, rows, dkw.reshape(-1, dkw.shape[-1]))
        dvbuf.index_add_(0, rows, dvw.reshape(-1, dvw.shape[-1]))
    return _from_query_blocks(dqb, geo), _from_key_buffer(dkbuf, geo), _from_key_buffer(dvbuf, geo)


def scores_computed(
    s_q: int, s_k: int, *, window: int | tuple[int, int], causal: bool = False, block_size: int | None = None
) -> dict[str, int]:
    """How many query-key scores local attention needs and computes, against full attention.

    Returns:
        ``{"allowed": pairs inside the windows, "computed": scores the blocked kernel
        evaluates (band padding included), "full": s_q * s_k}``.
    """
    left, right = _window(window, causal)
    offset = s_k - s_q
    pos = torch.arange(s_q) + offset
    allowed = (torch.clamp(pos + right, max=s_k - 1) - torch.clamp(pos - left, min=0) + 1).clamp(min=0).sum()
    left_c = min(left, max(s_k - 1 + max(s_q - s_k, 0), 0))
    right_c = min(right, s_k + s_q)
    bs = block_size or default_block_size(left_c, right_c, s_q)
    geo = _Geometry(1, 1, 1, s_q, s_k, left_c, right_c, bs, 1.0, "auto")
    return {"allowed": int(allowed), "computed": geo.n_blocks * bs * geo.width, "full": s_q * s_k}
