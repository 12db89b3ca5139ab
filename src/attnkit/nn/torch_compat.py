"""Adapters from ``torch.nn`` attention conventions to attnkit's.

Shape letters: ``b`` batch, ``h`` heads, ``s_q`` query length, ``s_k`` key length.

``torch.nn.MultiheadAttention`` and ``torch.nn.Transformer`` take an ``attn_mask`` where
``True`` (or ``-inf``) means *blocked* and a ``key_padding_mask`` where ``True`` means
*padding*; attnkit masks say ``True`` = *may attend*. The conversion lives here and only
here.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _blocked(mask: Tensor, name: str) -> Tensor:
    """A torch mask as bool ``True`` = blocked; float masks must hold only 0 and -inf."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise TypeError(f"{name} must be bool (True = blocked) or float (0 / -inf), got dtype {mask.dtype}")
    blocked = mask == float("-inf")
    if not (blocked | (mask == 0)).all():
        raise ValueError(
            f"{name} holds float values other than 0 and -inf; such a mask is a score bias, "
            "pass it as bias= to attnkit.functional.attention"
        )
    return blocked


def mask_from_torch(
    attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None, *, num_heads: int | None = None
) -> Tensor | None:
    """Convert ``nn.MultiheadAttention`` / ``nn.Transformer`` masks into one attnkit mask.

    Args:
        attn_mask: ``[s_q, s_k]`` or ``[b * h, s_q, s_k]``; bool (``True`` = blocked) or
            float (``0`` = allowed, ``-inf`` = blocked, as from
            ``nn.Transformer.generate_square_subsequent_mask``).
        key_padding_mask: ``[b, s_k]``; bool (``True`` = padding) or float 0 / -inf.
        num_heads: ``h``, needed to unfold a 3-D ``attn_mask``.

    Returns:
        Bool ``[b|1, h|1, s_q, s_k]`` with ``True`` = may attend, or ``None`` when both
        masks are ``None``.

    Raises:
        TypeError: an integer mask.
        ValueError: wrong ranks, a 3-D ``attn_mask`` without ``num_heads`` or whose first
            dim is not a multiple of it, float values other than 0 and -inf.
    """
    allowed: Tensor | None = None
    if attn_mask is not None:
        blocked = _blocked(attn_mask, "attn_mask")
        if blocked.ndim == 2:
            allowed = ~blocked[None, None]  # [1, 1, s_q, s_k]
        elif blocked.ndim == 3:
            if num_heads is None or blocked.shape[0] % num_heads:
                raise ValueError(
                    f"a 3-D attn_mask [b * h, s_q, s_k] needs num_heads dividing its first dim, got shape "
                    f"{list(blocked.shape)} and num_heads={num_heads}"
                )
            allowed = ~blocked.view(-1, num_heads, *blocked.shape[1:])  # [b, h, s_q, s_k]
        else:
            raise ValueError(f"attn_mask must be [s_q, s_k] or [b * h, s_q, s_k], got {list(blocked.shape)}")
    if key_padding_mask is not None:
        padding = _blocked(key_padding_mask, "key_padding_mask")
        if padding.ndim != 2:
            raise ValueError(f"key_padding_mask must be [b, s_k], got {list(padding.shape)}")
        keys_allowed = ~padding[:, None, None, :]  # [b, 1, 1, s_k]
        allowed = keys_allowed if allowed is None else allowed & keys_allowed
    return allowed
