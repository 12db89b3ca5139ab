"""Attention masks as small pure functions of ``(b, h, q_idx, kv_idx)``.

A :class:`Mask` answers "may query ``q_idx`` attend to key ``kv_idx``?" for batch ``b`` and
head ``h``; ``True`` means *may attend* (the SDPA convention). Masks compose with ``&``,
``|`` and ``~`` and carry a readable name, so ``causal() & sliding_window(4)`` prints as
``causal & sliding_window(left=4, right=0)``.

Positions are *absolute*: when there are fewer queries than keys (decoding with a KV cache),
query row ``i`` sits at position ``i + s_k - s_q``. That makes :func:`causal` aligned
bottom-right, so the same mask stays right for a prefill and for every decoding step.

The index arguments are integer tensors that broadcast against each other; a mask function
must use only elementwise tensor operations so that it evaluates densely
(:meth:`Mask.to_dense`), per block (sparse kernels) and under FlexAttention's ``vmap``.

A mask may also carry a *block test* (:attr:`Mask.blocks`): given the spans of positions of a
block of queries and a block of keys, it says whether the block may hold an allowed pair and
whether every pair in it is allowed, without evaluating the pairs. Block-sparse kernels use it
to skip empty blocks; it composes with ``&``, ``|`` and ``~`` like the masks themselves.

Adapters to and from other conventions live at the bottom of this file, each named for the
convention it speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

MaskFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class Span(NamedTuple):
    """Where the positions of one block of queries (or keys) lie, for block tests.

    Every position ``p`` of the block has ``lo <= p <= hi``; where ``residue >= 0`` (and
    ``period > 0``) also ``p % period == residue``. ``lo``, ``hi`` and ``residue`` are
    integer tensors that broadcast like the index grid (one entry per block).
    """

    lo: Tensor
    hi: Tensor
    period: int = 0
    residue: Tensor | None = None


# blocks(b, h, q_span, kv_span) -> (some, every), bool tensors broadcastable to
# [b, h, n_q_blocks, n_kv_blocks]. Conservative: `some` False means no pair of the block is
# allowed; `every` True means every pair is. Either may err only towards "don't know"
# (some True, every False), which costs speed, never correctness.
BlockFn = Callable[[Tensor, Tensor, Span, Span], tuple[Tensor, Tensor]]

# Multipliers of the hash behind random(): large odd constants, so nearby (q, kv) pairs
# land far apart and the pattern looks uniform.
_HASH_Q = 0x5BD1E995
_HASH_KV = 0x27D4EB2F
_HASH_SEED = 0x165667B1
_HASH_MOD = 1 << 31


@dataclass(frozen=True)
class Mask:
    """A composable attention mask; ``True`` = may attend.

    Attributes:
        fn: ``fn(b, h, q_idx, kv_idx) -> bool tensor``, elementwise and broadcasting.
        name: readable description, shown by ``repr``.
        batch_size: how many batch entries the mask distinguishes, or ``None`` when it is
            the same for every batch entry.
        num_heads: how many heads the mask distinguishes, or ``None`` when it is the same
            for every head.
        shape: ``(s_q, s_k)`` for a mask that only exists for one size (``from_dense``),
            else ``None``.
        blocks: optional block test ``blocks(b, h, q_span, kv_span) -> (some, every)``
            (see :class:`Span`); ``None`` when the mask can only be evaluated pair by pair.
    """

    fn: MaskFn
    name: str
    batch_size: int | None = None
    num_heads: int | None = None
    shape: tuple[int, int] | None = None
    blocks: BlockFn | None = field(default=None, compare=False, repr=False)

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.fn(b, h, q_idx, kv_idx)

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def __and__(self, other: Mask) -> Mask:
        return _combine(self, other, "&", torch.logical_and)

    def __or__(self, other: Mask) -> Mask:
        return _combine(self, other, "|", torch.logical_or)

    def __invert__(self) -> Mask:
        fn, blocks = self.fn, self.blocks
        return Mask(
            lambda b, h, q, kv: ~_as_bool(fn(b, h, q, kv)),
            f"~({self.name})",
            self.batch_size,
            self.num_heads,
            self.shape,
            None if blocks is None else _invert_blocks(blocks),
        )

    def to_dense(
        self,
        s_q: int,
        s_k: int,
        *,
        batch_size: int | None = None,
        num_heads: int | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Evaluate the mask for every query and key.

        Args:
            s_q: number of queries.
            s_k: number of keys; query row ``i`` is at position ``i + s_k - s_q``.
            batch_size: evaluate for this many batch entries; defaults to the mask's own
                ``batch_size`` (1 when it does not vary over the batch).
            num_heads: likewise for heads.
            device: where to build the index tensors (default: the mask's own tensors'
                device, else CPU).

        Returns:
            Bool tensor ``[b, h, s_q, s_k]`` where ``b`` is 1 unless the mask varies over
            the batch (or ``batch_size`` is given), and ``h`` likewise.

        Raises:
            ValueError: lengths are negative, or they do not fit the mask's own sizes.
        """
        if s_q < 0 or s_k < 0:
            raise ValueError(f"s_q and s_k must be >= 0, got s_q={s_q}, s_k={s_k}")
        if self.shape is not None and self.shape != (s_q, s_k):
            raise ValueError(
                f"mask {self.name} is defined for (s_q, s_k) = {self.shape}, "
                f"got ({s_q}, {s_k})"
            )
        n_b = _resolve_size("batch_size", self.batch_size, batch_size)
        n_h = _resolve_size("num_heads", self.num_heads, num_heads)
        b, h, q_idx, kv_idx = index_grid(n_b, n_h, s_q, s_k, device=device)
        dense = _as_bool(self.fn(b, h, q_idx, kv_idx))  # broadcast of [b|1, h|1, s_q|1, s_k|1]
        return dense.expand(n_b, n_h, s_q, s_k)  # [b, h, s_q, s_k]


