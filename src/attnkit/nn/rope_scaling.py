"""Rotary frequencies stretched for contexts longer than the training one ("RoPE scaling").

Shape letters: ``r`` the number of rotated dims of a head (``rotary_dim``).

A :class:`attnkit.nn.RotaryEmbedding` turns pair ``j`` of a head by ``pos · f_j`` with the
frequencies ``f_j = θ^(-2j/r)``. Checkpoints trained or extended past their original
context change those frequencies; each scheme here is a small frozen record whose
:meth:`RopeScaling.frequencies` gives them, computed with the same float32 expressions as
Hugging Face ``transformers`` so that the angles match its checkpoints bit for bit or
nearly:

- :class:`LinearRopeScaling` ("position interpolation"): every frequency divided by
  ``factor``;
- :class:`Llama3RopeScaling` (Llama 3.1): low frequencies divided by ``factor``, high ones
  kept, the band between interpolated smoothly;
- :class:`DynamicNTKRopeScaling`: once a sequence grows past ``max_positions``, the base
  ``θ`` grows with its length (the frequencies then depend on the length of each call);
- :class:`YarnRopeScaling` (YaRN, DeepSeek-V3): high frequencies kept, low ones divided by
  ``factor``, a linear ramp between the wavelengths ``beta_fast`` and ``beta_slow``
  rotations fit in the original context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor


def rotary_frequencies(rotary_dim: int, theta: float) -> Tensor:
    """``theta^(-2j/r)`` for ``j < r/2``, float32 ``[r/2]``: the same expression as Hugging
    Face's LLaMA, so that the frequencies are bit-identical to the ones the checkpoints
    were trained with."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim  # [r/2]
    return 1.0 / (theta**exponents)


class RopeScaling:
    """Base of the rotary scaling schemes.

    Attributes:
        varies_with_length: whether the frequencies depend on how long the sequence is
            (then :meth:`frequencies` is asked again for every call that reaches past
            ``max_positions``).
        max_positions: the length up to which the frequencies stay those of
            ``frequencies(theta, r, None)``; ``None`` when they never change.
    """

    varies_with_length: ClassVar[bool] = False
    max_positions: int | None = None

    def frequencies(self, theta: float, rotary_dim: int, length: int | None = None) -> Tensor:
        """The scaled frequencies, float32 ``[r/2]``.

        Args:
            theta: the base of the unscaled frequencies.
            rotary_dim: ``r``, the rotated dims of a head.
            length: the length of the sequence being encoded (positions ``< length``), for
                schemes that vary with it; ``None`` for at most ``max_positions``.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class LinearRopeScaling(RopeScaling):
    """Position interpolation: positions count ``factor`` times slower.

    Args:
        factor: the divisor of every frequency, ``>= 1``.

    Raises:
        ValueError: ``factor < 1``.
    """

    factor: float

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {self.factor}")

    def frequencies(self, theta: float, rotary_dim: int, length: int | None = None) -> Tensor:
        """``θ^(-2j/r) / factor``, float32 ``[r/2]``."""
        return rotary_frequencies(rotary_dim, theta) / self.factor


@dataclass(frozen=True)
class Llama3RopeScaling(RopeScaling):
    """Llama 3.1's scaling: wavelengths longer than ``original_max_positions /
    low_freq_factor`` are stretched by ``factor``, those shorter than
    ``original_max_positions / high_freq_factor`` kept, and the band between interpolated.

    Args:
        factor: the stretch of the low frequencies (8 in Llama 3.1).
        low_freq_factor: see above (1 in Llama 3.1).
        high_freq_factor: see above (4 in Llama 3.1); above ``low_freq_factor``.
        original_max_positions: the context length before scaling (8192 in Llama 3.1).

    Raises:
        ValueError: ``factor < 1``, ``high_freq_factor <= low_freq_factor``, a
            non-positive ``low_freq_factor`` or ``original_max_positions``.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                f"need 0 < low_freq_factor < high_freq_factor, got {self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_positions < 1:
            raise ValueError(f"original_max_positions must be >= 1, got {self.original_max_positions}")

    def frequencies(self, theta: float, rotary_dim: int, length: int | None = None) -> Tensor:
        """The Llama 3.1 frequencies, float32 ``[r/2]``."""
        inv_freq = rotary_frequencies(rotary_dim, theta)  # [r/2]
        low_freq_wavelen = self.original_max_positions / self.low_freq_factor
        high_freq_wavelen = self.original_max_positions / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq  # [r/2]
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_max_positions / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class DynamicNTKRopeScaling(RopeScaling):
    """Dynamic NTK scaling: up to ``max_positions`` the frequencies are unscaled; a
    sequence of ``n > max_positions`` positions uses the base
    ``θ · (factor · n / max_positions - (factor - 1))^(r / (r - 2))``.

    Args:
        factor: how fast the base grows with the length, ``>= 1``.
        max_positions: the context length before scaling.

    Raises:
        ValueError: ``factor < 1``, ``max_positions < 1``.
    """

    varies_with_length: ClassVar[bool] = True
    factor: float
    max_positions: int

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if self.max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {self.max_positions}")

    def frequencies(self, theta: float, rotary_dim: int, length: int | None = None) -> Tensor:
        """The frequencies for a sequence of ``length`` positions, float32 ``[r/2]``."""
        if rotary_dim <= 2:
            raise ValueError(f"dynamic NTK scaling needs rotary_dim > 2, got {rotary_dim}")
        n = self.max_positions if length is None else max(length, self.max_positions)
        # float32 arithmetic on tensors, as Hugging Face computes it at run time.
        grown = self.factor * torch.tensor(n) / self.max_positions - (self.factor - 1)
        base = theta * grown ** (rotary_dim / (rotary_dim - 2))
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim  # [r/2]
        return 1.0 / (base**exponents)


