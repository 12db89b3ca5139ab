"""Multi-head attention with hook points: :class:`MultiHeadAttention`.

:class:`MultiHeadAttention` is :class:`attnkit.nn.attention.Attention` (the attention alone)
with hook points on its steps: ``q_unrotated``, ``k_unrotated`` (before a rotary encoding),
``q``, ``k``, ``v``, ``scores``, ``pattern``, ``z`` and ``result``
(:mod:`attnkit.nn.hooks`). It adds what only a hook or a cache on them needs: the weights
formed and passed through ``scores`` and ``pattern`` while the output stays the fused
kernel's unless a hook replaced them; each head's share of the output projection for
``result``; and, with caches alone on them, scores, pattern and per-head results left to be
computed when the cache is first read
(:class:`attnkit.nn.activation_cache.DeferredActivations`), from the recorded queries and
keys (or head outputs) and copies of what else they depend on. With no hook or cache on
them the points cost nothing and the module computes what :class:`Attention` computes.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
length, ``s_k`` key length, ``d`` head dim, ``e`` model dim.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.functional import AttentionResult
from attnkit.functional.kernels import KERNEL_SPECS
from attnkit.functional.masks import Mask
from attnkit.functional.pattern import attention_pattern
from attnkit.functional.scores import stack_query_groups
from attnkit.nn.activation_cache import DeferredActivations, computable_later, snapshot
from attnkit.nn.attention import Attention, AttentionConfig
from attnkit.nn.cache_memory import empty_large
from attnkit.nn.hooks import HookPoint, record_on_read
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.positional import AttentionPositional
from attnkit.nn.rnn_attention import AttentionScore
from attnkit.nn.score_options import ScoreOptions
from attnkit.nn.weight_selection import WeightSelection


class MultiHeadAttention(Attention):
    """Multi-head attention with grouped-query heads, positional encodings, a KV cache and
    hook points: :class:`attnkit.nn.attention.Attention` (its arguments, its forward pass)
    whose steps pass through the points, in the order the forward pass meets them (see the
    module's docstring). Derived layers call :meth:`_attend_step` where they attend and
    :meth:`_output` (or :meth:`_per_head_result`) after their output projection.
    """

    q_unrotated: HookPoint | None
    k_unrotated: HookPoint | None
    q: HookPoint
    k: HookPoint
    v: HookPoint
    scores: HookPoint | None
    pattern: HookPoint | None
    z: HookPoint
    result: HookPoint

    def __init__(
        self,
        config: AttentionConfig,
        *,
        positional: AttentionPositional | None = None,
        score_module: AttentionScore | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__(config, positional=positional, score_module=score_module, q_norm=q_norm, k_norm=k_norm)
        rotary = self.positional is not None and self.positional.takes_positions
        self._add_hook_points(weights=KERNEL_SPECS[self.kernel].full, rotary=rotary)

    def _add_hook_points(self, *, weights: bool, rotary: bool = False) -> None:
        """The points, in the order the forward pass meets them; ``scores`` and ``pattern``
        only where the kernel can form the ``weights``, ``q_unrotated`` and ``k_unrotated``
        (TransformerLens' ``hook_q``, ``hook_k``) only before a ``rotary`` encoding."""
        self.q_unrotated = HookPoint(positions=(2,)) if rotary else None
        self.k_unrotated = HookPoint(positions=(2,)) if rotary else None
        self.q = HookPoint(positions=(2,))
        self.k = HookPoint(positions=(2,))
        self.v = HookPoint(positions=(2,))
        self.scores = HookPoint(positions=(2, 3)) if weights else None
        self.pattern = HookPoint(positions=(2, 3)) if weights else None
        self.z = HookPoint(positions=(2,))
        self.result = HookPoint(positions=(2,))

    @property
    def _unrotated_watched(self) -> bool:
        """Whether a hook or a cache is on the queries or keys before the rotation."""
        return any(point is not None and point.active for point in (self.q_unrotated, self.k_unrotated))

    @property
    def _inputs_replaceable(self) -> bool:
        """Whether a hook or cache is on ``q``, ``k`` or ``v``: a hook may have replaced
        them, so the attention checks them as it would a caller's."""
        return self.q.active or self.k.active or self.v.active

    @property
    def _rotates_side_by_side(self) -> bool:
        """As :class:`Attention`, and only while nothing watches the queries and keys
        before their rotation (they are then rotated one after the other, through the
        points)."""
        return super()._rotates_side_by_side and not self._unrotated_watched

    def _rotate_queries_keys(self, q: Tensor, k: Tensor, positions: Tensor | None, past: int) -> tuple[Tensor, Tensor]:
        """The ``q_unrotated`` and ``k_unrotated`` points, then the rotation."""
        if self.q_unrotated is not None and self.k_unrotated is not None:
            q, k = self.q_unrotated(q), self.k_unrotated(k)
        return super()._rotate_queries_keys(q, k, positions, past)

    def _self_projections(self, x: Tensor, positions: Tensor | None, past: int) -> tuple[Tensor, Tensor, Tensor]:
        """The queries, keys and values of :class:`Attention`, through the ``q``, ``k`` and
        ``v`` points (before the KV cache keeps the keys and values)."""
        q, k, v = super()._self_projections(x, positions, past)
        return self.q(q), self.k(k), self.v(v)

    def _cross_queries(self, x: Tensor) -> Tensor:
        """The queries of cross-attention through the ``q`` point."""
        return self.q(super()._cross_queries(x))

    def _context_keys_values(self, key_input: Tensor, value_input: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values projected from the context, through the ``k`` and ``v``
        points (a filled KV cache gives them without projecting, or passing the points,
        again)."""
        k, v = super()._context_keys_values(key_input, value_input)
        return self.k(k), self.v(v)

    def _output(self, heads: Tensor) -> Tensor:
        """The ``z`` point on the heads' outputs ``[b, h, s_q, d]``, the output projection
        ``[b, s_q, e]``, and the ``result`` point when a hook or cache is on it."""
        heads = self.z(heads)
        output = super()._output(heads)
        return self._per_head_result(heads, output) if self.result.active else output

    def _attend_step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        return_weights: bool | WeightSelection,
        kv_cache: KVCache | None,
        position_bias: Tensor | None,
    ) -> AttentionResult:
        """:class:`Attention`'s step with the ``scores`` and ``pattern`` hook points: when a
        hook or cache is on either, the weights are formed and passed through them. The
        output is then the fused kernel's unless a hook replaced them (or the weights were
        asked for): hooks that change nothing change nothing. With caches alone on them, no
        gradient to carry and no ``kv_cache`` (whose buffers later steps overwrite), the
        caches compute them when first read instead
        (:func:`attnkit.nn.activation_cache.computable_later`, :meth:`_defer_pattern`, which
        copies a bias that is the caller's ``position_bias``: the caller may change it
        afterwards). A :class:`~attnkit.nn.WeightSelection` goes to
        :meth:`_attend_selected`; when something watches the weights, every head's weights
        first pass through the points, and where a hook replaced them the output and the
        chosen weights are the hook's."""
        watched = [point for point in (self.scores, self.pattern) if point is not None and point.active]
        if not watched:
            return super()._attend_step(
                q,
                k,
                v,
                mask=mask,
                bias=bias,
                causal=causal,
                return_weights=return_weights,
                kv_cache=kv_cache,
                position_bias=position_bias,
            )
        assert self.scores is not None and self.pattern is not None  # both exist when either does
        inputs = [t for t in (q, k, mask, bias) if isinstance(t, Tensor)]
        if isinstance(self.score, nn.Module):
            inputs += list(self.score.parameters())
        unhooked = not any(point.hooked for point in watched)
        if kv_cache is None and not return_weights and unhooked and computable_later(*inputs):
            bias_is_callers = bias is not None and bias is position_bias
            self._defer_pattern(q, k, mask=mask, bias=bias, causal=causal, bias_is_callers=bias_is_callers)
            return self._attend(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=False)
        replaced = []

        def through(point: HookPoint) -> Callable[[Tensor], Tensor]:
            def edit(t: Tensor) -> Tensor:
                out = point(t)
                if out is not t:
                    replaced.append(point)
                return out

            return edit

        if not return_weights:
            return self._attend_through_pattern(
                q, k, v, mask=mask, bias=bias, causal=causal, edit_scores=through(self.scores)
            )
        result = self._attend(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            return_weights=True,
            edit_scores=through(self.scores),
            edit_weights=through(self.pattern),
        )
        if not isinstance(return_weights, WeightSelection):
            return result
        if replaced or any(point.watches_gradient for point in watched):
            # A hook changed the scores or the pattern (or their gradient is watched): the
            # output and the chosen part of the weights are those it made.
            assert result.weights is not None  # asked for
            return AttentionResult(result.output, return_weights.take(result.weights).float())
        # Hooks that change nothing change nothing: the output and weights of a pass without them.
        return self._attend_selected(q, k, v, mask=mask, bias=bias, causal=causal, selection=return_weights)

    def _defer_pattern(
        self,
        q: Tensor,
        k: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        bias_is_callers: bool,
    ) -> None:
        """Leave the ``scores`` and ``pattern`` to the active caches, computed when first
        read from the queries and keys, and from all else they depend on as it is now
        (:class:`attnkit.nn.activation_cache.DeferredActivations`): the options as values,
        the mask and a bias the caller holds as copies."""
        assert self.scores is not None and self.pattern is not None  # the caller watches them
        recorded, copies = {"queries": q, "keys": k}, {}
        compute = partial(_recorded_pattern, options=self._bound_score_options(), causal=causal)
        bound_mask = _bound_mask(mask, q.shape[2], k.shape[2], q.device)
        if isinstance(bound_mask, Tensor):
            copies["mask"] = bound_mask
        elif bound_mask is not None:
            compute = partial(compute, mask=bound_mask)
        if bias is not None and bias_is_callers:
            copies["bias"] = snapshot(bias)
        elif bias is not None:
            recorded["bias"] = bias  # the positional encoding's, made for this call
        where = self.pattern.name.rpartition(".")[0] or "attention"
        record_on_read(
            (self.scores, self.pattern),
            DeferredActivations(compute, recorded, what=f"{where} scores and pattern", copies=copies),
            handed_out_by=(self.q, self.k, self.v),
        )

    def _attend_through_pattern(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        edit_scores: Callable[[Tensor], Tensor],
    ) -> AttentionResult:
        """The ``scores`` and ``pattern`` points of a pass that does not return the weights:
        the pattern alone is formed for them (:meth:`_pattern`). The output is the fused
        kernel's, as in a pass without hooks, unless a hook replaced the scores or the
        pattern: then it is the pattern (after dropout, in training) times the values."""
        assert self.pattern is not None  # the caller watches it
        weights, scores_replaced = self._pattern(
            q, k, mask=mask, bias=bias, causal=causal, edit_scores=edit_scores
        )  # [b, h, s_q, s_k]
        pattern = self.pattern(weights)
        watched = self.pattern.watches_gradient or (self.scores is not None and self.scores.watches_gradient)
        if pattern is weights and not scores_replaced and not watched:
            return AttentionResult(
                self._attend(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=False).output
            )
        if self.training and self.dropout > 0:
            pattern = nn.functional.dropout(pattern, p=self.dropout)
        h_kv, d_v = v.shape[1], v.shape[3]
        out = stack_query_groups(pattern, h_kv) @ v  # [b, h_kv, g·s_q, d_v]
        return AttentionResult(out.view(pattern.shape[0], self.num_heads, q.shape[2], d_v))

    def _pattern(
        self,
        q: Tensor,
        k: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        edit_scores: Callable[[Tensor], Tensor],
    ) -> tuple[Tensor, bool]:
        """This module's attention weights alone, ``([b, h, s_q, s_k], scores_replaced)``
        (:func:`_pattern_of` with this module's options)."""
        return _pattern_of(self._score_options(), q, k, mask=mask, bias=bias, causal=causal, edit_scores=edit_scores)

    def _bound_score_options(self) -> ScoreOptions:
        """The score options as a cache keeps them for a later read: the score module (if
        any) a copy whose tensors are snapshots (:func:`attnkit.nn.activation_cache.snapshot`),
        so that no later change of this module changes the pattern."""
        options = self._score_options()
        if isinstance(options.score, AttentionScore):
            return dataclasses.replace(options, score=_bound_score_module(options.score))
        return options

    def _per_head_result(self, heads: Tensor, output: Tensor) -> Tensor:
        """The ``result`` hook point: each head's share of the output projection,
        ``[b, h, s, e]``; the output is their sum (plus the bias) if a hook replaced them.
        With caches alone on it and no gradient to carry, the caches compute it when first
        read, from the head outputs and a copy of the output projection, unless it is no
        larger than that copy (:func:`_result_larger_than_weight`: a short text, a decoding
        step), when it is formed now."""
        w_o = self.out_proj.weight.view(-1, self.num_heads, self.head_dim)  # [e, h, d]
        if not self.result.hooked and _result_larger_than_weight(heads) and computable_later(heads, w_o):
            where = self.result.name.rpartition(".")[0] or "attention"
            record_on_read(
                (self.result,),
                DeferredActivations(
                    _recorded_per_head_outputs,
                    {"head_outputs": heads},
                    what=f"{where} per-head results",
                    # A copy: anyone may change the module's weight, through .data too.
                    copies={"output_weight": snapshot(self.out_proj.weight)},
                ),
                handed_out_by=(self.z,),
            )
            return output
        if torch.is_grad_enabled() and (heads.requires_grad or w_o.requires_grad):
            per_head = torch.einsum("bhsd,ehd->bhse", heads, w_o)  # [b, h, s, e]
        else:
            per_head = _per_head_outputs(heads, w_o)
        hooked = self.result(per_head)
        if hooked is per_head and not self.result.watches_gradient:
            return output
        summed = hooked.sum(1)  # [b, s, e]
        return summed if self.out_proj.bias is None else summed + self.out_proj.bias


def _per_head_outputs(heads: Tensor, w_o: Tensor) -> Tensor:
    """Each head's output through its slice of the output projection: ``heads [b, h, s, d]``
    and ``w_o [e, h, d]`` give ``[b, h, s, e]``, written straight into memory a cache may
    keep (:mod:`attnkit.nn.cache_memory`). Without autograd."""
    b, h, s, _ = heads.shape
    per_head = empty_large((b, h, s, w_o.shape[0]), heads.dtype, heads.device)
    return torch.matmul(heads, w_o.permute(1, 2, 0), out=per_head)  # [b, h, s, e]


def _result_larger_than_weight(heads: Tensor) -> bool:
    """Whether the per-head result of ``heads [b, h, s, d]``, ``[b, h, s, e]``, is larger
    than the copy of the output projection ``[e, h, d]`` that computing it on read needs:
    more than ``d`` positions in the batch."""
    b, _, s, d = heads.shape
    return b * s > d


def _recorded_per_head_outputs(head_outputs: Tensor, output_weight: Tensor) -> tuple[Tensor]:
    """The ``result`` a cache computes when first read, from the recorded head outputs
    ``[b, h, s, d]`` and the output projection's weight ``[e, h · d]`` as it was in the
    pass."""
    _, h, _, d = head_outputs.shape
    return (_per_head_outputs(head_outputs, output_weight.view(-1, h, d)),)  # [e, h, d]


def _recorded_pattern(
    queries: Tensor,
    keys: Tensor,
    *,
    options: ScoreOptions,
    causal: bool,
    mask: Mask | Tensor | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(scores, pattern)`` ``[b, h, s_q, s_k]`` as a pass with caches on both records
    them: what a cache computes from the recorded queries and keys when first read."""
    scores = []

    def keep(t: Tensor) -> Tensor:
        scores.append(t)
        return t

    weights, _ = _pattern_of(options, queries, keys, mask=mask, bias=bias, causal=causal, edit_scores=keep)
    return scores[0], weights


def _bound_mask(mask: Mask | Tensor | None, s_q: int, s_k: int, device: torch.device) -> Mask | Tensor | None:
    """``mask`` as a deferred pattern keeps it: a bool tensor as a snapshot
    (:func:`attnkit.nn.activation_cache.snapshot`); a :class:`attnkit.masks.Mask` that may
    read tensors someone holds (one that captures tensors, or is known only by its
    function) evaluated now, ``[b|1, h|1, s_q, s_k]``; a mask known by its value and
    capturing no tensor (causal, sliding window), or ``None``, as it is."""
    if isinstance(mask, Tensor):
        return snapshot(mask)
    if isinstance(mask, Mask) and (mask.relocate is not None or mask.key is None):
        return mask.to_dense(s_q, s_k, device=device)
    return mask


def _bound_score_module(module: AttentionScore) -> AttentionScore:
    """A copy of a score module whose parameters and buffers are snapshots
    (:func:`attnkit.nn.activation_cache.snapshot`): it computes what ``module`` computes
    now, whatever is done to ``module`` later."""
    memo: dict[int, Any] = {id(t): snapshot(t) for t in itertools.chain(module.parameters(), module.buffers())}
    return copy.deepcopy(module, memo)


def _pattern_of(
    options: ScoreOptions,
    q: Tensor,
    k: Tensor,
    *,
    mask: Mask | Tensor | None,
    bias: Tensor | None,
    causal: bool,
    edit_scores: Callable[[Tensor], Tensor],
) -> tuple[Tensor, bool]:
    """The attention weights alone of queries ``q`` and keys ``k`` under ``options``,
    ``([b, h, s_q, s_k], scores_replaced)`` (:func:`attnkit.functional.pattern.attention_pattern`,
    the mask added once as a bias shared by every layer), the scores passed through
    ``edit_scores``: the scores, scale, soft-capping and window of the fused pass."""
    score, scale = options.score_and_scale(q.shape[-1])
    return attention_pattern(
        q,
        k,
        mask=options.windowed(mask, q.shape[2], k.shape[2]),
        causal=causal,
        scale=scale,
        bias=bias,
        score=score,
        edit_scores=edit_scores,
        allocate=empty_large,
    )
