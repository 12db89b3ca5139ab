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

Adapters to and from other conventions live at the bottom of this file, each named for the
convention it speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

MaskFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

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
    """

    fn: MaskFn
    name: str
    batch_size: int | None = None
    num_heads: int | None = None
    shape: tuple[int, int] | None = None

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.fn(b, h, q_idx, kv_idx)

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def __and__(self, other: Mask) -> Mask:
        return _combine(self, other, "&", torch.logical_and)

    def __or__(self, other: Mask) -> Mask:
        return _combine(self, other, "|", torch.logical_or)

    def __invert__(self) -> Mask:
        fn = self.fn
        return Mask(
            lambda b, h, q, kv: ~_as_bool(fn(b, h, q, kv)),
            f"~({self.name})",
            self.batch_size,
            self.num_heads,
            self.shape,
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
    return Mask(
        lambda b, h, q, kv: op(_as_bool(lf(b, h, q, kv)), _as_bool(rf(b, h, q, kv))),
        f"({left.name} {symbol} {right.name})",
        _merge_size("batch_size", left.batch_size, right.batch_size),
        _merge_size("num_heads", left.num_heads, right.num_heads),
        left.shape or right.shape,
    )


# ---------------------------------------------------------------------------------------
# The masks.
# ---------------------------------------------------------------------------------------


def full() -> Mask:
    """Every query may attend to every key (bidirectional attention)."""
    return Mask(lambda b, h, q, kv: torch.ones_like(q - kv, dtype=torch.bool), "full")


def causal() -> Mask:
    """Query at position ``i`` may attend to keys ``<= i`` (aligned bottom-right)."""
    return Mask(lambda b, h, q, kv: kv <= q, "causal")


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

    return Mask(fn, f"padding({lengths_t.tolist()})", batch_size=lengths_t.numel())


def strided(stride: int) -> Mask:
    """Sparse Transformer's strided pattern: keys a multiple of ``stride`` away.

    Combine with :func:`causal` and a :func:`sliding_window` of ``stride - 1`` for the
    paper's two strided heads in one mask.

    Raises:
        ValueError: ``stride < 1``.
    """
    _check_int("stride", stride, minimum=1)
    return Mask(lambda b, h, q, kv: torch.remainder(q - kv, stride) == 0, f"strided({stride})")


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
    return Mask(
        lambda b, h, q, kv: (torch.div(q, block, rounding_mode="floor") == torch.div(kv, block, rounding_mode="floor"))
        | (torch.remainder(kv, block) >= block - summary),
        f"fixed(block={block}, summary={summary})",
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

    return Mask(fn, f"global_tokens({idx.tolist()})")


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