def index_grid(
    n_b: int, n_h: int, s_q: int, s_k: int, *, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Broadcastable index tensors ``b [n_b,1,1,1]``, ``h [1,n_h,1,1]``, ``q [1,1,s_q,1]``
    (absolute positions, aligned bottom-right) and ``kv [1,1,1,s_k]``."""
    b = torch.arange(n_b, device=device).view(n_b, 1, 1, 1)
    h = torch.arange(n_h, device=device).view(1, n_h, 1, 1)
    q_idx = torch.arange(s_q, device=device).view(1, 1, s_q, 1) + (s_k - s_q)
    kv_idx = torch.arange(s_k, device=device).view(1, 1, 1, s_k)
    return b, h, q_idx, kv_idx


def _as_bool(t: Tensor | bool) -> Tensor:
    return t if isinstance(t, Tensor) and t.dtype == torch.bool else torch.as_tensor(t).bool()


def _resolve_size(what: str, own: int | None, asked: int | None) -> int:
    if asked is None:
        return own or 1
    if own is not None and own != asked:
        raise ValueError(f"mask varies over {own} entries of {what}, but {what}={asked} was asked")
    return asked


def _merge_size(what: str, a: int | None, b: int | None) -> int | None:
    if a is not None and b is not None and a != b:
        raise ValueError(f"cannot combine masks with different {what}: {a} and {b}")
    return a if a is not None else b


def _combine(left: Mask, right: Mask, symbol: str, op: Callable[[Tensor, Tensor], Tensor]) -> Mask:
    if not isinstance(right, Mask):
        raise TypeError(f"can only combine a Mask with a Mask, got {type(right).__name__}")
    if left.shape is not None and right.shape is not None and left.shape != right.shape:
        raise ValueError(f"cannot combine masks of sizes {left.shape} and {right.shape}")
    lf, rf = left.fn, right.fn
    blocks = None
    if left.blocks is not None and right.blocks is not None:
        blocks = _combine_blocks(left.blocks, right.blocks, op)
    return Mask(
        lambda b, h, q, kv: op(_as_bool(lf(b, h, q, kv)), _as_bool(rf(b, h, q, kv))),
        f"({left.name} {symbol} {right.name})",
        _merge_size("batch_size", left.batch_size, right.batch_size),
        _merge_size("num_heads", left.num_heads, right.num_heads),
        left.shape or right.shape,
        blocks,
    )


def _combine_blocks(left: BlockFn, right: BlockFn, op: Callable[[Tensor, Tensor], Tensor]) -> BlockFn:
    # For & and | the bounds combine with the same operator and stay conservative:
    # some(a & b) <= some(a) & some(b); every(a | b) >= every(a) | every(b).
    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        some_l, every_l = left(b, h, q, kv)
        some_r, every_r = right(b, h, q, kv)
        return op(some_l, some_r), op(every_l, every_r)

    return blocks


def _invert_blocks(inner: BlockFn) -> BlockFn:
    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        some, every = inner(b, h, q, kv)
        return ~every, ~some

    return blocks


def _constant_blocks(value: bool) -> BlockFn:
    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        t = torch.full(torch.broadcast_shapes(q.lo.shape, kv.lo.shape), value, dtype=torch.bool, device=q.lo.device)
        return t, t

    return blocks


# ---------------------------------------------------------------------------------------
# The masks.
# ---------------------------------------------------------------------------------------


def full() -> Mask:
    """Every query may attend to every key (bidirectional attention)."""
    return Mask(lambda b, h, q, kv: torch.ones_like(q - kv, dtype=torch.bool), "full", blocks=_constant_blocks(True))


def causal() -> Mask:
    """Query at position ``i`` may attend to keys ``<= i`` (aligned bottom-right)."""
    return Mask(lambda b, h, q, kv: kv <= q, "causal", blocks=lambda b, h, q, kv: (kv.lo <= q.hi, kv.hi <= q.lo))


def sliding_window(left: int, right: int = 0) -> Mask:
    """Query at ``i`` may attend to keys in ``[i - left, i + right]``.

    ``sliding_window(w)`` alone is causal local attention of width ``w + 1``;
    ``sliding_window(w, w)`` is the symmetric ±w window of bidirectional local attention.

    Raises:
        ValueError: a negative window.
    """
    _check_int("left", left, minimum=0)
    _check_int("right", right, minimum=0)
    return Mask(
        lambda b, h, q, kv: (kv >= q - left) & (kv <= q + right),
        f"sliding_window(left={left}, right={right})",
        blocks=lambda b, h, q, kv: (
            (kv.lo <= q.hi + right) & (kv.hi >= q.lo - left),
            (kv.lo >= q.hi - left) & (kv.hi <= q.lo + right),
        ),
    )


def padding(lengths: Sequence[int] | Tensor) -> Mask:
    """Key padding: in batch entry ``b``, only the first ``lengths[b]`` keys are real.

    Raises:
        ValueError: ``lengths`` is empty, not 1-D, or has negative entries.
    """
    lengths_t = torch.as_tensor(lengths)
    if lengths_t.ndim != 1 or lengths_t.numel() == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence, got shape {list(lengths_t.shape)}")
    if lengths_t.is_floating_point() or lengths_t.dtype == torch.bool:
        raise TypeError(f"lengths must be integers, got dtype {lengths_t.dtype}")
    if (lengths_t < 0).any():
        raise ValueError(f"lengths must be >= 0, got {lengths_t.tolist()}")

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return kv < lengths_t.to(b.device)[b]

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        length = lengths_t.to(b.device)[b]
        return kv.lo < length, kv.hi < length

    return Mask(fn, f"padding({lengths_t.tolist()})", batch_size=lengths_t.numel(), blocks=blocks)


def strided(stride: int) -> Mask:
    """Sparse Transformer's strided pattern: keys a multiple of ``stride`` away.

    Combine with :func:`causal` and a :func:`sliding_window` of ``stride - 1`` for the
    paper's two strided heads in one mask.

    Raises:
        ValueError: ``stride < 1``.
    """
    _check_int("stride", stride, minimum=1)

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        lo, hi = q.lo - kv.hi, q.hi - kv.lo  # every difference q - kv lies in [lo, hi]
        some = torch.div(hi, stride, rounding_mode="floor") * stride >= lo
        every = ((lo == hi) & (torch.remainder(lo, stride) == 0)) | (stride == 1)
        residues_known = (
            q.residue is not None and kv.residue is not None and q.period > 0 and kv.period > 0
            and q.period % stride == 0 and kv.period % stride == 0
        )
        if residues_known:  # blocks of tokens that share their position mod stride
            known = (q.residue >= 0) & (kv.residue >= 0)
            same = torch.remainder(q.residue - kv.residue, stride) == 0
            some, every = torch.where(known, same, some), torch.where(known, same, every)
        return some, every

    return Mask(lambda b, h, q, kv: torch.remainder(q - kv, stride) == 0, f"strided({stride})", blocks=blocks)


def fixed(block: int, summary: int) -> Mask:
    """Sparse Transformer's fixed pattern: keys in the query's own block of ``block``
    tokens, and the last ``summary`` tokens of every block (the "summary" cells).

    Raises:
        ValueError: ``block < 1`` or ``summary`` outside ``[0, block]``.
    """
    _check_int("block", block, minimum=1)
    _check_int("summary", summary, minimum=0)
    if summary > block:
        raise ValueError(f"summary must be <= block, got summary={summary}, block={block}")

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        q_first, q_last = torch.div(q.lo, block, rounding_mode="floor"), torch.div(q.hi, block, rounding_mode="floor")
        kv_first, kv_last = torch.div(kv.lo, block, rounding_mode="floor"), torch.div(kv.hi, block, rounding_mode="floor")
        # A key span that crosses a block boundary holds the last token of a block.
        holds_summary = ((kv_last > kv_first) | (torch.remainder(kv.hi, block) >= block - summary)) & (summary > 0)
        some = ((q_first <= kv_last) & (kv_first <= q_last)) | holds_summary
        one_block = (q_first == q_last) & (kv_first == kv_last) & (q_first == kv_first)
        all_summary = (kv_first == kv_last) & (torch.remainder(kv.lo, block) >= block - summary)
        return some, one_block | all_summary

    return Mask(
        lambda b, h, q, kv: (torch.div(q, block, rounding_mode="floor") == torch.div(kv, block, rounding_mode="floor"))
        | (torch.remainder(kv, block) >= block - summary),
        f"fixed(block={block}, summary={summary})",
        blocks=blocks,
    )


def random(density: float, seed: int = 0) -> Mask:
    """Each (query, key) pair is kept with probability ``density``, deterministically in
    ``seed``: a hash of the positions, so any block of the mask can be evaluated alone.

    Raises:
        ValueError: ``density`` outside ``[0, 1]``.
    """
    if not 0.0 <= float(density) <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    _check_int("seed", seed, minimum=0)
    threshold = int(round(float(density) * _HASH_MOD))
    salt = (seed * _HASH_SEED) % _HASH_MOD

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        mixed = (q * _HASH_Q + kv * _HASH_KV + salt) % _HASH_MOD
        mixed = (mixed ^ (mixed >> 15)) * _HASH_Q % _HASH_MOD
        mixed = mixed ^ (mixed >> 13)
        return mixed < threshold

    return Mask(fn, f"random(density={density}, seed={seed})")


def global_tokens(indices: Sequence[int] | Tensor) -> Mask:
    """Tokens at ``indices`` attend to everything and everything attends to them
    (Longformer / BigBird global attention).

    Raises:
        ValueError: ``indices`` is not 1-D or has negative entries.
    """
    idx = torch.as_tensor(indices, dtype=torch.long)
    if idx.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {list(idx.shape)}")
    if (idx < 0).any():
        raise ValueError(f"indices must be >= 0, got {idx.tolist()}")

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        g = idx.to(q.device)
        # A comparison against every index (not torch.isin) so that vmap can trace it.
        q_is_global = (q.unsqueeze(-1) == g).any(-1)
        kv_is_global = (kv.unsqueeze(-1) == g).any(-1)
        return q_is_global | kv_is_global

    sorted_unique = torch.unique(idx)

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        g = sorted_unique.to(q.lo.device)

        def count(span: Span) -> Tensor:  # global tokens inside [lo, hi]
            return torch.searchsorted(g, span.hi.contiguous(), right=True) - torch.searchsorted(g, span.lo.contiguous())

        q_count, kv_count = count(q), count(kv)
        some = (q_count > 0) | (kv_count > 0)
        every = (q_count == q.hi - q.lo + 1) | (kv_count == kv.hi - kv.lo + 1)
        return some, every

    return Mask(fn, f"global_tokens({idx.tolist()})", blocks=blocks)


def document(ids: Sequence[int] | Tensor) -> Mask:
    """Packed sequences: a token attends only to tokens of its own document.

    Args:
        ids: document id of the token at each absolute position, ``[n]`` (the same for
            every batch entry) or ``[b, n]``; ``n`` must cover every key position. When the
            ids never decrease along the sequence (documents laid end to end), the mask
            carries an exact block test, so block-sparse kernels skip pairs of blocks from
            different documents without evaluating them.

    Raises:
        TypeError: ``ids`` are not integers.
        ValueError: ``ids`` is not 1-D or 2-D, or is empty.
    """
    ids_t = torch.as_tensor(ids)
    if ids_t.is_floating_point() or ids_t.dtype == torch.bool:
        raise TypeError(f"document ids must be integers, got dtype {ids_t.dtype}")
    if ids_t.ndim not in (1, 2) or ids_t.shape[-1] == 0:
        raise ValueError(f"document ids must be a non-empty [n] or [b, n] tensor, got shape {list(ids_t.shape)}")
    ids_t = ids_t.long()
    per_batch = ids_t.ndim == 2
    table = ids_t if per_batch else ids_t.unsqueeze(0)  # [b|1, n]

    n = table.shape[-1]

    low = int(table.min())

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        # A position outside [0, n) belongs to no document (two ids no token has, so that
        # it matches nothing) and attends to nothing.
        t = table.to(q.device)
        row = b if per_batch else torch.zeros_like(b)
        q_doc = torch.where((q >= 0) & (q < n), t[row, q.clamp(0, n - 1)], low - 1)
        kv_doc = torch.where((kv >= 0) & (kv < n), t[row, kv.clamp(0, n - 1)], low - 2)
        return q_doc == kv_doc

    blocks = None
    if bool((table[:, 1:] >= table[:, :-1]).all()):

        def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
            t = table.to(q.lo.device)
            row = b if per_batch else torch.zeros_like(b)

            def ids(span: Span) -> tuple[Tensor, Tensor, Tensor, Tensor]:
                first, last = t[row, span.lo.clamp(0, n - 1)], t[row, span.hi.clamp(0, n - 1)]
                return first, last, (span.hi >= 0) & (span.lo < n), (span.lo >= 0) & (span.hi < n)

            q_first, q_last, q_some_inside, q_all_inside = ids(q)
            kv_first, kv_last, kv_some_inside, kv_all_inside = ids(kv)
            some = q_some_inside & kv_some_inside & (q_first <= kv_last) & (kv_first <= q_last)
            every = q_all_inside & kv_all_inside & (q_first == q_last) & (kv_first == kv_last) & (q_first == kv_first)
            return some, every

    n_docs = int(torch.unique(ids_t).numel())
    return Mask(
        fn,
        f"document({ids_t.shape[-1]} tokens, {n_docs} documents)",
        batch_size=ids_t.shape[0] if per_batch else None,
        blocks=blocks,
    )


def from_dense(allowed: Tensor) -> Mask:
    """Wrap a boolean tensor ``[s_q, s_k]``, ``[b|1, h|1, s_q, s_k]`` (``True`` = may
    attend) as a mask. Row ``i`` of the tensor is query row ``i``.

    Raises:
        TypeError: the tensor is not boolean.
        ValueError: it has fewer than 2 or more than 4 dimensions.
    """
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
        got = allowed.dtype if isinstance(allowed, Tensor) else type(allowed).__name__
        raise TypeError(f"from_dense expects a bool tensor (True = may attend), got {got}")
    if not 2 <= allowed.ndim <= 4:
        raise ValueError(f"from_dense expects 2 to 4 dimensions, got shape {list(allowed.shape)}")
    dense = allowed.reshape((1,) * (4 - allowed.ndim) + tuple(allowed.shape))  # [b|1, h|1, s_q, s_k]
    n_b, n_h, s_q, s_k = dense.shape
    offset = s_k - s_q

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        t = dense.to(q.device)
        return t[b if n_b > 1 else torch.zeros_like(b), h if n_h > 1 else torch.zeros_like(h), q - offset, kv]

    return Mask(
        fn,
        f"from_dense({list(allowed.shape)})",
        batch_size=n_b if n_b > 1 else None,
        num_heads=n_h if n_h > 1 else None,
        shape=(s_q, s_k),
    )


def _check_int(name: str, value: int, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


# ---------------------------------------------------------------------------------------
# Adapters between conventions.
# ---------------------------------------------------------------------------------------


def from_torch_mha(blocked: Tensor) -> Mask:
    """From an ``nn.MultiheadAttention`` boolean ``attn_mask`` (``True`` = blocked),
    ``[s_q, s_k]`` or ``[b * h, s_q, s_k]`` (give the latter reshaped to 4-D)."""
    if blocked.dtype != torch.bool:
        raise TypeError(f"expected a bool mask (True = blocked), got dtype {blocked.dtype}")
    return from_dense(~blocked)


def to_torch_mha(mask: Mask, s_q: int, s_k: int) -> Tensor:
    """To an ``nn.MultiheadAttention`` ``attn_mask`` ``[s_q, s_k]`` (``True`` = blocked).

    Raises:
        ValueError: the mask varies over batch or heads (``nn.MultiheadAttention`` wants
            those as ``key_padding_mask`` or a 3-D mask).
    """
    if mask.batch_size is not None or mask.num_heads is not None:
        raise ValueError(f"mask {mask.name} varies over batch or heads; a 2-D attn_mask cannot hold it")
    return ~mask.to_dense(s_q, s_k)[0, 0]


def from_hf_padding(attention_mask: Tensor) -> Mask:
    """From a Hugging Face 2-D ``attention_mask`` ``[b, s_k]`` (``1`` = keep, ``0`` = pad)."""
    if attention_mask.ndim != 2:
        raise ValueError(f"expected a 2-D [b, s_k] attention_mask, got shape {list(attention_mask.shape)}")
    keep = attention_mask.bool()
    n_b = keep.shape[0]

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return keep.to(kv.device)[b, kv]

    return Mask(fn, f"hf_padding({list(attention_mask.shape)})", batch_size=n_b)


def to_sdpa(
    mask: Mask,
    s_q: int,
    s_k: int,
    *,
    batch_size: int | None = None,
    num_heads: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """To a boolean ``attn_mask`` for ``F.scaled_dot_product_attention`` (``True`` = may
    attend), ``[b|1, h|1, s_q, s_k]``."""
    return mask.to_dense(s_q, s_k, batch_size=batch_size, num_heads=num_heads, device=device)


def to_block_mask(
    mask: Mask,
    s_q: int,
    s_k: int,
    *,
    batch_size: int | None = None,
    num_heads: int | None = None,
    device: torch.device | str = "cpu",
    block_size: int = 128,
):
    """To a FlexAttention ``BlockMask``. FlexAttention's ``mask_mod`` sees row indices;
    this adapter shifts them to our absolute (bottom-right) positions."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = s_k - s_q
    fn = mask.fn

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return _as_bool(fn(b, h, q_idx + offset, kv_idx))

    return create_block_mask(
        mask_mod,
        B=batch_size if batch_size is not None else mask.batch_size,
        H=num_heads if num_heads is not None else mask.num_heads,
        Q_LEN=s_q,
        KV_LEN=s_k,
        device=device,
        BLOCK_SIZE=block_size,
    )
