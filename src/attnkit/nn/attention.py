"""Multi-head attention: learned projections around :func:`attnkit.functional.attention`.

Shape letters: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``s_q`` query
length, ``s_k`` key length, ``d`` head dim, ``e`` model dim, ``e_k`` / ``e_v`` the dims of
the key / value inputs of cross-attention.

``e`` is split into ``h`` heads of ``d = e / h``: each head attends in its own ``d``-dim
subspace, the heads' outputs are concatenated back to ``e`` and mixed by the output
projection. For a fixed ``e`` the parameter count and FLOPs do not depend on ``h``. Some
checkpoints choose ``d`` themselves (``h · d != e``: Gemma, Qwen 3); the projections then
map ``e`` to ``h · d`` and back.

What the open checkpoints add to attention is one option each: per-head query/key norms
(``q_norm``, ``k_norm``), a score scale other than ``1/√d`` (``scale``), logit soft-capping
(``softcap``), a sliding window over the keys (``window``, an :mod:`attnkit.masks`
mask), biases on the input projections only (``out_bias=False``).

This module holds the attention alone, as a ``transformers`` attention layer does: project,
normalise and rotate the heads, update the KV cache, attend, merge the heads, project out.
:class:`Attention` is that layer; :class:`attnkit.nn.MultiHeadAttention`
(:mod:`attnkit.nn.hooked_attention`) is the same layer with hook points on its steps, the
one attnkit's models are built from. The scores' options come from
:class:`attnkit.nn.score_options.ScoreOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, Self

import torch
from torch import Tensor, nn

from attnkit.deprecation import moved_names
from attnkit.functional import AttentionResult, attention
from attnkit.functional.attention import attention_of_checked
from attnkit.functional.kernels import KERNEL_SPECS, check_kernel_options, resolve_kernel_name
from attnkit.functional.masks import Mask
from attnkit.functional.weights_on_demand import iter_weights_on_demand
from attnkit.nn.cache_memory import empty_large
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.packing import PackedLinears
from attnkit.nn.positional import AttentionPositional
from attnkit.nn.records import MultiHeadOutput, forward_of_record
from attnkit.nn.rnn_attention import AttentionScore
from attnkit.nn.score_options import Score, ScoreOptions
from attnkit.nn.weight_selection import WeightSelection

# MultiHeadAttention, the attention with hook points, moved to attnkit.nn.hooked_attention
# (attnkit.nn.MultiHeadAttention is unchanged).
__getattr__ = moved_names(__name__, {"MultiHeadAttention": "attnkit.nn.hooked_attention"}, removed_in="0.3")

# The scores a chunk of chosen rows holds while their weights are formed, beside the weights
# themselves (:meth:`Attention._selected_weights`): a 64th of the weights (each of
# the chunk's few temporaries adds under 2% to them), at least 2**20 (one chunk for short
# texts) and at most 2**24 (float32: 64 MiB).
SELECTED_CHUNK_SHARE = 64
SELECTED_CHUNK_ELEMENTS = (2**20, 2**24)
Context = Tensor | tuple[Tensor, Tensor]


@dataclass(frozen=True)
class AttentionConfig:
    """What :class:`Attention` (and :class:`attnkit.nn.MultiHeadAttention`) is built from,
    checked when the config is made.

    Args:
        embed_dim: model dim ``e`` of the queries and the output.
        num_heads: query heads ``h``; must divide ``embed_dim`` (unless ``head_dim`` is
            given).
        num_kv_heads: key/value heads ``h_kv`` (default ``h``); fewer gives grouped-query
            attention, ``1`` multi-query attention. Must divide ``num_heads``.
        head_dim: ``d``, the size of each head (default ``embed_dim / num_heads``); with it
            ``embed_dim`` need not be divisible by ``num_heads``.
        kdim: dim ``e_k`` of the key input of cross-attention (default ``e``).
        vdim: dim ``e_v`` of the value input of cross-attention (default ``e``).
        bias: give the four projections a bias.
        out_bias: give the output projection a bias (default ``bias``); ``False`` with
            ``bias=True`` biases the query, key and value projections only (Qwen 2).
        dropout: dropout on the attention weights while training.
        score: ``"scaled_dot"`` (``q·k/√d``) or ``"dot"`` (unscaled, as T5); a score
            module (additive, Luong) is given to the module itself.
        kernel: which attention kernel computes the heads, by name in
            :data:`attnkit.functional.kernels.KERNELS`: ``"auto"`` (default; the dispatcher:
            SDPA or the reference path, the only one that returns weights), ``"tiled"``
            (any mask, memory bounded), ``"local"``, ``"sparse"``, ``"linear"``, ``"ring"``
            (sequence-parallel across ranks, after ``import attnkit.distributed``); all but
            ``"auto"`` compute scaled dot-product attention without dropout.
        kernel_options: keyword options of that kernel, checked here
            (:func:`attnkit.functional.kernels.check_kernel_options`), e.g.
            ``{"window": 256}`` for ``"local"``, the pattern for ``"sparse"``,
            ``{"feature_map": "favor"}`` for ``"linear"``.
        scale: multiplies the scores (default ``1/√d`` for ``"scaled_dot"``, ``1`` for
            ``"dot"``); Gemma's ``query_pre_attn_scalar ** -0.5``.
        softcap: soft-cap the scaled scores to ``softcap · tanh(scores / softcap)`` before
            masking (Gemma 2's attention logit soft-capping); computed on the reference
            path, which materialises the scores.
        window: each query attends only to the ``window`` keys ending at its own position
            (``query - key < window``; Mistral's and Gemma's sliding window), through an
            :func:`attnkit.masks.sliding_window` mask that joins the call's mask once there
            are more than ``window`` keys.

    Raises:
        ValueError: non-positive sizes, ``embed_dim`` not divisible by ``num_heads`` (without
            ``head_dim``), ``num_heads`` not divisible by ``num_kv_heads``, ``dropout``
            outside ``[0, 1)``, an unknown kernel, a kernel option out of range, ``scale``,
            ``softcap`` or ``window`` with a kernel other than ``"auto"`` or out of range, a
            ``score`` or ``dropout`` that a kernel other than ``"auto"`` cannot compute.
        TypeError: a size that is not an int, an unknown score, a kernel option the kernel
            does not take or needs.
    """

    embed_dim: int
    num_heads: int
    _: KW_ONLY
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kdim: int | None = None
    vdim: int | None = None
    bias: bool = True
    out_bias: bool | None = None
    dropout: float = 0.0
    score: Literal["scaled_dot", "dot"] = "scaled_dot"
    kernel: str = "auto"
    kernel_options: Mapping[str, Any] = field(default_factory=dict)
    scale: float | None = None
    softcap: float | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        _check_sizes(
            self.embed_dim,
            self.num_heads,
            self.num_heads if self.num_kv_heads is None else self.num_kv_heads,
            self.embed_dim if self.kdim is None else self.kdim,
            self.embed_dim if self.vdim is None else self.vdim,
            self.head_dim,
        )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.score not in ("scaled_dot", "dot"):
            raise TypeError(
                f'score must be "scaled_dot" or "dot" (or an AttentionScore module given to MultiHeadAttention), '
                f"got {self.score!r}"
            )
        kernel = resolve_kernel_name(self.kernel)  # raises on an unknown name, listing the known ones
        _check_kernel_computes(kernel, self.score, self.dropout)
        _check_score_options(kernel, self.scale, self.softcap, self.window)
        # Frozen: the checked copy of the options replaces the given mapping.
        object.__setattr__(self, "kernel_options", check_kernel_options(kernel, self.kernel_options))


class Attention(nn.Module):
    """Multi-head attention with grouped-query heads, positional encodings and a KV cache,
    without hook points (:class:`attnkit.nn.MultiHeadAttention` adds them).

    ``MultiHead(x) = Concat(head_1, …, head_h) W_O`` with
    ``head_i = Attention(x W_Q^i, c W_K^i, c W_V^i)``, where the context ``c`` is ``x``
    itself (self-attention) or another sequence (cross-attention).

    Args:
        config: the sizes and options, an :class:`AttentionConfig`.
        positional: an :class:`attnkit.nn.AttentionPositional` (rotary, ALiBi, relative
            bias) applied in self-attention; absolute encodings are added to the
            embeddings instead.
        score_module: an :class:`attnkit.nn.AttentionScore` module (additive or Luong
            attention) whose query and key dims are the head dim ``d``, used instead of
            ``config.score``.
        q_norm: a module applied to each head's queries ``[b, h, s_q, d]`` over ``d``,
            before the positional rotation (Qwen 3's and Gemma 3's per-head RMSNorm).
        k_norm: the same for the keys.

    Raises:
        ValueError: a score module or positional encoding built for other sizes, a score
            module with ``config.score="dot"``, ``config.softcap`` or a kernel other than
            ``"auto"``.
        TypeError: a config, score module or positional encoding of the wrong type.
    """

    def __init__(
        self,
        config: AttentionConfig,
        *,
        positional: AttentionPositional | None = None,
        score_module: AttentionScore | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(config, AttentionConfig):
            raise TypeError(f"config must be an attnkit.nn.AttentionConfig, got {type(config).__name__}")
        self.config = config
        e, h = config.embed_dim, config.num_heads
        self.embed_dim, self.num_heads = e, h
        self.num_kv_heads = h if config.num_kv_heads is None else config.num_kv_heads
        self.kdim = e if config.kdim is None else config.kdim
        self.vdim = e if config.vdim is None else config.vdim
        self.head_dim = e // h if config.head_dim is None else config.head_dim
        self.dropout = config.dropout
        self.kernel = config.kernel
        self.kernel_options = dict(config.kernel_options)
        self.score: Score = (
            config.score if score_module is None else _check_score_module(score_module, config, self.head_dim)
        )
        self.positional = _check_positional(positional, h, self.head_dim)
        self.scale, self.softcap, self.window = config.scale, config.softcap, config.window
        bias = config.bias
        self.q_proj = nn.Linear(e, h * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, self.num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(h * self.head_dim, e, bias=bias if config.out_bias is None else config.out_bias)
        self.q_norm = q_norm
        self.k_norm = k_norm
        self._packed: PackedLinears | None = None

    @property
    def packable(self) -> bool:
        """Whether :meth:`pack_projections` applies: key and value dims equal to the model
        dim (self-attention projections)."""
        return self.kdim == self.vdim == self.embed_dim

    def pack_projections(self) -> None:
        """Store the query, key and value projection weights as one matrix, so that
        self-attention projects with one matrix product and rotates queries and keys in one
        pass when no gradient is recorded (see :mod:`attnkit.nn.packing`). Parameters,
        ``state_dict`` and results stay the same.

        Raises:
            ValueError: key or value dims other than the model dim (cross-attention only).
        """
        if not self.packable:
            raise ValueError(
                f"only self-attention projections can be packed; this module has embed_dim={self.embed_dim}, "
                f"kdim={self.kdim}, vdim={self.vdim}"
            )
        self._packed = PackedLinears([self.q_proj, self.k_proj, self.v_proj])

    def forward_record(
        self,
        x: Tensor,
        context: Context | None = None,
        *,
        mask: Mask | Tensor | None = None,
        causal: bool = False,
        positions: Tensor | None = None,
        kv_cache: KVCache | None = None,
        position_bias: Tensor | None = None,
        return_weights: bool | WeightSelection = False,
    ) -> MultiHeadOutput:
        """Attend from ``x`` to itself (``context=None``) or to ``context``.

        Args:
            x: queries' input ``[b, s_q, e]``.
            context: ``[b, s_k, e_k]`` used for keys and values (``e_k = e_v``), or a pair
                ``(key_input [b, s_k, e_k], value_input [b, s_k, e_v])``; ``None`` for
                self-attention.
            mask: where each query may attend (``True`` = may attend): an
                :class:`attnkit.masks.Mask` or a bool tensor broadcastable to
                ``[b, h, s_q, s_k]``, ``s_k`` counting cached keys.
            causal: also apply a causal mask (aligned bottom-right, so it stays right when
                decoding with a cache).
            positions: integer positions of the queries ``[s_q]`` or ``[b, s_q]`` for a
                rotary encoding (default: continuing after the cached ones). Attention
                without a positional encoding ignores them.
            kv_cache: a :class:`attnkit.nn.KVCache`. Self-attention appends the new keys
                and values and attends to all cached ones. Cross-attention fills it on the
                first call and reuses it afterwards without projecting ``context`` again.
            position_bias: the score bias of this module's positional encoding for this
                call, ``positional.score_bias(s_q, s_k)`` ``[1, h, s_q, s_k]``, when the
                caller has it already: a stack whose layers share one bias encoding (T5's
                relative positions, ALiBi) computes it once per forward pass for all of
                them. ``None``: computed here.
            return_weights: also return the weights ``[b, h, s_q, s_k]``; a
                :class:`attnkit.nn.WeightSelection` returns those of its heads and rows
                alone, ``[b, n_h, n_r, s_k]`` float32, formed from the queries and keys
                while the output comes from the fused kernel (:meth:`_attend_selected`).

        Returns:
            ``forward``: ``[b, s_q, e]``, or with ``return_weights`` a
            :class:`attnkit.nn.MultiHeadOutput` with the weights. ``forward_record``: always
            the record (weights ``None`` unless asked for; then the fused kernel runs), the
            one path attention runs through.

        Raises:
            ValueError: shapes that do not fit the module or each other, a positional
                encoding in cross-attention, ``positions`` with a bias encoding (which
                uses row/column positions), a mask of the wrong shape, a
                ``position_bias`` without a positional encoding or not
                ``[1, h, s_q, s_k]``.
            TypeError: non-float inputs, a ``kv_cache`` that is not a ``KVCache``.
        """
        key_input, value_input = self._check_forward(x, context, positions, kv_cache)
        if context is None:
            past = 0 if kv_cache is None else len(kv_cache)
            q, k, v = self._self_projections(x, positions, past)  # [b, h, s_q, d], [b, h_kv, s_q, d] x 2
            if kv_cache is not None:
                k, v = kv_cache.append(k, v)  # [b, h_kv, s_k, d], s_k = cached + s_q
        else:
            q = self._cross_queries(x)  # [b, h, s_q, d]
            k, v = self._cross_keys_values(key_input, value_input, kv_cache)  # [b, h_kv, s_k, d] x 2
        bias = self._position_bias(position_bias, q, k.shape[2])  # [1, h, s_q, s_k] or None
        attended = self._attend_step(
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
        return MultiHeadOutput(self._output(attended.output), attended.weights)  # [b, s_q, e]

    forward = forward_of_record(forward_record)

    def _cross_queries(self, x: Tensor) -> Tensor:
        """The queries of cross-attention: ``x [b, s_q, e]`` → ``[b, h, s_q, d]``."""
        return self._norm_heads(self.q_norm, self._split_heads(self.q_proj(x), self.num_heads))

    def _cross_keys_values(
        self, key_input: Tensor, value_input: Tensor, kv_cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """The keys and values of cross-attention, ``[b, h_kv, s_k, d]`` x 2. They depend only
        on the context: a filled ``kv_cache`` gives them without projecting it again; an
        empty one keeps them."""
        if kv_cache is not None and len(kv_cache) > 0:
            cached_k, cached_v = kv_cache.keys, kv_cache.values  # [b, h_kv, s_k, d]
            assert cached_k is not None and cached_v is not None  # the cache is not empty
            return cached_k, cached_v
        k, v = self._context_keys_values(key_input, value_input)
        if kv_cache is not None:
            kv_cache.append(k, v)
        return k, v

    def _context_keys_values(self, key_input: Tensor, value_input: Tensor) -> tuple[Tensor, Tensor]:
        """The context ``[b, s_k, e_k]``, ``[b, s_k, e_v]`` projected to keys and values,
        ``[b, h_kv, s_k, d]`` x 2."""
        k = self._norm_heads(self.k_norm, self._split_heads(self.k_proj(key_input), self.num_kv_heads))
        v = self._split_heads(self.v_proj(value_input), self.num_kv_heads)
        return k, v

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
        """Every head's output ``[b, h, s_q, d]``, and the weights asked for: all of them
        (:meth:`_attend`), or those a :class:`~attnkit.nn.WeightSelection` chooses
        (:meth:`_attend_selected`). ``kv_cache`` and ``position_bias`` are the call's: they
        tell a subclass that keeps ``k`` or ``bias`` past the call whether someone may change
        them afterwards (:class:`attnkit.nn.MultiHeadAttention`'s caches do)."""
        if isinstance(return_weights, WeightSelection):
            return self._attend_selected(q, k, v, mask=mask, bias=bias, causal=causal, selection=return_weights)
        return self._attend(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=return_weights)

    def _output(self, heads: Tensor) -> Tensor:
        """The heads' outputs ``[b, h, s_q, d]`` merged and projected out: ``[b, s_q, e]``."""
        return self.out_proj(self._merge_heads(heads))

    def _position_bias(self, given: Tensor | None, q: Tensor, s_k: int) -> Tensor | None:
        """The positional encoding's score bias ``[1, h, s_q, s_k]`` for queries
        ``q [b, h, s_q, d]`` and ``s_k`` keys: ``given`` (in q's dtype) when the caller
        computed it, else computed here; ``None`` without a bias encoding."""
        if given is None:
            if self.positional is None:
                return None
            return self.positional.score_bias(q.shape[2], s_k, device=q.device, dtype=q.dtype)
        expected = (1, self.num_heads, q.shape[2], s_k)
        if self.positional is None or self.positional.takes_positions or given.shape != expected:
            raise ValueError(
                f"position_bias must be the score bias [1, h, s_q, s_k] = {list(expected)} of this module's "
                f"positional encoding, got {list(given.shape)} for positional="
                f"{type(self.positional).__name__ if self.positional is not None else None}"
            )
        return given if given.dtype == q.dtype else given.to(q.dtype)

    def _attend_selected(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        selection: WeightSelection,
    ) -> AttentionResult:
        """Every head's output as a pass without weights computes it, and the weights of
        the heads and rows ``selection`` chooses, ``[b, n_h, n_r, s_k]`` float32
        (:meth:`_selected_weights`): no other head's weights are formed. A score module,
        whose scores only its full path computes, gives the chosen part of every head's
        weights; a kernel other than ``"auto"`` refuses, as for ``return_weights=True``."""
        heads = selection.head_indices(self.num_heads)
        selection.row_range(q.shape[2])  # checked before the pass
        if isinstance(self.score, nn.Module) or self.kernel != "auto":
            full = self._attend(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=True)
            assert full.weights is not None  # asked for
            return AttentionResult(full.output, selection.take(full.weights).float())
        output = self._attend(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=False).output
        weights = self._selected_weights(q, k, mask=mask, bias=bias, causal=causal, heads=heads, rows=selection)
        return AttentionResult(output, weights)

    def _selected_weights(
        self,
        q: Tensor,
        k: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        heads: list[int],
        rows: WeightSelection,
    ) -> Tensor:
        """The weights of ``heads`` on the rows ``rows`` chooses, ``[b, n_h, n_r, s_k]``
        float32, as :meth:`_pattern` forms every head's: the same scale, soft-capping,
        window, mask and bias, a chunk of rows at a time
        (:func:`attnkit.functional.iter_weights_on_demand`), each written into the result.
        Beside the result a chunk holds a :data:`SELECTED_CHUNK_SHARE`-th of its scores
        (within :data:`SELECTED_CHUNK_ELEMENTS`)."""
        b, s_q, s_k = q.shape[0], q.shape[2], k.shape[2]
        chosen = rows.row_range(s_q)
        options = self._score_options()
        out = empty_large((b, len(heads), len(chosen), s_k), torch.float32, q.device)  # [b, n_h, n_r, s_k]
        row_elements = max(1, b * len(heads) * s_k)
        lowest, highest = SELECTED_CHUNK_ELEMENTS
        elements = min(max(row_elements * len(chosen) // SELECTED_CHUNK_SHARE, lowest), highest)
        chunk = max(1, elements // row_elements)
        for r, w in iter_weights_on_demand(
            q,
            k,
            heads=heads,
            rows=slice(chosen.start, chosen.stop),
            mask=options.windowed(mask, s_q, s_k),
            bias=bias,
            causal=causal,
            scale=options.scale_for(q.shape[-1]),
            softcap=options.softcap,
            dtype=torch.float32,
            chunk_size=chunk,
        ):
            start = int(r[0]) - chosen.start
            out[:, :, start : start + r.numel()] = w
        return out

    def _self_projections(self, x: Tensor, positions: Tensor | None, past: int) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of self-attention, with the positional rotation.

        Args:
            x: ``[b, s, e]``.
            positions: explicit token positions, or ``None`` for ``past .. past + s - 1``.
            past: the number of cached positions.

        Returns:
            ``q [b, h, s, d]``, ``k [b, h_kv, s, d]``, ``v [b, h_kv, s, d]``.
        """
        h, h_kv = self.num_heads, self.num_kv_heads
        if self._packed is not None and self._packed.usable(x):
            qkv = self._split_heads(self._packed(x), h + 2 * h_kv)  # [b, h + 2 h_kv, s, d]
            if self._rotates_side_by_side:
                # Queries and keys side by side: one rotation pass for both.
                qk = self._rotate(qkv[:, : h + h_kv], positions, past)  # [b, h + h_kv, s, d]
                return qk[:, :h], qk[:, h:], qkv[:, h + h_kv :]
            q, k, v = qkv[:, :h], qkv[:, h : h + h_kv], qkv[:, h + h_kv :]
        else:
            q = self._split_heads(self.q_proj(x), h)  # [b, h, s, d]
            k = self._split_heads(self.k_proj(x), h_kv)  # [b, h_kv, s, d]
            v = self._split_heads(self.v_proj(x), h_kv)  # [b, h_kv, s, d]
        q, k = self._norm_heads(self.q_norm, q), self._norm_heads(self.k_norm, k)
        q, k = self._rotate_queries_keys(q, k, positions, past)
        return q, k, v

    @property
    def _rotates_side_by_side(self) -> bool:
        """Whether packed queries and keys may be rotated in one pass, side by side: nothing
        (a per-head norm) comes between their projection and their rotation."""
        return self.q_norm is None and self.k_norm is None

    def _rotate_queries_keys(self, q: Tensor, k: Tensor, positions: Tensor | None, past: int) -> tuple[Tensor, Tensor]:
        """The positional rotation of queries ``[b, h, s, d]`` and keys ``[b, h_kv, s, d]``."""
        return self._rotate(q, positions, past), self._rotate(k, positions, past)

    @staticmethod
    def _norm_heads(norm: nn.Module | None, t: Tensor) -> Tensor:
        """A per-head norm over the head dim of ``[b, heads, s, d]``, if there is one."""
        return t if norm is None else norm(t)

    def _rotate(self, t: Tensor, positions: Tensor | None, past: int) -> Tensor:
        """The positional encoding's rotation of queries or keys ``[b, heads, s, d]``."""
        if self.positional is None or not self.positional.takes_positions:
            return t  # a bias encoding leaves them as they are
        if positions is None:
            return self.positional.rotate_from(t, past)
        return self.positional.rotate(t, positions)

    @property
    def _inputs_replaceable(self) -> bool:
        """Whether ``q``, ``k`` and ``v`` may come from elsewhere than this module's
        projections (a hook's), so that attention checks them as it would a caller's:
        never here."""
        return False

    def _score_options(self) -> ScoreOptions:
        """What this module forms its scores with besides queries, keys, mask and bias."""
        return ScoreOptions(self.score, self.scale, self.softcap, self.window)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        return_weights: bool,
        edit_scores: Callable[[Tensor], Tensor] | None = None,
        edit_weights: Callable[[Tensor], Tensor] | None = None,
    ) -> AttentionResult:
        """Every head at once, by the constructor's kernel: the one place attention runs.
        The weights are ``None`` unless asked for; the edits (only with the ``"auto"``
        kernel) read or replace scores and weights (:func:`attnkit.functional.attention`)."""
        if self.kernel != "auto":
            out = self._attend_with_kernel(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=return_weights)
            return AttentionResult(out)
        options = self._score_options()
        score, scale = options.score_and_scale(q.shape[-1])
        weights_seen = return_weights or edit_scores is not None or edit_weights is not None
        if self.window is not None and k.shape[2] > self.window and _one_query(q, mask, bias) and not weights_seen:
            # One query (a decoding step) sees the last `window` keys: attend to those alone,
            # with no mask to build, at a cost that stops growing with the text.
            unseen = k.shape[2] - self.window
            k, v = k.narrow(2, unseen, self.window), v.narrow(2, unseen, self.window)
        else:
            mask = options.windowed(mask, q.shape[2], k.shape[2])
        # This module made q, k and v and checked its options when built: they need no
        # checks per call, unless something else may have replaced them.
        result = (attention if self._inputs_replaceable else attention_of_checked)(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            scale=scale,
            score=score,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights,
            edit_scores=edit_scores,
            edit_weights=edit_weights,
            **self.kernel_options,
        )
        return result if isinstance(result, AttentionResult) else AttentionResult(result)

    def _attend_with_kernel(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Mask | Tensor | None,
        bias: Tensor | None,
        causal: bool,
        return_weights: bool,
    ) -> Tensor:
        """A long-sequence kernel (``local``, ``sparse``, ``linear``, ``tiled``) with the
        constructor's ``kernel_options``, e.g. ``{"window": 256}`` for ``local``."""
        if return_weights:
            raise ValueError(
                f"kernel {self.kernel!r} does not return attention weights; use kernel='auto' to see them, "
                "or attnkit.weights_on_demand for chosen rows of a long sequence"
            )
        options = dict(self.kernel_options)
        if mask is not None or bias is not None:
            if not KERNEL_SPECS[self.kernel].takes_mask:
                raise ValueError(
                    f"kernel {self.kernel!r} takes no mask or score bias (ALiBi, relative positions); "
                    f"its pattern comes from kernel_options={self.kernel_options}. Use kernel='tiled' for masks"
                )
            options.update(mask=mask, bias=bias)
        return KERNEL_SPECS[self.kernel].function(q, k, v, causal=causal, **options)

    def _merge_heads(self, heads: Tensor) -> Tensor:
        """``[b, h, s, d]`` → ``[b, s, h · d]``, what the output projection reads."""
        b, _, s, _ = heads.shape
        return heads.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)

    @staticmethod
    def _split_heads(t: Tensor, heads: int) -> Tensor:
        """``[b, s, heads * d]`` → ``[b, heads, s, d]``."""
        b, s, width = t.shape
        # The head dim is explicit: with b or s zero a -1 could be anything.
        return t.view(b, s, heads, width // heads).transpose(1, 2)

    def _check_forward(
        self, x: Tensor, context: Context | None, positions: Tensor | None, kv_cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Validate the inputs; return the key and value inputs (``x`` for self-attention)."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"x must be a floating-point tensor, got {got}")
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must be [b, s_q, e] with e = {self.embed_dim}, got {list(x.shape)}")
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be an attnkit.nn.KVCache, got {type(kv_cache).__name__}")
        if positions is not None and self.positional is not None and not self.positional.takes_positions:
            raise ValueError(
                f"positions= cannot move {type(self.positional).__name__}, which biases scores by "
                "row/column distance; drop positions= or use a rotary encoding"
            )
        if context is None:
            if self.kdim != self.embed_dim or self.vdim != self.embed_dim:
                raise ValueError(
                    f"self-attention needs kdim == vdim == embed_dim, but this module has embed_dim="
                    f"{self.embed_dim}, kdim={self.kdim}, vdim={self.vdim}; pass context="
                )
            return x, x
        if self.positional is not None:
            raise ValueError(
                f"{type(self.positional).__name__} applies to self-attention only; "
                "build the cross-attention without positional="
            )
        key_input, value_input = context if isinstance(context, tuple) else (context, context)
        for name, t, dim in (("key input", key_input, self.kdim), ("value input", value_input, self.vdim)):
            if not isinstance(t, Tensor) or t.ndim != 3 or t.shape[-1] != dim or t.shape[0] != x.shape[0]:
                shape = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"context {name} must be [b, s_k, {dim}] with b = {x.shape[0]} (the batch of x), got {shape}"
                )
        if key_input.shape[1] != value_input.shape[1]:
            raise ValueError(
                f"key and value inputs must have the same length, got {list(key_input.shape)} and "
                f"{list(value_input.shape)}"
            )
        return key_input, value_input

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> Self:
        """An equivalent module with a copy of the weights of ``torch.nn.MultiheadAttention``.

        The result is always batch-first (``[b, s, e]``): for a module built with
        ``batch_first=False``, transpose its ``[s, b, e]`` inputs. Convert its
        ``attn_mask`` / ``key_padding_mask`` with :func:`attnkit.nn.mask_from_torch`.

        Args:
            m: the torch module.

        Returns:
            A module of this class on the same device and dtype.

        Raises:
            TypeError: ``m`` is not an ``nn.MultiheadAttention``.
            ValueError: ``m`` uses ``add_bias_kv`` or ``add_zero_attn``, which have no
                counterpart here.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        # Built without storage, then given copies of the source's tensors: the result has
        # exactly their dtype, device and values.
        with torch.device("meta"):
            config = AttentionConfig(
                m.embed_dim, m.num_heads, kdim=m.kdim, vdim=m.vdim, bias=m.in_proj_bias is not None, dropout=m.dropout
            )
            new = cls(config)
        new.load_state_dict(state_dict_from_torch_attention(m), strict=True, assign=True)
        return new

    def extra_repr(self) -> str:
        parts = [f"embed_dim={self.embed_dim}", f"num_heads={self.num_heads}"]
        if self.num_kv_heads != self.num_heads:
            parts.append(f"num_kv_heads={self.num_kv_heads}")
        if isinstance(self.score, str):
            parts.append(f"score={self.score!r}")
        if self.kernel != "auto":
            parts.append(f"kernel={self.kernel!r}")
        if self.kernel_options:
            parts.append(f"kernel_options={self.kernel_options}")
        if self.head_dim * self.num_heads != self.embed_dim:
            parts.append(f"head_dim={self.head_dim}")
        parts += [f"{name}={value}" for name in ("scale", "softcap", "window") if (value := getattr(self, name))]
        return ", ".join(parts)


def _check_kernel_computes(kernel: str, score: object, dropout: float) -> None:
    """Every kernel but ``"auto"`` computes scaled dot-product attention without dropout."""
    if not KERNEL_SPECS[kernel].full and (score != "scaled_dot" or dropout > 0):
        raise ValueError(
            f"kernel {kernel!r} computes scaled dot-product attention without dropout; "
            f"got score={score!r}, dropout={dropout} (use kernel='auto')"
        )


def _check_score_options(kernel: str, scale: float | None, softcap: float | None, window: int | None) -> None:
    """``scale``, ``softcap`` and ``window`` are options of the ``"auto"`` kernel, each a
    positive number."""
    given = [name for name, value in (("scale", scale), ("softcap", softcap), ("window", window)) if value is not None]
    if kernel != "auto" and given:
        raise ValueError(f"{', '.join(given)} need kernel='auto', got kernel={kernel!r}")
    for name, value in (("scale", scale), ("softcap", softcap)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int, got {window!r}")


def _check_sizes(
    embed_dim: int, num_heads: int, num_kv_heads: int, kdim: int, vdim: int, head_dim: int | None = None
) -> None:
    for name, value in (
        ("embed_dim", embed_dim),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("kdim", kdim),
        ("vdim", vdim),
        *((("head_dim", head_dim),) if head_dim is not None else ()),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if head_dim is None and embed_dim % num_heads:
        raise ValueError(
            f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and num_heads={num_heads}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads must be divisible by num_kv_heads, got num_heads={num_heads} and num_kv_heads={num_kv_heads}"
        )


def _check_score_module(score: AttentionScore, config: AttentionConfig, head_dim: int) -> AttentionScore:
    """A score module that can replace the dot product of this attention."""
    if not isinstance(score, AttentionScore):
        raise TypeError(
            f"score_module must be an attnkit.nn.AttentionScore (AdditiveAttention, LuongAttention), "
            f"got {type(score).__name__}"
        )
    if config.score != "scaled_dot":
        raise ValueError(f"score_module replaces config.score; got both it and score={config.score!r}")
    _check_kernel_computes(config.kernel, score, config.dropout)
    if config.softcap is not None:
        raise ValueError(f"softcap applies to dot-product scores, got a score module {score!r}")
    if (score.query_dim, score.key_dim) != (head_dim, head_dim):
        raise ValueError(
            f"score module must compare head-dim vectors, query_dim = key_dim = {head_dim}, got "
            f"query_dim={score.query_dim}, key_dim={score.key_dim}"
        )
    return score


def _check_positional(
    positional: AttentionPositional | None, num_heads: int, head_dim: int
) -> AttentionPositional | None:
    if positional is None:
        return None
    if not isinstance(positional, AttentionPositional):
        raise TypeError(
            f"positional must be an AttentionPositional (RotaryEmbedding, ALiBi, RelativePositionBias), got "
            f"{type(positional).__name__}; absolute encodings are added to the embeddings, not given to attention"
        )
    if positional.num_heads is not None and positional.num_heads != num_heads:
        raise ValueError(
            f"{type(positional).__name__} was built for {positional.num_heads} heads, "
            f"but this attention has {num_heads}"
        )
    if positional.head_dim is not None and positional.head_dim != head_dim:
        raise ValueError(
            f"{type(positional).__name__} was built for head_dim {positional.head_dim}, but this attention has "
            f"head_dim {head_dim}"
        )
    return positional


def state_dict_from_torch_attention(m: nn.MultiheadAttention) -> dict[str, Tensor]:
    """The weights of ``torch.nn.MultiheadAttention`` under :class:`Attention`'s
    keys, copied (torch packs q/k/v into one ``[3e, e]`` matrix when ``kdim == vdim == e``).

    Args:
        m: the torch module.

    Returns:
        ``{"q_proj.weight": ..., ..., "out_proj.bias": ...}``, biases when ``m`` has them.
    """
    if m.in_proj_weight is not None:
        weights = m.in_proj_weight.chunk(3)
    else:
        weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    names = ("q_proj", "k_proj", "v_proj")
    state = {f"{name}.weight": w for name, w in zip(names, weights)}
    state["out_proj.weight"] = m.out_proj.weight
    if m.in_proj_bias is not None:
        state.update({f"{name}.bias": b for name, b in zip(names, m.in_proj_bias.chunk(3))})
        state["out_proj.bias"] = m.out_proj.bias
    return {key: t.detach().clone() for key, t in state.items()}


def _one_query(q: Tensor, mask: Mask | Tensor | None, bias: Tensor | None) -> bool:
    """Whether queries ``q [b, h, s_q, d]`` are one position (a decoding step) that no mask
    or bias restricts: a sliding window then keeps the last ``window`` keys alone."""
    return q.shape[2] == 1 and mask is None and bias is None
