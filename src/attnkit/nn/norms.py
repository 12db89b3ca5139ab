"""Normalisation layers: torch's ``LayerNorm`` and an ``RMSNorm`` that matches LLaMA (and,
scaled by ``1 + weight``, Gemma), each with a ``scale`` hook point (:mod:`attnkit.nn.hooks`).

Shape letters: ``e`` model (embedding) dim; ``...`` any leading dims.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.hooks import HookPoint

NormKind = Literal["layer", "rms", "rms_plus_one"]
NORM_KINDS: tuple[str, ...] = ("layer", "rms", "rms_plus_one")


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang & Sennrich, 2019), as in LLaMA:
    ``x / sqrt(mean(x²) + eps) * weight``, with no centring and no bias.

    The statistic is computed in float32 (float64 for float64 inputs) and the result cast
    back before the weight is applied, as LLaMA checkpoints expect: in half precision the
    mean of squares would otherwise lose most of its digits.

    With ``plus_one`` the scale is ``1 + weight`` (the weight stores the deviation from 1,
    initialised to 0) and it is applied in float32 before the cast back, as in Gemma.

    Args:
        dim: size ``e`` of the last dimension.
        eps: added to the mean of squares.
        plus_one: scale by ``1 + weight`` (Gemma) instead of ``weight``.

    Raises:
        ValueError: ``dim < 1`` or ``eps < 0``.
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, plus_one: bool = False) -> None:
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.eps = eps
        self.plus_one = plus_one
        self.weight = nn.Parameter(torch.zeros(dim) if plus_one else torch.ones(dim))
        self.scale = HookPoint()  # sqrt(mean(x²) + eps), [..., 1]

    def forward(self, x: Tensor) -> Tensor:
        """Normalise the last dimension.

        Args:
            x: ``[..., e]``.

        Returns:
            ``[..., e]``, in the dtype of ``x`` (promoted with the weight's).

        Raises:
            ValueError: the last dimension is not ``e``.
        """
        weight = self.weight  # one module lookup: this runs for every norm of every step
        if x.shape[-1] != weight.shape[0]:
            raise ValueError(f"expected last dim {weight.shape[0]}, got input of shape {list(x.shape)}")
        # At least float32: bfloat16 and float16 inputs are normalised in float32, float64
        # ones in float64.
        wide = torch.promote_types(x.dtype, torch.float32)
        if self.scale.active:
            x32 = x.to(wide)
            scale = (x32.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()  # [..., 1]
            hooked = self.scale(scale)
            if hooked is not scale or self.scale.watches_gradient:
                if self.plus_one:
                    return (x32 / hooked * (1.0 + weight.to(wide))).to(x.dtype)
                return weight * (x32 / hooked).to(x.dtype)
        if x.dtype == weight.dtype == torch.float32:
            # torch's fused kernel: the same float32 arithmetic in one pass instead of six
            # (bit-identical on this machine; the tests compare it with the expressions
            # below and with Hugging Face's LLaMA and Gemma 2).
            return F.rms_norm(x, weight.shape, 1.0 + weight if self.plus_one else weight, self.eps)
        if self.plus_one:
            x32 = x.to(wide)
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return (normed * (1.0 + weight.to(wide))).to(x.dtype)
        x32 = x.to(wide)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (", plus_one=True" if self.plus_one else "")


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last dimension with a ``scale`` hook point
    (:mod:`attnkit.nn.hooks`): ``sqrt(var(x) + eps)``, ``[..., 1]``. Same parameters and
    results; a replaced scale divides the centred input.

    Args:
        dim: size ``e`` of the last dimension.
        eps: added to the variance.
        bias: an additive bias after the weight.
    """

    def __init__(self, dim: int, eps: float = 1e-5, *, bias: bool = True) -> None:
        super().__init__(dim, eps=eps, bias=bias)
        self.scale = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        """Normalise the last dimension of ``x [..., e]``."""
        if self.scale.active:
            centred = x - x.mean(-1, keepdim=True)  # [..., e]
            scale = (centred.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()  # [..., 1]
            hooked = self.scale(scale)
            if hooked is not scale or self.scale.watches_gradient:
                out = centred / hooked
                out = out if self.weight is None else out * self.weight
                return out if self.bias is None else out + self.bias
        return super().forward(x)


def make_norm(kind: NormKind, dim: int, eps: float, *, bias: bool = True) -> nn.Module:
    """Build the normalisation a layer asks for by name.

    Args:
        kind: ``"layer"`` (:class:`LayerNorm`), ``"rms"`` (:class:`RMSNorm`) or
            ``"rms_plus_one"`` (:class:`RMSNorm` scaled by ``1 + weight``, Gemma).
        dim: the model dim ``e``.
        eps: the norm's epsilon.
        bias: give a LayerNorm its additive bias (RMSNorm never has one).

    Returns:
        The module.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind == "layer":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rms":
        return RMSNorm(dim, eps=eps)
    if kind == "rms_plus_one":
        return RMSNorm(dim, eps=eps, plus_one=True)
    raise ValueError(f"norm must be one of {NORM_KINDS}, got {kind!r}")