@dataclass(frozen=True)
class YarnRopeScaling(RopeScaling):
    """YaRN's frequencies: pair ``j`` keeps its frequency where it turns more than
    ``beta_fast`` times over the original context, is divided by ``factor`` where it turns
    fewer than ``beta_slow`` times, and is blended linearly between. YaRN's attention
    temperature is not part of the frequencies: DeepSeek-V3 puts it in the softmax scale
    (:func:`attnkit.nn.latent_attention.yarn_mscale`).

    Args:
        factor: the context's stretch (40 in DeepSeek-V3).
        original_max_positions: the context length before scaling (4096 in DeepSeek-V3).
        beta_fast: rotations over the original context above which a frequency is kept.
        beta_slow: rotations below which it is divided by ``factor``.
        truncate: round the ramp's ends to whole pairs (transformers' default).

    Raises:
        ValueError: ``factor < 1``, a non-positive ``original_max_positions`` or beta.
    """

    factor: float
    original_max_positions: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if self.original_max_positions < 1:
            raise ValueError(f"original_max_positions must be >= 1, got {self.original_max_positions}")
        if not (self.beta_fast > 0 and self.beta_slow > 0):
            raise ValueError(f"beta_fast and beta_slow must be positive, got {self.beta_fast} and {self.beta_slow}")

    def frequencies(self, theta: float, rotary_dim: int, length: int | None = None) -> Tensor:
        """The YaRN frequencies, float32 ``[r/2]`` (transformers' expressions)."""

        def pair_turning(rotations: float) -> float:
            # The pair index whose wavelength fits `rotations` times in the original context.
            turns = math.log(self.original_max_positions / (rotations * 2 * math.pi))
            return rotary_dim * turns / (2 * math.log(theta))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001  # a ramp of one point
        ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [r/2]
        kept = 1 - ramp  # 1 where the frequency is kept, 0 where it is divided by factor
        extrapolated = rotary_frequencies(rotary_dim, theta)  # [r/2]
        interpolated = extrapolated / self.factor
        return interpolated * (1 - kept) + extrapolated * kept


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention temperature ``0.1 · mscale · ln(factor) + 1`` (``1`` for
    ``factor <= 1``). transformers scales the rotated queries and keys by
    ``yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)``; DeepSeek-V3 also
    multiplies the softmax scale by ``yarn_mscale(factor, mscale_all_dim)²``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
