"""``attention(q, k, v)``: the one entry point for dot-product attention.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
length, ``s_k`` key length, ``d`` head dim, ``d_v`` value head dim.

Four engines compute the same thing; :mod:`attnkit.functional.engines` chooses one per call
(``engine="auto"``) and a caller may force one:

- ``"sdpa"``, ``F.scaled_dot_product_attention``, taken when nobody asked for the weights and
  SDPA can express the mask exactly (no mask, or causal with ``s_q == s_k`` or a single
  query);
- ``"flex"``, compiled FlexAttention (:mod:`attnkit.functional.flex`), taken on GPUs for
  every other call that needs no weights, no dropout and no score callable: a mask
  (``Mask`` or bool tensor), a bias, or causal with ``s_q != s_k``;
- ``"blockwise"``, the tiled kernel (:mod:`attnkit.functional.tiled`), for the same calls on
  the CPU: exact, ``O(s · block)`` memory, and it skips the key blocks a mask leaves empty;
- ``"reference"``, which materialises the scores ``[b, h, s_q, s_k]``, never produces NaN on
  fully masked rows, and can hand back the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional._validate import accepts_single_head, check_bias, check_options, dense_allowed
from attnkit.functional.engines import Engine, choose_attention_engine
from attnkit.functional.records import AttentionResult
from attnkit.functional.scores import dot_scores, resolve_scale, stack_query_groups
from attnkit.functional.softmax import masked_softmax
from attnkit.functional.tiled import tiled_core

ScoreFn = Callable[[Tensor, Tensor], Tensor]
# Reads or replaces an intermediate tensor of the reference engine (see ``attention``).
EditFn = Callable[[Tensor], Tensor]
Score = Literal["scaled_dot", "dot"] | ScoreFn
MaskLike = masks_mod.Mask | Tensor


@overload
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: MaskLike | None = ...,
    bias: Tensor | None = ...,
    causal: bool = ...,
    scale: float | None = ...,
    score: Score = ...,
    dropout_p: float = ...,
    return_weights: Literal[False] = ...,
    engine: Engine = ...,
    edit_scores: EditFn | None = ...,
    edit_weights: EditFn | None = ...,
) -> Tensor: ...
@overload
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: MaskLike | None = ...,
    bias: Tensor | None = ...,
    causal: bool = ...,
    scale: float | None = ...,
    score: Score = ...,
    dropout_p: float = ...,
    return_weights: Literal[True],
    engine: Engine = ...,
    edit_scores: EditFn | None = ...,
    edit_weights: EditFn | None = ...,
) -> AttentionResult: ...
@overload
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: MaskLike | None = ...,
    bias: Tensor | None = ...,
    causal: bool = ...,
    scale: float | None = ...,
    score: Score = ...,
    dropout_p: float = ...,
    return_weights: bool,
    engine: Engine = ...,
    edit_scores: EditFn | None = ...,
    edit_weights: EditFn | None = ...,
) -> Tensor | AttentionResult: ...


@accepts_single_head
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: MaskLike | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    score: Score = "scaled_dot",
    dropout_p: float = 0.0,
    return_weights: bool = False,
    engine: Engine = "auto",
    edit_scores: EditFn | None = None,
    edit_weights: EditFn | None = None,
) -> Tensor | AttentionResult:
    """softmax(score(q, k) + bias, masked) @ v.

    Args:
        q: queries ``[b, h, s_q, d]``, or ``[s_q, d]`` for a single head.
        k: keys ``[b, h_kv, s_k, d]`` (``h`` divisible by ``h_kv``: grouped-query
            attention, no copy of k/v per query head), or ``[s_k, d]``.
        v: values ``[b, h_kv, s_k, d_v]``, or ``[s_k, d_v]``.
        mask: where each query may attend (``True`` = may attend): a
            :class:`attnkit.masks.Mask`, or a bool tensor broadcastable to
            ``[b, h, s_q, s_k]``.
        bias: additive float score bias broadcastable to ``[b, h, s_q, s_k]`` (ALiBi,
            relative positions); ``-inf`` entries act as masked.
        causal: also apply a causal mask, aligned bottom-right: query ``i`` may attend to
            keys ``<= i + s_k - s_q``, which stays right when decoding with a cache.
        scale: multiplies the scores; default ``1/sqrt(d)`` for ``"scaled_dot"`` and
            ``1`` for ``"dot"`` and callables.
        score: ``"scaled_dot"`` (Transformer), ``"dot"`` (Luong dot, unscaled), or a
            callable ``(q, k) -> scores [b, h, s_q, s_k]`` such as a partial of
            :func:`attnkit.functional.scores.general_scores`.
        dropout_p: dropout on the weights; pass 0 at evaluation time.
        return_weights: return an :class:`AttentionResult` with the weights.
        engine: ``"auto"`` (the fastest exact engine for the inputs and device), or force
            ``"sdpa"`` (a mask goes to SDPA as a dense bool tensor), ``"flex"``,
            ``"blockwise"`` or ``"reference"``; see :mod:`attnkit.functional.engines`.
        edit_scores: called with the scores ``[b, h, s_q, s_k]`` before the softmax (after
            scale and bias, ``-inf`` where the mask forbids); returns them or the scores to
            use instead. Either edit runs the reference engine.
        edit_weights: called with the weights ``[b, h, s_q, s_k]`` after the softmax
            (before dropout); returns them or the weights to multiply the values with.

    Returns:
        ``[b, h, s_q, d_v]`` (or ``[s_q, d_v]``), or an :class:`AttentionResult` whose
        ``weights`` are ``[b, h, s_q, s_k]`` (or ``[s_q, s_k]``). Queries with nothing to
        attend to get zeros.

    Raises:
        TypeError: non-float or mismatched dtypes, a float mask, an unknown score.
        ValueError: shapes that do not fit together, ``h`` not divisible by ``h_kv``,
            tensors on different devices, a mask of the wrong shape, ``dropout_p``
            outside ``[0, 1)``, an unknown engine or one that cannot compute the call.
    """
    check_options(score, dropout_p, scale)
    return attention_of_checked(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        score=score,
        dropout_p=dropout_p,
        return_weights=return_weights,
        engine=engine,
        edit_scores=edit_scores,
        edit_weights=edit_weights,
    )


def attention_of_checked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: MaskLike | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    score: Score = "scaled_dot",
    dropout_p: float = 0.0,
    return_weights: bool = False,
    engine: Engine = "auto",
    edit_scores: EditFn | None = None,
    edit_weights: EditFn | None = None,
) -> Tensor | AttentionResult:
    """:func:`attention` of inputs whose checks have already passed: ``q``, ``k``, ``v`` of
    ``[b, h, s, d]`` layouts that fit together (``check_inputs``), and valid ``score``,
    ``dropout_p`` and ``scale`` (``check_options``). For a module that made the tensors
    itself and checked its options when it was built: it attends once per layer and
    decoding step, where the checks would cost as much as the attention of one token.
    Masks, biases and the engine are still checked here.

    Args, Returns and Raises: as :func:`attention`, for batched inputs only.
    """
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    sdpa_serves = _sdpa_can_serve(score, bias, mask, causal, s_q, s_k)
    chosen = choose_attention_engine(
        engine,
        q,
        v,
        sdpa_serves=sdpa_serves,
        needs_reference=return_weights
        or edit_scores is not None
        or edit_weights is not None
        or not isinstance(score, str)
        or (dropout_p > 0 and not sdpa_serves)
        or s_k == 0,
        bias=bias,
        bias_alone=bias is not None and mask is None and (not causal or s_q == 1),
    )
    if chosen == "sdpa" and sdpa_serves:
        return _sdpa(
            q, k, v, causal=causal and s_q == s_k and s_q > 1, scale=_scale(score, scale, d), dropout_p=dropout_p
        )
    if chosen in ("flex", "blockwise"):
        # Masks, biases and offset causal: exact attention that skips the key blocks a mask
        # leaves empty, in O(s · block) memory (attnkit.functional.tiled / .flex).
        out, _ = tiled_core(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            scale=_scale(score, scale, d),
            engine=chosen,
            caller="attention",
            need_lse=False,
        )
        return out

    # Only the engines below need the mask as a tensor; building it is O(s_q * s_k).
    allowed = dense_allowed(mask, causal=causal, b=b, h=h, s_q=s_q, s_k=s_k, device=q.device)
    if bias is not None:
        check_bias(bias, q, b=b, h=h, s_q=s_q, s_k=s_k)
    if chosen == "sdpa":
        return _sdpa_dense(q, k, v, allowed, bias, scale=_scale(score, scale, d), dropout_p=dropout_p)
    result = reference_attention(
        q,
        k,
        v,
        allowed=allowed,
        bias=bias,
        scale=_scale(score, scale, d),
        score=score,
        dropout_p=dropout_p,
        edit_scores=edit_scores,
        edit_weights=edit_weights,
    )
    return result if return_weights else result.output


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    allowed: Tensor | None,
    bias: Tensor | None,
    scale: float,
    score: Score,
    dropout_p: float = 0.0,
    edit_scores: EditFn | None = None,
    edit_weights: EditFn | None = None,
) -> AttentionResult:
    """Dense attention that materialises ``[b, h, s_q, s_k]``: exact, NaN-free, and the
    only path that can hand back the weights. Inputs are assumed validated.

    ``edit_scores`` and ``edit_weights`` (see :func:`attention`) read or replace the scores
    (shown with the mask applied as ``-inf``; a replacement is used as it is) and the
    weights; the result holds the edited weights and the lse of the edited scores.

    Returns:
        :class:`AttentionResult` with output ``[b, h, s_q, d_v]``, weights and lse.
    """
    b, h, s_q, _ = q.shape
    h_kv, s_k, d_v = v.shape[1], v.shape[2], v.shape[3]
    scores = dot_scores(q, k) if isinstance(score, str) else score(q, k)  # [b, h, s_q, s_k]
    if not isinstance(score, str) and scores.shape != (b, h, s_q, s_k):
        raise ValueError(f"score callable must return [b, h, s_q, s_k] = {[b, h, s_q, s_k]}, got {list(scores.shape)}")
    # Scores of our own are a fresh tensor: scaled, biased and masked in place, so that one
    # [b, h, s_q, s_k] tensor besides the weights is alive at a time (a callable's may be kept).
    own = isinstance(score, str)
    if scale != 1.0:
        scores = scores.mul_(scale) if own else scores * scale
    if bias is not None:
        # the bias takes the scores' dtype, as in every engine
        scores = scores.add_(bias.to(scores.dtype)) if own else scores + bias.to(scores.dtype)
    if own and allowed is not None and edit_scores is None:
        scores, allowed = scores.masked_fill_(~allowed, float("-inf")), None
    if edit_scores is not None:
        masked = scores if allowed is None else torch.where(allowed, scores, float("-inf"))
        edited = edit_scores(masked)
        if edited is not masked:
            # The edit saw the mask applied (-inf): what it returns is taken as it is.
            scores, allowed = edited, None
    weights, lse = masked_softmax(scores, allowed)  # [b, h, s_q, s_k], [b, h, s_q]
    if edit_weights is not None:
        weights = edit_weights(weights)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = stack_query_groups(dropped, h_kv) @ v  # [b, h_kv, g·s_q, d_v]
    return AttentionResult(out.view(b, h, s_q, d_v), weights, lse)


def _sdpa_can_serve(score: Score, bias: Tensor | None, mask: MaskLike | None, causal: bool, s_q: int, s_k: int) -> bool:
    if not isinstance(score, str) or bias is not None or mask is not None or s_k == 0:
        return False
    # SDPA's is_causal is aligned top-left; it equals our bottom-right causal only when the
    # lengths match. A single query may see every key, so it needs no mask at all.
    return not causal or s_q == s_k or s_q == 1


def _sdpa(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, dropout_p: float) -> Tensor:
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=scale, dropout_p=dropout_p, enable_gqa=gqa
    )  # [b, h, s_q, d_v]


def _sdpa_dense(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None, *, scale: float, dropout_p: float
) -> Tensor:
    """SDPA with the mask (and bias) as one dense tensor; rows with nothing allowed are set to
    zeros, which SDPA guarantees only on the CPU (both its CPU kernels, flash and math, give
    them zeros and finite gradients: no row search there)."""
    attn_mask = allowed
    if bias is not None:
        bias = bias if bias.dtype == q.dtype else bias.to(q.dtype)  # the scores' dtype, as in every engine
        attn_mask = bias if allowed is None else torch.where(allowed, bias, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, scale=scale, dropout_p=dropout_p, enable_gqa=q.shape[1] != k.shape[1]
    )  # [b, h, s_q, d_v]
    if attn_mask is None or q.device.type == "cpu":
        return out
    alive = (attn_mask > float("-inf")) if attn_mask.is_floating_point() else attn_mask
    return out.masked_fill(~alive.any(-1, keepdim=True), 0.0)


def _scale(score: Score, scale: float | None, d: int) -> float:
    """The scale of a call: ``1/sqrt(d)`` by default for ``"scaled_dot"``, 1 for the others."""
    return resolve_scale(scale, d) if scale is not None or score == "scaled_dot" else 1.0
