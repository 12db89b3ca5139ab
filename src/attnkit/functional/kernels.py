"""Attention kernels by name, for modules that select one by option, and the check of a
kernel's options that modules run when they are built.

Every kernel takes ``(q, k, v, *, causal=..., **options)`` with q ``[b, h, s_q, d]`` and
k/v ``[b, h_kv, s_k, d|d_v]`` and returns ``[b, h, s_q, d_v]``, so a module can dispatch with
one line: ``get_kernel(name)(q, k, v, causal=causal, **options)``.

========  ================================================  ==============================
name      function                                          options
========  ================================================  ==============================
auto      :func:`attnkit.functional.attention`              none (mask, bias, dropout and
                                                            weights per call)
tiled     :func:`attnkit.functional.tiled_attention`        scale, block_size
local     :func:`attnkit.functional.local_attention`        window (required), scale,
                                                            block_size
sparse    :func:`attnkit.functional.sparse_attention`       the pattern (required),
                                                            permute, scale, block_size
linear    :func:`attnkit.functional.linear_attention`       feature_map, projection, seed,
                                                            chunk_size, eps
========  ================================================  ==============================

``ring`` (:func:`attnkit.distributed.ring_attention`: mask, scale, layout, group,
block_size) runs one sequence across the ranks of a torchrun job; ``import
attnkit.distributed`` registers it (:func:`register_kernel`).

``"auto"`` is the dispatcher: it picks PyTorch's fused SDPA, or the reference path when
weights, a score variant or a mask SDPA cannot take are asked for.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from torch import Tensor

from attnkit.functional.attention import attention
from attnkit.functional.linear import linear_attention
from attnkit.functional.local import local_attention
from attnkit.functional.masks import Mask
from attnkit.functional.sparse import sparse_attention
from attnkit.functional.tiled import tiled_attention

# Keywords a kernel takes per call, never as a module's options: what a module asks of each
# call, and what would change the kernel's result from a tensor (weights, lse, a state).
_PER_CALL = frozenset({"causal", "return_weights", "return_lse", "return_state", "state"})


# A kernel: (q, k, v, *, causal, **options) -> [b, h, s_q, d_v].
KernelFn = Callable[..., Tensor]


@dataclass(frozen=True)
class KernelSpec:
    """One kernel as modules see it.

    Attributes:
        name: its name in :data:`KERNELS`.
        function: the kernel.
        per_call: keywords a module passes at each call rather than as options (a
            per-call ``mask`` and ``bias`` for kernels that take them).
        takes_mask: it takes a mask and an additive score bias at each call.
        full: it returns weights, applies dropout to them and takes score variants (only
            the dispatcher materialises the weights).
    """

    name: str
    function: Callable[..., Tensor]
    per_call: frozenset[str]
    takes_mask: bool
    full: bool

    def option_names(self) -> list[str] | None:
        """The keyword options this kernel takes from a module, in signature order;
        ``None`` for a kernel that takes any (``**options``) and checks them itself."""
        params = inspect.signature(self.function).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        skip = _PER_CALL | self.per_call
        return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in skip]


# Called as modules call them (no return_weights, return_lse or return_state), the kernels
# return a tensor.
KERNEL_SPECS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        KernelSpec(
            "auto", attention, frozenset({"mask", "bias", "scale", "score", "dropout_p"}), takes_mask=True, full=True
        ),
        KernelSpec("tiled", cast(KernelFn, tiled_attention), frozenset({"mask", "bias"}), takes_mask=True, full=False),
        KernelSpec("local", cast(KernelFn, local_attention), frozenset(), takes_mask=False, full=False),
        KernelSpec("sparse", cast(KernelFn, sparse_attention), frozenset(), takes_mask=False, full=False),
        KernelSpec("linear", cast(KernelFn, linear_attention), frozenset(), takes_mask=False, full=False),
    )
}


class _KernelTable(Mapping[str, Callable[..., Tensor]]):
    """Kernel name → function, read-only; :func:`register_kernel` adds to it."""

    def __getitem__(self, name: str) -> Callable[..., Tensor]:
        return KERNEL_SPECS[resolve_kernel_name(name)].function

    def __iter__(self) -> Iterator[str]:
        return iter(KERNEL_SPECS)

    def __len__(self) -> int:
        return len(KERNEL_SPECS)

    def __contains__(self, name: object) -> bool:
        return name in KERNEL_SPECS

    def __repr__(self) -> str:
        return repr({name: spec.function for name, spec in KERNEL_SPECS.items()})


KERNELS: Mapping[str, Callable[..., Tensor]] = _KernelTable()


def register_kernel(name: str, kernel: Callable[..., Tensor]) -> None:
    """Make ``kernel`` available as ``name`` to :func:`get_kernel` (and so to
    ``AttentionConfig(kernel=name)``). Layers above this one add their kernels this way
    when imported, e.g. ``import attnkit.distributed`` adds ``"ring"``. A kernel whose
    signature has ``mask`` and ``bias`` takes them at each call.

    Raises:
        ValueError: ``name`` is already taken by another kernel.
    """
    known = KERNEL_SPECS.get(name)
    if known is not None and known.function is not kernel:
        raise ValueError(f"attention kernel {name!r} is already registered as {KERNELS[name]!r}")
    params = inspect.signature(kernel).parameters
    takes_mask = "mask" in params and "bias" in params
    per_call = frozenset({"mask", "bias"}) if takes_mask else frozenset()
    KERNEL_SPECS[name] = KernelSpec(name, kernel, per_call, takes_mask=takes_mask, full=False)


def resolve_kernel_name(name: str) -> str:
    """``name``, checked against the kernel table.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if not isinstance(name, str) or name not in KERNEL_SPECS:
        hint = " (import attnkit.distributed to add it)" if name == "ring" else ""
        raise ValueError(f"unknown attention kernel {name!r}{hint}; expected one of {sorted(KERNEL_SPECS)}")
    return name


