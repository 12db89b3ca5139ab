"""Key/value caches for incremental decoding.

Shape letters: ``b`` batch, ``h_kv`` key/value heads, ``s`` cached length, ``d`` head dim,
``d_v`` value head dim.

When a decoder produces one token at a time, the keys and values of the earlier tokens do
not change (they only attend to tokens before them), so each attention layer keeps them
and computes projections for the new tokens only. Causal masks in attnkit are aligned
bottom-right, so the new queries line up with the end of the cached keys without any
offset bookkeeping.

A cache is an explicit object the caller creates and passes in; modules never keep one.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """The keys and values one attention layer has seen so far.

    For self-attention each call appends the new tokens' keys and values. For
    cross-attention the keys and values depend only on the encoder output, so the first
    call stores them and later calls reuse them (see
    :meth:`attnkit.nn.MultiHeadAttention.forward`).

    Keys are stored after any rotary encoding, i.e. exactly as attention consumes them.

    Args:
        capacity: preallocate room for this many positions on the first append and write
            each step in place, instead of concatenating (which copies everything cached at
            every step: quadratic in the length of a generation). For inference: the
            in-place writes would invalidate tensors autograd saved, so appending keys that
            require grad to a preallocated cache is refused.

    Raises:
        ValueError: ``capacity < 1``.

    Attributes:
        capacity: the preallocated length, or ``None`` for a growing cache.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._keys: Tensor | None = None  # [b, h_kv, capacity or s, d]
        self._values: Tensor | None = None  # [b, h_kv, capacity or s, d_v]
        self._length = 0

    @property
    def keys(self) -> Tensor | None:
        """``[b, h_kv, s, d]``, or ``None`` while empty."""
        return None if self._keys is None else self._keys[:, :, : self._length]

    @property
    def values(self) -> Tensor | None:
        """``[b, h_kv, s, d_v]``, or ``None`` while empty."""
        return None if self._values is None else self._values[:, :, : self._length]

    def __len__(self) -> int:
        """The number of cached positions ``s``."""
        return self._length

    def __repr__(self) -> str:
        shape = None if self._keys is None else [*self._keys.shape[:2], self._length, self._keys.shape[3]]
        capacity = "" if self.capacity is None else f", capacity={self.capacity}"
        return f"KVCache(length={len(self)}, keys={shape}{capacity})"

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values of new positions.

        Args:
            keys: ``[b, h_kv, s_new, d]``.
            values: ``[b, h_kv, s_new, d_v]``.

        Returns:
            All keys ``[b, h_kv, s + s_new, d]`` and values ``[b, h_kv, s + s_new, d_v]``.

        Raises:
            ValueError: the new tensors do not fit each other or what is already cached,
                they overflow the capacity, or they require grad in a preallocated cache.
        """
        if keys.ndim != 4 or values.ndim != 4 or keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"expected keys [b, h_kv, s, d] and values [b, h_kv, s, d_v], got keys "
                f"{list(keys.shape)} and values {list(values.shape)}"
            )
        end = self._length + keys.shape[2]
        if (
            self._keys is not None
            and self._values is not None
            and (
                keys.shape[:2] != self._keys.shape[:2]
                or keys.shape[3] != self._keys.shape[3]
                or values.shape[3] != self._values.shape[3]
            )
        ):
            raise ValueError(
                f"new keys {list(keys.shape)} / values {list(values.shape)} do not fit the cached "
                f"keys {[*self._keys.shape[:2], self._length, self._keys.shape[3]]} / values "
                f"{[*self._values.shape[:2], self._length, self._values.shape[3]]} "
                "(batch, heads and head dims must match)"
            )
        if self.capacity is None:
            if self._keys is None or self._values is None:
                self._keys, self._values = keys, values
            else:
                self._keys = torch.cat((self._keys, keys), dim=2)  # [b, h_kv, s + s_new, d]
                self._values = torch.cat((self._values, values), dim=2)  # [b, h_kv, s + s_new, d_v]
        else:
            if end > self.capacity:
                raise ValueError(f"{end} positions overflow this cache's capacity of {self.capacity}")
            if torch.is_grad_enabled() and (keys.requires_grad or values.requires_grad):
                raise ValueError("a preallocated KVCache is for inference; use KVCache() when keys require grad")
            if self._keys is None or self._values is None:
                b, h_kv, _, d = keys.shape
                self._keys = keys.new_empty(b, h_kv, self.capacity, d)
                self._values = values.new_empty(b, h_kv, self.capacity, values.shape[3])
            # narrow: one view op, cheaper than Python indexing (this runs per layer and step).
            self._keys.narrow(2, self._length, keys.shape[2]).copy_(keys)
            self._values.narrow(2, self._length, keys.shape[2]).copy_(values)
        self._length = end
        return self._keys.narrow(2, 0, end), self._values.narrow(2, 0, end)

    def reset(self) -> None:
        """Forget everything cached (a preallocated cache keeps its capacity)."""
        self._keys = None
        self._values = None
        self._length = 0


class DecoderCache:
    """One :class:`KVCache` per layer for self-attention and one for cross-attention.

    Create it with :meth:`attnkit.nn.Decoder.new_kv_cache` (or ``DecoderLM.new_kv_cache``) and
    pass the same object to every decoding step.

    Args:
        num_layers: the number of decoder layers.
        capacity: preallocate each self-attention cache for this many positions (see
            :class:`KVCache`); ``None`` grows them step by step.

    Raises:
        ValueError: ``num_layers < 1``, ``capacity < 1``.

    Attributes:
        self_attention: per-layer caches of the masked self-attention.
        cross_attention: per-layer caches of the cross-attention (unused by decoder-only
            models).
    """

    def __init__(self, num_layers: int, *, capacity: int | None = None) -> None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.self_attention = [KVCache(capacity) for _ in range(num_layers)]
        self.cross_attention = [KVCache() for _ in range(num_layers)]

    def __len__(self) -> int:
        """The number of positions decoded so far."""
        return len(self.self_attention[0])

    def __repr__(self) -> str:
        return f"DecoderCache(layers={len(self.self_attention)}, length={len(self)})"

    def reset(self) -> None:
        """Forget everything cached, in every layer."""
        for cache in (*self.self_attention, *self.cross_attention):
            cache.reset()
