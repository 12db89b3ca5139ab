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
(:meth:`Mask.to_dense`), per block (sparse kernels) and inside a compiled FlexAttention
kernel. Compiled kernels impose three more rules, which every mask here follows:

- **pointwise only**: index tensors the mask captured, but create no tensor, move none
  (``.to``), and reduce nothing (``.any()``) inside the function. A mask that captures
  tensors knows how to rebuild itself on another device (:meth:`Mask.to`), so its function
  only ever sees tensors that are already where the indices are;
- **32-bit arithmetic**: GPU kernels hand the function ``int32`` indices, so no intermediate
  value may leave ``[-2**31, 2**31)`` — the hash behind :func:`random` stays below ``2**31``
  at every step and gives the same bits in eager code, on the CPU and on the GPU;
- **a stable identity**: :attr:`Mask.key` describes the mask by value, so kernels cache what
  they build from it (block masks, compiled code) across calls that rebuild the same mask.

A mask may also carry a *block test* (:attr:`Mask.blocks`): given the spans of positions of a
block of queries and a block of keys, it says whether the block may hold an allowed pair and
whether every pair in it is allowed, without evaluating the pairs. Block-sparse kernels use it
to skip empty blocks; it composes with ``&``, ``|`` and ``~`` like the masks themselves.

Adapters to and from other conventions live at the bottom of this file, each named for the
convention it speaks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
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

