"""TransformerLens' layer ranges and return kinds for :meth:`attnkit.models.Model.run_with_hooks`
and :meth:`~attnkit.models.Model.run_with_cache`: ``start_at_layer`` (the pass starts from
a residual stream given at a layer), ``stop_at_layer`` (it ends before a layer and returns
the residual stream there), ``return_type`` (``"logits"``, ``"loss"``, ``"both"``,
``None``) and the cache's ``pos_slice`` (only some positions of every activation kept).

Shape letters: ``b`` batch, ``s`` positions, ``e`` model dim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

from torch import Tensor

from attnkit.nn import ActivationCache
from attnkit.nn.hooks import HookedModule, HookPoint

ReturnType = Literal["logits", "loss", "both"] | None
RETURN_TYPES = ("logits", "loss", "both", None)
PositionSlice = int | slice | Sequence[int] | None


class _Stopped(Exception):
    """Ends a forward pass at ``stop_at_layer``; :func:`stopped_at` catches it."""


def check_layer(value: int | None, num_layers: int, what: str) -> int | None:
    """A ``start_at_layer`` or ``stop_at_layer`` in ``0 .. num_layers`` (negative ones
    count from the end, as in TransformerLens), or ``None``.

    Raises:
        ValueError: a value outside ``-num_layers .. num_layers`` or not an integer.
    """
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not -num_layers <= value <= num_layers:
        raise ValueError(f"{what} must be an integer in [-{num_layers}, {num_layers}], got {value!r}")
    return value + num_layers if value < 0 else value


def check_return_type(return_type: object) -> None:
    """Raises ValueError for a ``return_type`` other than TransformerLens' four."""
    if return_type not in RETURN_TYPES:
        raise ValueError(f'return_type must be "logits", "loss", "both" or None, got {return_type!r}')


@contextlib.contextmanager
def stopped_at(module: HookedModule, stop: int | None, num_layers: int) -> Iterator[list[Tensor]]:
    """Inside the block, end every forward pass of ``module`` before layer ``stop``: the
    yielded list then holds the residual stream there ``[b, s, e]`` (the stream into layer
    ``stop``, or out of the last layer for ``stop = num_layers``). Nothing after that point
    runs or is recorded; the hooks and caches before it act as usual. ``None`` changes
    nothing (the list stays empty)."""
    kept: list[Tensor] = []
    if stop is None:
        yield kept
        return
    if stop < num_layers:
        at, after = module.hook_name("resid_pre", stop), None
    else:
        names = module.hook_names()
        at = module.hook_name("resid_post", num_layers - 1)
        following = names.index(at) + 1
        after = names[following] if following < len(names) else None

    def keep(residual: Tensor, point: HookPoint) -> None:
        kept.append(residual)
        if after is None and stop < num_layers:
            raise _Stopped

    def end(_activation: Tensor, _point: HookPoint) -> None:
        raise _Stopped

    hooks = {at: keep} if after is None else {at: keep, after: end}
    with contextlib.suppress(_Stopped), module.hooks(hooks):
        yield kept


def sliced_positions(
    cache: ActivationCache, points: Mapping[str, HookPoint], pos_slice: PositionSlice
) -> ActivationCache:
    """``cache`` with only the positions ``pos_slice`` of every activation, along its
    (query) positions, as TransformerLens' ``pos_slice``: an int keeps that one position
    (the dimension stays, of size 1), a slice or a list of ints those positions; ``None``
    keeps all. Slices of the activations (views, but for a list of positions)."""
    if pos_slice is None:
        return cache
    if isinstance(pos_slice, int):
        index: slice | list[int] = slice(pos_slice, pos_slice + 1 or None)
    else:
        index = pos_slice if isinstance(pos_slice, slice) else list(pos_slice)
    out = ActivationCache(cache.model)
    for name, activation in cache.items():
        where: list[slice | list[int]] = [slice(None)] * activation.ndim
        where[points[name].positions[0]] = index
        out[name] = activation[tuple(where)]
    return out