def get_kernel(name: str) -> Callable[..., Tensor]:
    """The kernel called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    return KERNEL_SPECS[resolve_kernel_name(name)].function


def check_kernel_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check a module's options for a kernel before any call: the names the kernel takes,
    the ones it needs, and the values it would refuse at the first forward.

    Args:
        name: a kernel name (see :func:`resolve_kernel_name`).
        options: keyword options, e.g. ``{"window": 256}`` for ``"local"``.

    Returns:
        A copy of the options.

    Raises:
        TypeError: an option the kernel does not take, a missing required option, a value
            of the wrong type.
        ValueError: a value out of range (a negative window, a block size below 1, ...).
    """
    spec = KERNEL_SPECS[name]
    options = dict(options or {})
    accepted = spec.option_names()
    if accepted is None:
        return options
    unknown = [key for key in options if key not in accepted]
    if unknown:
        listed = ", ".join(accepted) if accepted else "none"
        raise TypeError(f"kernel {name!r} takes no option {unknown[0]!r}; its options: {listed}")
    if name == "local" and "window" not in options:
        raise TypeError("kernel 'local' needs the option 'window' (keys on each side a query attends to)")
    if name == "sparse":
        if "mask" not in options:
            raise TypeError("kernel 'sparse' needs the option 'mask' (an attnkit.masks.Mask pattern)")
        if not isinstance(options["mask"], Mask):
            raise TypeError(f"kernel 'sparse' needs an attnkit.masks.Mask, got {type(options['mask']).__name__}")
    for key, value in options.items():
        check = _VALUE_CHECKS.get(key)
        if check is not None:
            check(value)
    return options


def _positive_int(what: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")


def _check_window(window: object) -> None:
    sides = window if isinstance(window, tuple) and len(window) == 2 else (window, window)
    for side in sides:
        if isinstance(side, bool) or not isinstance(side, int):
            raise TypeError(f"window must be an int or a (left, right) pair of ints, got {window!r}")
        if side < 0:
            raise ValueError(f"window must be >= 0 on both sides, got {window!r}")


def _check_block_size(block_size: object) -> None:
    if isinstance(block_size, tuple) and len(block_size) == 2:
        for value in block_size:
            _positive_int("block_size", value)
    else:
        _positive_int("block_size", block_size, allow_none=True)


def _check_scale(scale: object) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
        raise ValueError(f"scale must be a number > 0 or None, got {scale!r}")


def _check_feature_map(feature_map: object) -> None:
    if not callable(feature_map) and feature_map not in ("elu", "relu", "favor"):
        raise TypeError(f'feature_map must be "elu", "relu", "favor" or a callable, got {feature_map!r}')


def _check_projection(projection: object) -> None:
    if projection is not None and (not isinstance(projection, Tensor) or projection.ndim != 2):
        got = list(projection.shape) if isinstance(projection, Tensor) else type(projection).__name__
        raise TypeError(f"projection must be a [num_features, d] tensor or None, got {got}")


def _check_eps(eps: object) -> None:
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0):
        raise ValueError(f"eps must be a number >= 0 or None, got {eps!r}")


_VALUE_CHECKS: dict[str, Callable[[object], None]] = {
    "window": _check_window,
    "block_size": _check_block_size,
    "chunk_size": lambda value: _positive_int("chunk_size", value),
    "permute": lambda value: _positive_int("permute", value, allow_none=True),
    "scale": _check_scale,
    "feature_map": _check_feature_map,
    "projection": _check_projection,
    "eps": _check_eps,
}