# The hash behind random() works modulo a prime below sqrt(2**31), so every product of two
# residues, plus the added constant, stays below 2**31: the same bits in int64 eager code and
# in the int32 arithmetic of compiled GPU kernels. Squaring makes it non-linear (a linear hash
# would keep whole diagonals together).
_HASH_PRIME = 46337
_HASH_MULTIPLIER = 40503
_HASH_SQUARE_ADD = 21011
_HASH_ADD = 17477
# Largest position an index may hold in a 32-bit kernel; larger window sizes mean "unbounded".
INDEX_MAX = (1 << 31) - 1
# Up to this many global tokens are tested by comparisons, more by a table lookup.
_FEW_GLOBAL_TOKENS = 8


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
        key: a hashable description of the mask by value (two masks with equal keys allow
            the same pairs), or ``None`` for a mask known only by its function.
        relocate: for a mask whose function captures tensors, ``relocate(device)`` builds
            the same mask with those tensors on ``device``; ``None`` when it captures none.
    """

    fn: MaskFn
    name: str
    batch_size: int | None = None
    num_heads: int | None = None
    shape: tuple[int, int] | None = None
    blocks: BlockFn | None = field(default=None, compare=False, repr=False)
    key: Hashable | None = field(default=None, compare=False, repr=False)
    relocate: Callable[[torch.device], Mask] | None = field(default=None, compare=False, repr=False)
    _on_device: dict[torch.device, Mask] = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.to(q_idx.device).fn(b, h, q_idx, kv_idx)

    def evaluate(self, q_pos: Tensor, kv_pos: Tensor, *, heads: Tensor | None = None) -> Tensor:
        """The mask on every pair of query positions ``q_pos`` and key positions ``kv_pos``,
        for every batch entry and head it distinguishes: what kernels call on the pairs of a
        block (positions absolute, as everywhere).

        Args:
            q_pos: ``[m]`` integer positions of the queries.
            kv_pos: ``[n]`` integer positions of the keys, on ``q_pos``'s device.
            heads: ``[n_h]`` the heads to evaluate, for a mask that varies over heads
                (default: all of its ``num_heads``); ignored by a mask that does not.

        Returns:
            Bool tensor ``[b|1, h|1, m, n]``: ``b`` is the mask's ``batch_size`` (1 when it
            does not vary over the batch); ``h`` is ``len(heads)`` or its ``num_heads`` (1
            when it does not vary over heads).
        """
        device = q_pos.device
        n_b = self.batch_size or 1
        b = torch.arange(n_b, device=device).view(n_b, 1, 1, 1)
        if self.num_heads is None:
            h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
        elif heads is None:
            h = torch.arange(self.num_heads, device=device).view(1, -1, 1, 1)
        else:
            h = heads.view(1, -1, 1, 1)
        m, n = q_pos.numel(), kv_pos.numel()
        allowed = unsqueeze_to_4d(_as_bool(self.to(device).fn(b, h, q_pos.view(1, 1, m, 1), kv_pos.view(1, 1, 1, n))))
        return allowed.expand(allowed.shape[0], allowed.shape[1], m, n)  # [b|1, h|1, m, n]

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def to(self, device: torch.device | str) -> Mask:
        """The same mask with every tensor its function captures on ``device`` (built once
        per device, then reused); the mask itself when it captures none."""
        if self.relocate is None:
            return self
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        moved = self._on_device.get(device)
        if moved is None:
            moved = self._on_device[device] = self.relocate(device)
        return moved

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
            key=None if self.key is None else ("~", self.key),
            relocate=None if self.relocate is None else (lambda device: ~self.to(device)),
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
            raise ValueError(f"mask {self.name} is defined for (s_q, s_k) = {self.shape}, got ({s_q}, {s_k})")
        n_b = _resolve_size("batch_size", self.batch_size, batch_size)
        n_h = _resolve_size("num_heads", self.num_heads, num_heads)
        b, h, q_idx, kv_idx = index_grid(n_b, n_h, s_q, s_k, device=device)
        dense = _as_bool(self(b, h, q_idx, kv_idx))  # broadcast of [b|1, h|1, s_q|1, s_k|1]
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


def unsqueeze_to_4d(x: Tensor) -> Tensor:
    """``x`` (a mask or bias of 4 dimensions or fewer) with size-1 dimensions put in front
    up to 4, a view: ``[s_q, s_k]`` → ``[1, 1, s_q, s_k]``, ``[h, s_q, s_k]`` →
    ``[1, h, s_q, s_k]``, which broadcasts against ``[b, h, s_q, s_k]`` as ``x`` did; ``x``
    itself when it has 4."""
    return x if x.ndim == 4 else x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))


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
    relocate = None
    if left.relocate is not None or right.relocate is not None:
        relocate = lambda device: _combine(left.to(device), right.to(device), symbol, op)  # noqa: E731
    return Mask(
        lambda b, h, q, kv: op(_as_bool(lf(b, h, q, kv)), _as_bool(rf(b, h, q, kv))),
        f"({left.name} {symbol} {right.name})",
        _merge_size("batch_size", left.batch_size, right.batch_size),
        _merge_size("num_heads", left.num_heads, right.num_heads),
        left.shape or right.shape,
        blocks,
        key=None if left.key is None or right.key is None else (symbol, left.key, right.key),
        relocate=relocate,
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
    # (q - kv) == (q - kv): an all-True result of the broadcast shape, without creating a
    # tensor inside the function.
    return Mask(lambda b, h, q, kv: (q - kv) == (q - kv), "full", blocks=_constant_blocks(True), key=("full",))


def causal() -> Mask:
    """Query at position ``i`` may attend to keys ``<= i`` (aligned bottom-right)."""
    return Mask(
        lambda b, h, q, kv: kv <= q,
        "causal",
        blocks=lambda b, h, q, kv: (kv.lo <= q.hi, kv.hi <= q.lo),
        key=("causal",),
    )


def sliding_window(left: int, right: int = 0) -> Mask:
    """Query at ``i`` may attend to keys in ``[i - left, i + right]``.

    ``sliding_window(w)`` alone is causal local attention of width ``w + 1``;
    ``sliding_window(w, w)`` is the symmetric ±w window of bidirectional local attention.
    Sizes beyond :data:`INDEX_MAX` (``2**31 - 1``) reach every position there is and are
    taken as that.

    Raises:
        ValueError: a negative window.
    """
    check_int("left", left, minimum=0)
    check_int("right", right, minimum=0)
    name = f"sliding_window(left={left}, right={right})"
    left, right = min(left, INDEX_MAX), min(right, INDEX_MAX)
    # Compared as a difference, so no bound is ever added to a position (no overflow).
    return Mask(
        lambda b, h, q, kv: ((q - kv) <= left) & ((kv - q) <= right),
        name,
        blocks=lambda b, h, q, kv: (
            (kv.lo - q.hi <= right) & (q.lo - kv.hi <= left),
            (q.hi - kv.lo <= left) & (kv.hi - q.lo <= right),
        ),
        key=("sliding_window", left, right),
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
    lengths_t = lengths_t.clamp(max=INDEX_MAX)
    return _padding(lengths_t, f"padding({lengths_t.tolist()})", ("padding", tuple(lengths_t.tolist())))


def _padding(lengths: Tensor, name: str, key: Hashable) -> Mask:
    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return kv < lengths[b]

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        length = lengths[b]
        return kv.lo < length, kv.hi < length

    return Mask(
        fn,
        name,
        batch_size=lengths.numel(),
        blocks=blocks,
        key=key,
        relocate=lambda device: _padding(lengths.to(device), name, key),
    )


def strided(stride: int) -> Mask:
    """Sparse Transformer's strided pattern: keys a multiple of ``stride`` away.

    Combine with :func:`causal` and a :func:`sliding_window` of ``stride - 1`` for the
    paper's two strided heads in one mask.

    Raises:
        ValueError: ``stride < 1``.
    """
    check_int("stride", stride, minimum=1)
    stride = min(stride, INDEX_MAX)

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        lo, hi = q.lo - kv.hi, q.hi - kv.lo  # every difference q - kv lies in [lo, hi]
        some = torch.div(hi, stride, rounding_mode="floor") * stride >= lo
        every = ((lo == hi) & (torch.remainder(lo, stride) == 0)) | (stride == 1)
        residues_known = (
            q.residue is not None
            and kv.residue is not None
            and q.period > 0
            and kv.period > 0
            and q.period % stride == 0
            and kv.period % stride == 0
        )
        if residues_known:  # blocks of tokens that share their position mod stride
            assert q.residue is not None and kv.residue is not None
            known = (q.residue >= 0) & (kv.residue >= 0)
            same = torch.remainder(q.residue - kv.residue, stride) == 0
            some, every = torch.where(known, same, some), torch.where(known, same, every)
        return some, every

    return Mask(
        lambda b, h, q, kv: torch.remainder(q - kv, stride) == 0,
        f"strided({stride})",
        blocks=blocks,
        key=("strided", stride),
    )


def fixed(block: int, summary: int) -> Mask:
    """Sparse Transformer's fixed pattern: keys in the query's own block of ``block``
    tokens, and the last ``summary`` tokens of every block (the "summary" cells).

    Raises:
        ValueError: ``block < 1`` or ``summary`` outside ``[0, block]``.
    """
    check_int("block", block, minimum=1)
    check_int("summary", summary, minimum=0)
    if summary > block:
        raise ValueError(f"summary must be <= block, got summary={summary}, block={block}")
    block, summary = min(block, INDEX_MAX), min(summary, INDEX_MAX)

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        q_first, q_last = torch.div(q.lo, block, rounding_mode="floor"), torch.div(q.hi, block, rounding_mode="floor")
        kv_first, kv_last = (
            torch.div(kv.lo, block, rounding_mode="floor"),
            torch.div(kv.hi, block, rounding_mode="floor"),
        )
        # A key span that crosses a block boundary holds the last token of a block.
        holds_summary = ((kv_last > kv_first) | (torch.remainder(kv.hi, block) >= block - summary)) & (summary > 0)
        some = ((q_first <= kv_last) & (kv_first <= q_last)) | holds_summary
        one_block = (q_first == q_last) & (kv_first == kv_last) & (q_first == kv_first)
        all_summary = (kv_first == kv_last) & (torch.remainder(kv.lo, block) >= block - summary)
        return some, one_block | all_summary

    return Mask(
        lambda b, h, q, kv: (
            (torch.div(q, block, rounding_mode="floor") == torch.div(kv, block, rounding_mode="floor"))
            | (torch.remainder(kv, block) >= block - summary)
        ),
        f"fixed(block={block}, summary={summary})",
        blocks=blocks,
        key=("fixed", block, summary),
    )


def random(density: float, seed: int = 0) -> Mask:
    """Each (query, key) pair is kept with probability ``density``, deterministically in
    ``seed``: a hash of the positions, so any block of the mask can be evaluated alone, and
    the same pairs are kept on every device and under compiled kernels (the hash never
    leaves 32-bit range).

    Raises:
        ValueError: ``density`` outside ``[0, 1]``.
    """
    if not 0.0 <= float(density) <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    check_int("seed", seed, minimum=0)
    threshold = int(round(float(density) * _HASH_PRIME))
    salt = seed % _HASH_PRIME

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        mixed = _hash_step(_hash_step(q * 0 + salt, q), kv)
        return mixed < threshold

    return Mask(fn, f"random(density={density}, seed={seed})", key=("random", threshold, salt))


def _hash_step(acc: Tensor, x: Tensor) -> Tensor:
    """Fold position ``x`` (two base-``_HASH_PRIME`` digits) into ``acc`` (in ``[0, prime)``).
    Every intermediate value is below ``2**31``."""
    low = torch.remainder(x, _HASH_PRIME)
    high = torch.remainder(torch.div(x - low, _HASH_PRIME, rounding_mode="floor"), _HASH_PRIME)
    for digit in (high, low):
        acc = torch.remainder(acc + digit, _HASH_PRIME)
        acc = torch.remainder(acc * acc + _HASH_SQUARE_ADD, _HASH_PRIME)
        acc = torch.remainder(acc * _HASH_MULTIPLIER + _HASH_ADD, _HASH_PRIME)
    return acc


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
    if idx.numel() and int(idx.max()) > INDEX_MAX:
        raise ValueError(f"indices must be <= {INDEX_MAX} (the largest position), got {int(idx.max())}")
    # A table of which positions are global, indexed by position: a lookup, not a
    # comparison against every index, so the function stays pointwise.
    is_global = torch.zeros(int(idx.max()) + 1 if idx.numel() else 1, dtype=torch.bool)
    is_global[idx] = True
    sorted_unique = torch.unique(idx)
    return _global_tokens(
        is_global, sorted_unique, f"global_tokens({idx.tolist()})", ("global_tokens", tuple(sorted_unique.tolist()))
    )


def _global_tokens(is_global: Tensor, sorted_unique: Tensor, name: str, key: Hashable) -> Mask:
    n = is_global.numel()
    few = sorted_unique.tolist() if sorted_unique.numel() <= _FEW_GLOBAL_TOKENS else None

    def is_global_position(pos: Tensor) -> Tensor:
        if few is not None:  # a handful of comparisons: no memory read in a kernel's inner loop
            found = pos != pos
            for index in few:
                found = found | (pos == index)
            return found
        return is_global[pos.clamp(0, n - 1)] & (pos >= 0) & (pos < n)

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return is_global_position(q) | is_global_position(kv)

    def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
        def count(span: Span) -> Tensor:  # global tokens inside [lo, hi]
            return torch.searchsorted(sorted_unique, span.hi.contiguous(), right=True) - torch.searchsorted(
                sorted_unique, span.lo.contiguous()
            )

        q_count, kv_count = count(q), count(kv)
        some = (q_count > 0) | (kv_count > 0)
        every = (q_count == q.hi - q.lo + 1) | (kv_count == kv.hi - kv.lo + 1)
        return some, every

    return Mask(
        fn,
        name,
        blocks=blocks,
        key=key,
        relocate=lambda device: _global_tokens(is_global.to(device), sorted_unique.to(device), name, key),
    )


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
    # Ids renumbered 0, 1, 2, ... in order of value: same documents, and small numbers that
    # fit the 32-bit arithmetic of compiled kernels whatever ids the caller used.
    values, ranks = torch.unique(ids_t.long(), return_inverse=True)
    table = (ranks if ids_t.ndim == 2 else ranks.unsqueeze(0)).to(torch.int32)  # [b|1, n]
    monotone = bool((table[:, 1:] >= table[:, :-1]).all())
    digest = hashlib.sha1(ids_t.long().cpu().numpy().tobytes()).hexdigest()
    name = f"document({ids_t.shape[-1]} tokens, {values.numel()} documents)"
    return _document(table, ids_t.ndim == 2, monotone, name, ("document", tuple(ids_t.shape), digest))


def _document(table: Tensor, per_batch: bool, monotone: bool, name: str, key: Hashable) -> Mask:
    n = table.shape[-1]
    first_row = table[0]  # [n]

    def doc_of(b: Tensor, pos: Tensor) -> Tensor:
        return table[b, pos.clamp(0, n - 1)] if per_batch else first_row[pos.clamp(0, n - 1)]

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        # A position outside [0, n) belongs to no document: it attends to nothing and
        # nothing attends to it.
        inside = (q >= 0) & (q < n) & (kv >= 0) & (kv < n)
        return (doc_of(b, q) == doc_of(b, kv)) & inside

    blocks = None
    if monotone:

        def blocks(b: Tensor, h: Tensor, q: Span, kv: Span) -> tuple[Tensor, Tensor]:
            def ids(span: Span) -> tuple[Tensor, Tensor, Tensor, Tensor]:
                first = table[b, span.lo.clamp(0, n - 1)] if per_batch else first_row[span.lo.clamp(0, n - 1)]
                last = table[b, span.hi.clamp(0, n - 1)] if per_batch else first_row[span.hi.clamp(0, n - 1)]
                return first, last, (span.hi >= 0) & (span.lo < n), (span.lo >= 0) & (span.hi < n)

            q_first, q_last, q_some_inside, q_all_inside = ids(q)
            kv_first, kv_last, kv_some_inside, kv_all_inside = ids(kv)
            some = q_some_inside & kv_some_inside & (q_first <= kv_last) & (kv_first <= q_last)
            every = q_all_inside & kv_all_inside & (q_first == q_last) & (kv_first == kv_last) & (q_first == kv_first)
            return some, every

    return Mask(
        fn,
        name,
        batch_size=table.shape[0] if per_batch else None,
        blocks=blocks,
        key=key,
        relocate=lambda device: _document(table.to(device), per_batch, monotone, name, key),
    )


def from_dense(allowed: Tensor, *, reusable: bool = True) -> Mask:
    """Wrap a boolean tensor ``[s_q, s_k]``, ``[b|1, h|1, s_q, s_k]`` (``True`` = may
    attend) as a mask. Row ``i`` of the tensor is query row ``i``.

    Args:
        allowed: the bool tensor.
        reusable: give the mask a :attr:`~Mask.key`, so that kernels keep what they build
            from it (a FlexAttention block mask, which holds the tensor) for later calls
            with the same mask; ``False`` for a tensor made for one call, so that nothing
            keeps it alive afterwards.

    Raises:
        TypeError: the tensor is not boolean.
        ValueError: it has fewer than 2 or more than 4 dimensions.
    """
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
        got = allowed.dtype if isinstance(allowed, Tensor) else type(allowed).__name__
        raise TypeError(f"from_dense expects a bool tensor (True = may attend), got {got}")
    if not 2 <= allowed.ndim <= 4:
        raise ValueError(f"from_dense expects 2 to 4 dimensions, got shape {list(allowed.shape)}")
    dense = unsqueeze_to_4d(allowed)  # [b|1, h|1, s_q, s_k]
    # Known by the identity of the view the mask keeps alive: a cache never mistakes another
    # tensor for it (modify the tensor afterwards and the mask changes with it, caches not).
    key = ("from_dense", id(dense)) if reusable else None
    return _from_dense(dense, f"from_dense({list(allowed.shape)})", key)


def _from_dense(dense: Tensor, name: str, key: Hashable) -> Mask:
    n_b, n_h, s_q, s_k = dense.shape
    offset = s_k - s_q

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        # Broadcast dims are indexed at 0 (b * 0 keeps the function pointwise); indices are
        # clamped so that positions outside the tensor never read past it.
        row = (q - offset).clamp(0, max(s_q - 1, 0))
        return dense[b if n_b > 1 else b * 0, h if n_h > 1 else h * 0, row, kv.clamp(0, max(s_k - 1, 0))]

    return Mask(
        fn,
        name,
        batch_size=n_b if n_b > 1 else None,
        num_heads=n_h if n_h > 1 else None,
        shape=(s_q, s_k),
        key=key,
        relocate=lambda device: _from_dense(dense.to(device), name, key),
    )


def check_int(name: str, value: int, *, minimum: int) -> None:
    """Check a mask's integer parameter (a window, a block, a seed).

    Raises:
        TypeError: ``value`` is not an int (a bool is not one).
        ValueError: ``value`` is below ``minimum``.
    """
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
    digest = hashlib.sha1(keep.cpu().numpy().tobytes()).hexdigest()
    return _hf_padding(keep, f"hf_padding({list(attention_mask.shape)})", ("hf_padding", tuple(keep.shape), digest))


def _hf_padding(keep: Tensor, name: str, key: Hashable) -> Mask:
    n_b, s_k = keep.shape

    def fn(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return keep[b, kv.clamp(0, max(s_k - 1, 0))] & (kv >= 0) & (kv < s_k)

    return Mask(fn, name, batch_size=n_b, key=key, relocate=lambda device: _hf_padding(keep.to(device), name, key))


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
    fn = mask.to(device).fn  # the mask's own tensors where the kernel runs

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
