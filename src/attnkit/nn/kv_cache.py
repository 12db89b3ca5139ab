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

    Attributes:
        keys: ``[b, h_kv, s, d]`` or ``None`` while empty.
        values: ``[b, h_kv, s, d_v]`` or ``None`` while empty.
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def __len__(self) -> int:
        """The number of cached positions ``s``."""
        return 0 if self.keys is None else self.keys.shape[2]

    def __repr__(self) -> str:
        shape = None if self.keys is None else list(self.keys.shape)
        return f"KVCache(length={len(self)}, keys={shape})"

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values of new positions.

        Args:
            keys: ``[b, h_kv, s_new, d]``.
            values: ``[b, h_kv, s_new, d_v]``.

        Returns:
            All keys ``[b, h_kv, s + s_new, d]`` and values ``[b, h_kv, s + s_new, d_v]``.

        Raises:
            ValueError: the new tensors do not fit each other or what is already cached.
        """
        if keys.ndim != 4 or values.ndim != 4 or keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"expected keys [b, h_kv, s, d] and values [b, h_kv, s, d_v], got keys "
                f"{list(keys.shape)} and values {list(values.shape)}"
            )
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
        else:
            cached_k, cached_v = self.keys, self.values
            if (
                keys.shape[:2] != cached_k.shape[:2]
                or keys.shape[3] != cached_k.shape[3]
                or values.shape[3] != cached_v.shape[3]
            ):
                raise ValueError(
                    f"new keys {list(keys.shape)} / values {list(values.shape)} do not fit the cached "
                    f"keys {list(cached_k.shape)} / values {list(cached_v.shape)} "
                    "(batch, heads and head dims must match)"
                )
            # Concatenation, not an in-place write into a preallocated buffer: earlier
            # outputs may still be needed by autograd, and a write would invalidate them.
            self.keys = torch.cat((cached_k, keys), dim=2)  # [b, h_kv, s + s_new, d]
            self.values = torch.cat((cached_v, values), dim=2)  # [b, h_kv, s + s_new, d_v]
        return self.keys, self.values

    def reset(self) -> None:
        """Forget everything cached."""
        self.keys = None
        self.values = None


class DecoderCache:
    """One :class:`KVCache` per layer for self-attention and one for cross-attention.

    Create it with :meth:`attnkit.nn.Decoder.new_cache` (or ``DecoderLM.new_cache``) and
    pass the same object to every decoding step.

    Args:
        num_layers: the number of decoder layers.

    Raises:
        ValueError: ``num_layers < 1``.

    Attributes:
        self_attention: per-layer caches of the masked self-attention.
        cross_attention: per-layer caches of the cross-attention (unused by decoder-only
            models).
    """

    def __init__(self, num_layers: int) -> None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.self_attention = [KVCache() for _ in range(num_layers)]
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
