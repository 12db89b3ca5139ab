"""The attention pattern alone, for hooks and activation caches: the scaled, masked scores
and their softmax, without the product with the values that the fused kernel computes
anyway.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
length, ``s_k`` key length, ``d`` head dim.

The mask is applied as an additive bias (0 where a query may attend, ``-inf`` where it may
not) added with the scale in one pass over the scores. Every layer of a model attends with
the same mask (or with the causal flag alone), so the bias of the last masks seen is kept
(up to 64 MiB each) and shared by the layers of a forward pass (and by the next pass of the
same shape) rather than built per layer. A kept bias is used only while its mask allows what
it allowed: a bool mask is compared with a copy of itself (a write through ``.data`` or NumPy
bypasses the version counter), and a :class:`attnkit.masks.Mask` that may read tensors its
caller holds (one that captures tensors, or is known only by its function) is evaluated on
every call. The scores and weights are those of
:func:`attnkit.functional.reference_attention`, bit for bit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional._validate import check_inputs, dense_allowed
from attnkit.functional.scores import dot_scores, stack_query_groups
from attnkit.functional.softmax import masked_softmax

EditFn = Callable[[Tensor], Tensor]
# Makes an uninitialised contiguous tensor: (shape, dtype, device) -> tensor.
AllocateFn = Callable[[tuple[int, ...], torch.dtype, torch.device], Tensor]
# How many additive masks are kept: a decoder's self-attention and an encoder-decoder's
# cross-attention alternate within one pass.
_KEPT_MASKS = 4
# A bias larger than this (a long, padded batch) is not kept after the pass: built per layer.
_KEPT_BYTES = 2**26
_kept: OrderedDict[tuple[object, ...], tuple[object, Tensor | None, Tensor | None, bool]] = OrderedDict()
_kept_lock = threading.Lock()


def additive_mask(
    mask: masks_mod.Mask | Tensor | None,
    *,
    causal: bool,
    b: int,
    h: int,
    s_q: int,
    s_k: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[Tensor | None, bool]:
    """The mask and the causal flag as an additive score bias, built once per mask.

    Args:
        mask: a :class:`attnkit.masks.Mask`, a bool tensor broadcastable to
            ``[b, h, s_q, s_k]`` (``True`` = may attend), or ``None``.
        causal: also apply a causal mask, aligned bottom-right.
        b, h, s_q, s_k: the sizes of the scores.
        device, dtype: those of the scores.

    Returns:
        ``(bias, rows_may_be_empty)``: ``bias`` broadcastable to ``[b, h, s_q, s_k]``, 0
        where a query may attend and ``-inf`` where it may not (``None`` when every query
        may attend to every key); ``rows_may_be_empty`` is whether some query may attend
        to no key at all.

    Raises:
        TypeError, ValueError: a mask :func:`attnkit.functional.attention` refuses.
    """
    # A mask that may read tensors its caller holds and changes in place (one that captures
    # tensors, or is known only by its function) allows what it allows now: known only by
    # evaluating it, so its bias is built anew.
    reusable = not (isinstance(mask, masks_mod.Mask) and (mask.relocate is not None or mask.key is None))
    key = (id(mask), causal, b, h, s_q, s_k, device, dtype)
    if reusable:
        with _kept_lock:
            kept = _kept.get(key)
            if kept is not None and kept[0] is mask and _unchanged(mask, kept[1]):
                _kept.move_to_end(key)
                return kept[2], kept[3]
    allowed = dense_allowed(mask, causal=causal, b=b, h=h, s_q=s_q, s_k=s_k, device=device)
    if allowed is None:
        bias, empty = None, s_k == 0
    else:
        bias = torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill_(~allowed, float("-inf"))
        empty = s_k == 0 or not bool(allowed.any(-1).all())
    if not reusable or (bias is not None and bias.numel() * bias.element_size() > _KEPT_BYTES):
        return bias, empty
    # A bool tensor is kept with a copy of what it held, so that a change that bypasses its
    # version counter (a write through ``.data`` or NumPy) is still seen.
    held = mask.clone() if isinstance(mask, Tensor) else None
    with _kept_lock:
        # The mask itself is kept with its bias, so that its id names it while it is kept.
        _kept[key] = (mask, held, bias, empty)
        while len(_kept) > _KEPT_MASKS:
            _kept.popitem(last=False)
    return bias, empty


def _unchanged(mask: masks_mod.Mask | Tensor | None, held: Tensor | None) -> bool:
    """Whether a kept mask still allows what it allowed when its bias was built."""
    return not isinstance(mask, Tensor) or (held is not None and torch.equal(mask, held))


def attention_pattern(
    q: Tensor,
    k: Tensor,
    *,
    mask: masks_mod.Mask | Tensor | None,
    causal: bool,
    scale: float,
    bias: Tensor | None = None,
    score: str | Callable[[Tensor, Tensor], Tensor] = "scaled_dot",
    edit_scores: EditFn | None = None,
    allocate: AllocateFn | None = None,
) -> tuple[Tensor, bool]:
    """``softmax(q · k * scale, masked)``: the weights of
    :func:`attnkit.functional.reference_attention` without the product with the values.

    Args:
        q: queries ``[b, h, s_q, d]``, checked as :func:`attnkit.functional.attention`
            checks them (a hook may have replaced q or k).
        k: keys ``[b, h_kv, s_k, d]``.
        mask: a :class:`attnkit.masks.Mask`, a bool tensor (``True`` = may attend), or
            ``None``.
        causal: also apply a causal mask, aligned bottom-right.
        scale: multiplies the scores.
        bias: additive float score bias broadcastable to ``[b, h, s_q, s_k]`` (ALiBi,
            relative positions), added after the scale.
        score: ``"scaled_dot"`` or ``"dot"`` (the dot products), or a callable
            ``(q, k) -> scores [b, h, s_q, s_k]``.
        edit_scores: called with the scores ``[b, h, s_q, s_k]`` (``-inf`` where the mask
            forbids); returns them or the scores to use instead, which go through the
            softmax as they are.
        allocate: makes the tensors the scores and weights are written into (without
            autograd), as :func:`torch.empty` would: the same values, in memory of the
            caller's choosing (an activation cache's). ``None``: :func:`torch.empty`.

    Returns:
        ``(weights [b, h, s_q, s_k], scores_replaced)``; rows with nothing to attend to get
        zeros.

    Raises:
        TypeError, ValueError: q or k, or a mask, that :func:`attnkit.functional.attention`
            refuses, a score callable that returns the wrong shape.
    """
    check_inputs(q, k, k)
    b, h, s_q, _ = q.shape
    s_k = k.shape[2]
    into = allocate if allocate is not None and not (q.requires_grad or k.requires_grad) else None
    if not isinstance(score, str):
        scores = score(q, k)  # [b, h, s_q, s_k]
    elif into is None:
        scores = dot_scores(q, k)  # [b, h, s_q, s_k]
    else:
        h_kv = k.shape[1]
        scores = into((b, h, s_q, s_k), torch.result_type(q, k), q.device)  # [b, h, s_q, s_k]
        torch.matmul(stack_query_groups(q, h_kv), k.transpose(-1, -2), out=scores.view(b, h_kv, -1, s_k))
    if not isinstance(score, str) and scores.shape != (b, h, s_q, s_k):
        raise ValueError(f"score callable must return [b, h, s_q, s_k] = {[b, h, s_q, s_k]}, got {list(scores.shape)}")
    masking, rows_may_be_empty = additive_mask(
        mask, causal=causal, b=b, h=h, s_q=s_q, s_k=s_k, device=q.device, dtype=scores.dtype
    )
    if bias is not None:
        scores = scores * scale if scale != 1.0 else scores
        scores = scores + bias.to(scores.dtype)  # the bias takes the scores' dtype, as in every engine
        scale = 1.0
    if masking is not None:
        # 0 + scale * scores is scale * scores exactly, -inf + it masks: one pass, in place
        # (the mask broadcasts to the scores' shape). Autograd takes no out=: a new tensor.
        if scores.requires_grad:
            scores = torch.add(masking, scores, alpha=scale)
        else:
            torch.add(masking, scores, alpha=scale, out=scores)
    elif scale != 1.0:
        scores = scores.mul_(scale) if into is not None and isinstance(score, str) else scores * scale
    if edit_scores is not None:
        edited = edit_scores(scores)
        if edited is not scores:
            return masked_softmax(edited)[0], True
    if rows_may_be_empty:
        return masked_softmax(scores)[0], False
    if into is None or scores.requires_grad:
        return torch.softmax(scores, dim=-1), False  # [b, h, s_q, s_k]
    return torch.softmax(scores, dim=-1, out=into(tuple(scores.shape), scores.dtype, scores.device)), False
