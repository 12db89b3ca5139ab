"""Building a family's network on the ``meta`` device, for a checkpoint's weights to replace,
and computing again the buffers such a network still has there."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

# The in-place initialisers of ``torch.nn.init`` and the tensor fills they end in: on a
# ``meta`` tensor they change no value, since there is none.
_INITIALISERS = frozenset(
    {
        *(name for name in dir(nn.init) if name.endswith("_") and not name.startswith("_")),
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
    }
)


class _SkipInitialisationOnMeta(TorchFunctionMode):
    """Initialising a ``meta`` tensor computes nothing, yet is not free: torch's meta kernels
    for the random fills are Python references whose first call imports the compiler
    (``torch._dynamo``, about 2 s on two cores). This mode returns the tensor untouched."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _INITIALISERS:
            # torch.nn.init passes the tensor by keyword, tensor methods as ``self``
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def build_without_weights(factory: Callable[[], nn.Module]) -> nn.Module:
    """Build a module on the ``meta`` device: parameters with shapes and no storage, for
    weights that a checkpoint replaces right away (``load_state_dict(..., assign=True)``,
    then :func:`materialize_buffers`). Nothing is allocated or initialised: drawing 135M
    random numbers to throw away would cost about a second on two cores, and even the
    initialisers' meta kernels would import the compiler.

    Args:
        factory: builds the module.

    Returns:
        The module, on ``meta``.
    """
    with torch.device("meta"), _SkipInitialisationOnMeta():
        return factory()


def materialize_buffers(module: nn.Module, device: torch.device | str = "cpu") -> None:
    """Compute again, on ``device``, the buffers that a module built by
    :func:`build_without_weights` still has on ``meta`` (rotary frequencies and tables,
    ALiBi slopes): every submodule holding one implements ``reset_buffers(device)``.

    Raises:
        TypeError: a submodule with a ``meta`` buffer and no ``reset_buffers``.
    """
    for sub in module.modules():
        if any(b is not None and b.is_meta for b in sub.buffers(recurse=False)):
            reset = getattr(sub, "reset_buffers", None)
            if not callable(reset):
                raise TypeError(f"{type(sub).__name__} has buffers on the meta device and no reset_buffers()")
            reset(device)


def buffer_bytes(module: nn.Module) -> int:
    """The bytes :func:`materialize_buffers` will allocate for ``module``: each submodule's
    ``buffer_bytes()`` where it says (rotary tables are ``None`` on ``meta`` until then),
    otherwise its ``meta`` buffers' own size in float32."""
    total = 0
    for sub in module.modules():
        if any(b is not None and b.is_meta for b in sub.buffers(recurse=False)):
            planned = getattr(sub, "buffer_bytes", None)
            if callable(planned):
                total += int(planned())
            else:
                total += sum(4 * b.numel() for b in sub.buffers(recurse=False) if b is not None)
    return total
