"""Which engine computes an attention call: the one place that decides.

Four engines compute exact attention; the kernels (:func:`attnkit.attention`,
:func:`~attnkit.functional.tiled_attention`, :func:`~attnkit.functional.local_attention`,
:func:`~attnkit.functional.sparse_attention`) each offer the ones that fit them and take an
``engine=`` argument, ``"auto"`` by default, so that a caller (or a test) can force one:

- ``"sdpa"``: ``F.scaled_dot_product_attention``'s fused kernels. Chosen when there is no
  mask it cannot express; forced with a mask, the mask goes to SDPA as a dense bool tensor.
- ``"flex"``: FlexAttention under ``torch.compile``, with a ``BlockMask`` built from the
  attnkit :class:`~attnkit.masks.Mask` (:mod:`attnkit.functional.flex`). Chosen on GPUs (any
  device but the CPU) for float32/float16/bfloat16 and head dims of at least 16. On the CPU
  it runs too, forward only (torch's CPU FlexAttention has no backward).
- ``"blockwise"``: attnkit's own schedules of block calls (tiled, local, sparse), on PyTorch's
  fused CPU flash kernel where it applies and plain tensor operations elsewhere. Chosen on
  the CPU for masks, where it is faster than compiled FlexAttention, and wherever Flex
  cannot serve (float64, small head dims, a bias that needs a gradient, empty sequences);
  a bias without a mask goes to SDPA there, which reads it as it is.
- ``"reference"``: dense scores ``[b, h, s_q, s_k]``: the only engine that hands back the
  weights, applies dropout or takes a score callable.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from torch import Tensor

Engine = Literal["auto", "sdpa", "flex", "blockwise", "reference"]
ENGINES: tuple[str, ...] = ("auto", "sdpa", "flex", "blockwise", "reference")

_FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# FlexAttention's kernels need head dims of at least 16.
_FLEX_MIN_HEAD_DIM = 16


def check_engine(engine: object, offered: tuple[str, ...], caller: str) -> None:
    """Raise unless ``engine`` is ``"auto"`` or one of ``offered``.

    Args:
        engine: what the caller of a kernel asked for.
        offered: the engines the kernel runs on.
        caller: the public function called, named in the message (``"local_attention"``).

    Raises:
        ValueError: an unknown engine, or one the kernel does not offer.
    """
    if engine == "auto" or engine in offered:
        return
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    raise ValueError(f"{caller} runs on the engines {['auto', *offered]}, got engine={engine!r}")


@functools.cache
def flex_available() -> bool:
    """Whether this torch has FlexAttention and ``torch.compile``."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch, "compile")


def flex_serves(q: Tensor, v: Tensor, bias: Tensor | None = None) -> bool:
    """Whether ``"auto"`` picks FlexAttention for these inputs: a non-CPU device, a dtype and
    head dims its kernels take, non-empty sequences, and no bias that needs a gradient."""
    return (
        q.device.type != "cpu"
        and q.dtype in _FLEX_DTYPES
        and min(q.shape[-1], v.shape[-1]) >= _FLEX_MIN_HEAD_DIM
        and q.shape[-2] > 0
        and v.shape[-2] > 0
        and not (bias is not None and bias.requires_grad)
        and flex_available()
    )


def choose_masked_engine(engine: Engine, q: Tensor, v: Tensor, bias: Tensor | None, caller: str) -> Engine:
    """``"flex"`` or ``"blockwise"`` for a masked kernel (tiled, local, sparse); ``caller``
    as in :func:`check_engine`."""
    check_engine(engine, ("flex", "blockwise"), caller)
    if engine != "auto":
        return engine
    return "flex" if flex_serves(q, v, bias) else "blockwise"


def choose_attention_engine(
    engine: Engine,
    q: Tensor,
    v: Tensor,
    *,
    sdpa_serves: bool,
    needs_reference: bool,
    bias: Tensor | None,
    bias_alone: bool = False,
) -> Engine:
    """The engine of one :func:`attnkit.attention` call.

    Args:
        engine: what the caller asked for.
        sdpa_serves: SDPA computes this call exactly without a dense mask.
        needs_reference: the call asks for weights, dropout or a score callable.
        bias: the call's additive score bias, or ``None``.
        bias_alone: the call has a bias and nothing that SDPA would need as a dense mask
            (no mask, no causal mask over several queries).

    Raises:
        ValueError: an unknown engine, or a forced engine that cannot compute this call.
    """
    check_engine(engine, ("sdpa", "flex", "blockwise", "reference"), "attention")
    if engine == "auto":
        if needs_reference:
            return "reference"
        # One query (a decoding step) has a mask row of s_k entries: SDPA with the mask and
        # bias as one dense tensor costs less than splitting the keys into blocks.
        if sdpa_serves or q.shape[-2] == 1:
            return "sdpa"
        if flex_serves(q, v, bias):
            return "flex"
        # A bias without a mask (T5's relative positions, ALiBi) is already laid out as the
        # scores are: SDPA reads it as it is, where blocks would cut it up and search it for
        # rows with nothing allowed (a T5-small encoder over 256 tokens: 4% of its time).
        return "sdpa" if bias_alone else "blockwise"
    if needs_reference and engine != "reference":
        raise ValueError(
            f"engine={engine!r} cannot return weights, apply dropout or call a score function; "
            "use engine='reference' (or 'auto')"
        )
    return engine
