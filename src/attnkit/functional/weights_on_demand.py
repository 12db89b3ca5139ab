"""Attention weights on demand: recompute exact weights for chosen heads, query rows and
keys from ``q``, ``k`` and the log-sum-exp, a chunk of rows at a time.

The memory-efficient kernels (:func:`~attnkit.functional.tiled_attention`,
:func:`~attnkit.functional.local_attention`, :func:`~attnkit.functional.sparse_attention`)
never hold the ``[s_q, s_k]`` weights; with ``return_lse=True`` they return the log-sum-exp
of every row, and any weight is then ``exp(q·k · scale + bias − lse)`` — one dot product,
no softmax over the row. So inspecting head 3, rows 1000–1010 of a 32K-token sequence costs
``11 × 32K`` floats, not ``32K × 32K`` per head.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q``/``s_k``
lengths, ``d`` head dim; ``n_h``, ``n_r``, ``n_k`` the chosen heads, rows and keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional._validate import check_inputs
from attnkit.functional.indices import normalize_indices
from attnkit.functional.scores import resolve_scale
from attnkit.functional.tiled import resolve_mask

Index = slice | Sequence[int] | Tensor | None


def weights_on_demand(
    q: Tensor,
    k: Tensor,
    lse: Tensor | None = None,
    *,
    heads: Index = None,
    rows: Index = None,
    keys: Index = None,
    mask: masks_mod.Mask | Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    dtype: torch.dtype | None = None,
    chunk_size: int = 256,
) -> Tensor:
    """Exact attention weights ``[b, n_h, n_r, n_k]`` for the chosen heads, rows and keys.

    Args:
        q: ``[b, h, s_q, d]``; k: ``[b, h_kv, s_k, d]``.
        lse: the log-sum-exp ``[b, h, s_q]`` of the attention call being inspected (e.g.
            ``tiled_attention(..., return_lse=True).lse``). ``None``: computed here over all
            keys of the chosen rows (exact, but it reads every key).
        heads: which query heads (a slice, indices or a 1-D tensor); ``None`` = all.
        rows: which query rows, the same way.
        keys: which keys, the same way.
        mask: as given to the attention call (it must match it); so are ``bias``,
            ``causal`` and ``scale``.
        bias: the attention call's additive score bias.
        causal: the attention call's ``causal``.
        scale: the attention call's ``scale``.
        softcap: the attention call's logit soft-capping: the scaled scores become
            ``softcap · tanh(scores / softcap)`` before the bias and the mask (Gemma 2).
        dtype: the floating dtype of the weights (default q's): the scores ``q·k`` are
            formed in q's dtype, as the attention call forms them, and soft-capped,
            biased, masked and normalised in ``dtype`` (``torch.float32`` for bfloat16
            queries and keys, a chunk at a time).
        chunk_size: query rows per step.

    Returns:
        float tensor ``[b, n_h, n_r, n_k]`` in ``dtype``; rows with nothing to attend to
        are zeros.

    Raises:
        ValueError, TypeError: shapes or options that do not fit.
    """
    parts = [
        w
        for _, w in iter_weights_on_demand(
            q,
            k,
            lse,
            heads=heads,
            rows=rows,
            keys=keys,
            mask=mask,
            bias=bias,
            causal=causal,
            scale=scale,
            softcap=softcap,
            dtype=dtype,
            chunk_size=chunk_size,
        )
    ]
    if not parts:
        b = q.shape[0]
        n_h = _indices(heads, q.shape[1], "head", q.device).numel()
        n_k = _indices(keys, k.shape[2], "key", q.device).numel()
        return q.new_zeros(b, n_h, 0, n_k, dtype=dtype)
    return torch.cat(parts, dim=2)


def iter_weights_on_demand(
    q: Tensor,
    k: Tensor,
    lse: Tensor | None = None,
    *,
    heads: Index = None,
    rows: Index = None,
    keys: Index = None,
    mask: masks_mod.Mask | Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    dtype: torch.dtype | None = None,
    chunk_size: int = 256,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Like :func:`weights_on_demand`, one chunk of rows at a time: yields
    ``(row_indices [r], weights [b, n_h, r, n_k])`` so that a caller can reduce or save each
    chunk and keep memory at ``chunk_size × n_k`` per head."""
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be [b, h, s, d], got q {list(q.shape)} and k {list(k.shape)}")
    check_inputs(q, k, k)
    _check_options(chunk_size, softcap, dtype)
    work = q.dtype if dtype is None else dtype
    b, h, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    g = h // h_kv
    if lse is not None and tuple(lse.shape) != (b, h, s_q):
        raise ValueError(f"lse must be [b, h, s_q] = {[b, h, s_q]}, got {list(lse.shape)}")
    scale_f = resolve_scale(scale, d)
    head_idx = _indices(heads, h, "head", q.device)
    row_idx = _indices(rows, s_q, "row", q.device)
    key_idx = _indices(keys, s_k, "key", q.device)
    all_keys = torch.arange(s_k, device=q.device)
    mask_obj, dense, _ = resolve_mask(q, k, mask=mask, bias=bias, causal=causal)  # causal folded in
    bias4 = None if bias is None else masks_mod.unsqueeze_to_4d(bias)
    k_heads = k.index_select(1, torch.div(head_idx, g, rounding_mode="floor"))  # [b, n_h, s_k, d]
    q_heads = q.index_select(1, head_idx)  # [b, n_h, s_q, d]

    def scores_for(r: Tensor, cols: Tensor) -> Tensor:
        q_r = q_heads.index_select(2, r)  # [b, n_h, n_r, d]
        k_t = k_heads.index_select(2, cols).transpose(-1, -2)  # [b, n_h, d, n_c]
        # The product in q's dtype, in the attention call's order (scaled after it; soft-capped
        # scores scale the queries first); the rest in `work`.
        if softcap is None:
            s = (q_r @ k_t).to(work)  # [b, n_h, n_r, n_c]
            if scale_f != 1.0:
                s.mul_(scale_f)
        else:
            s = ((q_r * (scale_f / softcap)) @ k_t).to(work).tanh_().mul_(softcap)  # [b, n_h, n_r, n_c]
        if bias4 is not None:
            s.add_(_take(bias4, head_idx, r, cols))
        allowed = _allowed(mask_obj, dense, head_idx, r, cols, s_k - s_q)
        if allowed is not None:
            s.masked_fill_(~allowed, float("-inf"))
        return s

    every_key = keys is None
    for start in range(0, row_idx.numel(), chunk_size):
        r = row_idx[start : start + chunk_size]
        if lse is not None:
            lse_r = lse.index_select(1, head_idx).index_select(2, r).to(work)  # [b, n_h, n_r]
            s = scores_for(r, key_idx)
        else:
            s = scores_for(r, all_keys)  # [b, n_h, n_r, s_k]
            if every_key:
                # The row's softmax itself, as the attention call normalises it; a row that
                # may attend to nothing (all -inf, NaN from softmax) is zeros.
                w = torch.softmax(s, dim=-1)
                yield r, w.masked_fill_(torch.isneginf(s).all(dim=-1, keepdim=True), 0.0)
                continue
            lse_r = torch.logsumexp(s, dim=-1)
            s = s.index_select(3, key_idx)
        yield r, _normalized(s, lse_r)


def _check_options(chunk_size: int, softcap: float | None, dtype: torch.dtype | None) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be a positive number, got {softcap!r}")
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")


def _normalized(s: Tensor, lse: Tensor) -> Tensor:
    """``exp(s − lse)`` of scores ``[b, n_h, n_r, n_k]`` and their rows' log-sum-exp
    ``[b, n_h, n_r]``, in place: the chunk's scores are the caller's own tensor, and a chunk
    is the most memory a step holds. Rows with nothing to attend to (log-sum-exp -inf) are
    zeros; scores that overflow (+inf, NaN) stay not finite, as a softmax over them is."""
    empty = torch.isneginf(lse).unsqueeze(-1)  # [b, n_h, n_r, 1]
    safe = lse.unsqueeze(-1).masked_fill(empty, 0.0)
    return torch.exp_(s.sub_(safe)).masked_fill_(empty, 0.0)


def _indices(index: Index, n: int, what: str, device: torch.device) -> Tensor:
    """The chosen ``what``s (``"head"``, ``"row"``, ``"key"``) as a tensor of indices in
    ``0 .. n - 1``: all of them, a slice, or indices (negative from the end)."""
    if index is None:
        return torch.arange(n, device=device)
    if isinstance(index, slice):
        return torch.arange(n, device=device)[index]
    t = torch.as_tensor(index)
    if t.ndim != 1 or t.is_floating_point() or t.dtype == torch.bool:
        raise ValueError(f"{what}s must be a slice or 1-D integer indices, got {index!r}")
    chosen = normalize_indices(t.tolist(), n, what, allow_empty=True)
    return torch.tensor(chosen, dtype=torch.long, device=device)


def _take(x: Tensor, heads: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Entries of a 4-D tensor broadcastable to [b, h, s_q, s_k] at the chosen heads/rows/cols."""
    x = x.index_select(1, heads) if x.shape[1] > 1 else x
    x = x.index_select(2, rows) if x.shape[2] > 1 else x
    return x.index_select(3, cols) if x.shape[3] > 1 else x


def _allowed(
    mask: masks_mod.Mask | None, dense: Tensor | None, heads: Tensor, rows: Tensor, cols: Tensor, offset: int
) -> Tensor | None:
    """Which of the chosen heads' query ``rows`` (at positions ``rows + offset``) may attend
    to keys ``cols``: bool ``[b|1, n_h|1, n_r, n_c]``, or ``None`` when every pair may."""
    allowed = None if mask is None else mask.evaluate(rows + offset, cols, heads=heads)
    if dense is not None:
        piece = _take(dense, heads, rows, cols)
        allowed = piece if allowed is None else allowed & piece
    return allowed
