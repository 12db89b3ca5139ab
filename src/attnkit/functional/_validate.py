"""Validation shared by every kernel's entry point: tensors, options, masks and biases, each
checked once here so that every kernel raises the same errors, naming what was expected
and what was got. Also the one conversion of a mask (and ``causal``) to a bool tensor, and
:func:`accepts_single_head`, which lets every kernel take one head as ``[s, d]``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

import torch
from torch import Tensor

from attnkit.functional import masks as masks_mod
from attnkit.functional.records import AttentionResult

P = ParamSpec("P")
R = TypeVar("R")
_QKV = ("q", "k", "v")


def accepts_single_head(kernel: Callable[P, R]) -> Callable[P, R]:
    """Check a kernel's ``q``, ``k``, ``v`` with :func:`check_inputs` before it runs, and let
    it take one head without a batch: ``[s, d]`` inputs are passed to the kernel as
    ``[1, 1, s, d]`` and the two leading dims are taken off what it returns (a tensor, an
    :class:`~attnkit.functional.AttentionResult` or a tuple of them). The kernel itself then
    sees only validated ``[b, h, s, d]`` inputs.

    ``q``, ``k`` and ``v`` must be the kernel's first three parameters, given by position
    or by name.
    """

    @functools.wraps(kernel)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        positional = len(args[:3])
        if any(name not in kwargs for name in _QKV[positional:]):
            return kernel(*args, **kwargs)  # a missing q, k or v: Python's own TypeError
        qkv = cast(list[Tensor], [*args[:positional], *(kwargs[name] for name in _QKV[positional:])])
        if not check_inputs(qkv[0], qkv[1], qkv[2]):
            return kernel(*args, **kwargs)
        batched = [t[None, None] for t in qkv]  # [1, 1, s, d]
        kwargs.update(zip(_QKV[positional:], batched[positional:]))
        args = (*batched[:positional], *args[3:])  # type: ignore[assignment]
        return cast(R, _first_head(kernel(*args, **kwargs)))

    return checked


def _first_head(result: Any) -> Any:
    """``result`` with its leading ``[1, 1]`` dims taken off (``None`` stays ``None``)."""
    if isinstance(result, Tensor):
        return result[0, 0]
    if isinstance(result, AttentionResult):
        return AttentionResult(*(_first_head(t) for t in (result.output, result.weights, result.lse)))
    if isinstance(result, tuple):
        return tuple(_first_head(t) for t in result)
    return result


def dense_allowed(
    mask: masks_mod.Mask | Tensor | None, *, causal: bool, b: int, h: int, s_q: int, s_k: int, device: torch.device
) -> Tensor | None:
    """The mask and the causal flag as one bool tensor broadcastable to ``[b, h, s_q, s_k]``."""
    allowed: Tensor | None = None
    if isinstance(mask, masks_mod.Mask):
        check_mask_sizes(mask, b=b, h=h)
        allowed = mask.to_dense(s_q, s_k, device=device)  # [b|1, h|1, s_q, s_k]
    elif isinstance(mask, Tensor):
        allowed = check_mask_tensor(mask, b=b, h=h, s_q=s_q, s_k=s_k, device=device)
    elif mask is not None:
        raise TypeError(f"mask must be an attnkit.masks.Mask or a bool tensor, got {type(mask).__name__}")
    if causal and s_q > 1:  # one query, the last position, may attend to every key
        causal_allowed = masks_mod.causal().to_dense(s_q, s_k, device=device)  # [1, 1, s_q, s_k]
        allowed = causal_allowed if allowed is None else allowed & causal_allowed
    return allowed


def check_mask_sizes(mask: masks_mod.Mask, *, b: int, h: int) -> None:
    if mask.batch_size is not None and mask.batch_size not in (1, b):
        raise ValueError(f"mask {mask.name} is for batch size {mask.batch_size}, got batch size {b}")
    if mask.num_heads is not None and mask.num_heads not in (1, h):
        raise ValueError(f"mask {mask.name} is for {mask.num_heads} heads, got {h} query heads")


def check_mask_tensor(mask: Tensor, *, b: int, h: int, s_q: int, s_k: int, device: torch.device) -> Tensor:
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
            "pass additive float scores as bias="
        )
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but q is on {device}")
    if not broadcasts(mask.shape, (b, h, s_q, s_k)):
        raise ValueError(
            f"mask of shape {list(mask.shape)} does not broadcast to [b, h, s_q, s_k] = {[b, h, s_q, s_k]}"
        )
    return mask


def check_bias(bias: Tensor, q: Tensor, *, b: int, h: int, s_q: int, s_k: int) -> None:
    if not bias.is_floating_point():
        raise TypeError(f"bias must be a float tensor, got dtype {bias.dtype}; pass boolean masks as mask=")
    if bias.device != q.device:
        raise ValueError(f"bias is on {bias.device} but q is on {q.device}")
    if not broadcasts(bias.shape, (b, h, s_q, s_k)):
        raise ValueError(
            f"bias of shape {list(bias.shape)} does not broadcast to [b, h, s_q, s_k] = {[b, h, s_q, s_k]}"
        )


def broadcasts(shape: torch.Size, target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def check_options(score: object, dropout_p: float, scale: float | None) -> None:
    if not (callable(score) or score in ("scaled_dot", "dot")):
        raise TypeError(f'score must be "scaled_dot", "dot" or a callable (q, k) -> scores, got {score!r}')
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise TypeError(f"scale must be a finite number or None, got {scale!r}")


def check_inputs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Validate q, k, v; return True when they are 2-D (single head, no batch)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on the same device, got q {q.device}, k {k.device}, v {v.device}")
    if not (q.ndim == k.ndim == v.ndim) or q.ndim not in (2, 4):
        raise ValueError(
            "q, k and v must all be [b, h, s, d] or all be [s, d], got "
            f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim, got q {list(q.shape)} and k {list(k.shape)}")
    if q.shape[-1] == 0:
        raise ValueError(f"the head dim must be at least 1, got q {list(q.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree on every dim but the last, got k {list(k.shape)} and v {list(v.shape)}")
    if q.ndim == 4:
        if q.shape[0] != k.shape[0]:
            raise ValueError(f"q and k must have the same batch size, got q {list(q.shape)} and k {list(k.shape)}")
        h, h_kv = q.shape[1], k.shape[1]
        if h == 0:
            raise ValueError(f"q must have at least one head, got q {list(q.shape)}")
        if h_kv == 0 or h % h_kv != 0:
            raise ValueError(
                f"query heads must be a multiple of key/value heads, got h={h} (q {list(q.shape)}) "
                f"and h_kv={h_kv} (k {list(k.shape)})"
            )
    return q.ndim == 2
