"""Layer and head indices as every part of attnkit reads them: ints, negative ones
counted from the end (``-1`` is the last), checked against the count, with one error
message everywhere.

Stacks (``return_weights=[...]``), models (``run(attention=[...], heads=[...])``), the
inspection functions, the web app and :func:`attnkit.functional.weights_on_demand` all
go through :func:`normalize_indices`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable


def normalize_index(value: int, count: int, what: str, *, context: str | None = None, from_end: bool = True) -> int:
    """One index as ``0 .. count - 1``.

    Args:
        value: the index; with ``from_end``, ``-1`` is the last.
        count: how many there are.
        what: what is indexed, for messages (``"layer"``, ``"head"``).
        context: what the message says about the count (default ``"there are N whats"``),
            e.g. ``"smollm2 has 30 layers"``.
        from_end: accept negative indices, counted from the end.

    Returns:
        The index in ``0 .. count - 1``.

    Raises:
        TypeError: not an int (a bool is not an index).
        ValueError: out of range; the message gives the valid range.
    """
    if isinstance(value, bool):
        raise TypeError(f"{what} indices must be ints, got {value!r}")
    try:
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} indices must be ints, got {value!r}") from None
    lowest = -count if from_end else 0
    if not lowest <= index < count:
        said = context if context is not None else f"there are {count} {what}s"
        end = f" (or -{count}..-1 from the end)" if from_end else ""
        raise ValueError(f"{what} {index} is out of range: {said}, 0..{count - 1}{end}")
    return index % count


def normalize_indices(
    values: Iterable[int] | None,
    count: int,
    what: str,
    *,
    context: str | None = None,
    from_end: bool = True,
    allow_empty: bool = False,
) -> list[int]:
    """Indices as ``0 .. count - 1``, in the order given (repeats kept); all of them for
    ``None``.

    Args:
        values: the indices, or ``None`` for ``0 .. count - 1``.
        count: how many there are.
        what: what is indexed, for messages.
        context: as in :func:`normalize_index`.
        from_end: as in :func:`normalize_index`.
        allow_empty: accept an empty selection.

    Returns:
        The normalised indices.

    Raises:
        TypeError: an index that is not an int.
        ValueError: an index out of range, or no index when ``allow_empty`` is false.
    """
    if values is None:
        return list(range(count))
    out = [normalize_index(v, count, what, context=context, from_end=from_end) for v in values]
    if not out and not allow_empty:
        raise ValueError(f"no {what}s selected; give at least one {what} index")
    return out
