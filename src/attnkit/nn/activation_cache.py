"""The activations one forward pass recorded, by hook name (:mod:`attnkit.nn.hooks`)."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class _Named(Protocol):
    """What the cache needs of its model: the full name of a point."""

    def hook_name(self, name: str, layer: int | None = None) -> str: ...


class ActivationCache(dict[str, Tensor]):
    """Hook name → the activation recorded there (after any hook that replaced it), as
    :meth:`attnkit.nn.HookedModule.run_with_cache` returns it.

    Besides full names, ``cache["pattern", 3]`` looks a point up by the end of its name
    and its layer (:meth:`attnkit.nn.HookedModule.hook_name`).

    Args:
        model: the module whose names these are (an :class:`attnkit.nn.HookedModule`).
    """

    def __init__(self, model: _Named) -> None:
        super().__init__()
        self.model = model

    def __getitem__(self, key: str | tuple[str, int | None]) -> Tensor:
        if isinstance(key, tuple):
            name, layer = key
            key = self.model.hook_name(name, layer)
        return super().__getitem__(key)

    def __repr__(self) -> str:
        return f"ActivationCache({list(self)})"
