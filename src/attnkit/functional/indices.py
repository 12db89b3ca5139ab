"""Layer and head indices as every part of attnkit reads them: ints, negative ones
counted from the end (``-1`` is the last), checked against the count, with one error
message everywhere.

Stacks (``return_weights=[...]``), models (``run(return_weights=[...], heads=[...])``), the
inspection functions, the command line, the web app and
:func:`attnkit.functional.weights_on_demand` all go through :func:`normalize_indices` (or
:func:`select_indices` for a selection that may be ``True``/``False``). The errors are typed:
:class:`IndexOutOfRange` (a ``ValueError``) for an index past the count, :class:`NotAnIndex`
(a ``TypeError``) for a value that is no index, so a caller tells them apart by type.
A run of query rows (``run(rows=...)``, ``--rows``) goes through :func:`normalize_rows`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable


class IndexOutOfRange(ValueError):
    """An index outside the valid range; the message gives the range."""


class NotAnIndex(TypeError):
    """A value given as an index that is not an int (a bool is not one)."""


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
        NotAnIndex: not an int (a bool is not an index).
        IndexOutOfRange: out of range; the message gives the valid range.
    """
    if isinstance(value, bool):
        raise NotAnIndex(f"{what} indices must be ints, got {value!r}")
    try:
        index = operator.index(value)
    except TypeError:
        raise NotAnIndex(f"{what} indices must be ints, got {value!r}") from None
    lowest = -count if from_end else 0
    if not lowest <= index < count:
        said = context if context is not None else f"there are {count} {what}s"
        end = f" (or -{count}..-1 from the end)" if from_end else ""
        raise IndexOutOfRange(f"{what} {index} is out of range: {said}, 0..{count - 1}{end}")
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
        NotAnIndex: an index that is not an int.
        IndexOutOfRange: an index out of range.
        ValueError: no index when ``allow_empty`` is false.
    """
    if values is None:
        return list(range(count))
    out = [normalize_index(v, count, what, context=context, from_end=from_end) for v in values]
    if not out and not allow_empty:
        raise ValueError(f"no {what}s selected; give at least one {what} index")
    return out


def select_indices(
    selection: bool | Iterable[int] | None,
    count: int,
    what: str,
    *,
    context: str | None = None,
    from_end: bool = True,
    in_given_order: bool = False,
) -> list[int]:
    """A selection of layers or heads as distinct indices ``0 .. count - 1``.

    Args:
        selection: ``True`` or ``None`` for all, ``False`` for none, or indices (repeats
            do not matter).
        count, what, context, from_end: as in :func:`normalize_index`.
        in_given_order: keep the order of ``selection`` (each index where it first comes)
            instead of sorting, as the command line's ``--layers 5,0`` draws layer 5 first.

    Returns:
        The chosen indices, each once, sorted unless ``in_given_order``.

    Raises:
        NotAnIndex: an index that is not an int.
        IndexOutOfRange: an index out of range.
    """
    if selection is None or selection is True:
        return list(range(count))
    if selection is False:
        return []
    chosen = normalize_indices(selection, count, what, context=context, from_end=from_end, allow_empty=True)
    return list(dict.fromkeys(chosen)) if in_given_order else sorted(set(chosen))


def normalize_rows(rows: range | slice | None, count: int, *, context: str | None = None) -> range:
    """A run of query rows as a ``range`` with step 1 inside ``0 .. count - 1``.

    Args:
        rows: ``None`` for every row; a ``slice``, read as Python slices a list of
            ``count`` items (``slice(-64, None)``: the last 64); or a ``range``, which must
            lie inside the count.
        count: how many rows there are.
        context: what the message says about the count (default ``"there are N rows"``).

    Returns:
        ``range(start, stop)``, not empty.

    Raises:
        NotAnIndex: neither ``None``, a slice nor a range, or bounds that are not ints.
        IndexOutOfRange: a range past the count.
        ValueError: a step other than 1, or no row.
    """
    said = context if context is not None else f"there are {count} rows"
    if rows is None:
        return range(count)
    if isinstance(rows, slice):
        for bound in (rows.start, rows.stop, rows.step):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
                raise NotAnIndex(f"rows must be a slice of ints, got {rows!r}")
        chosen = range(count)[rows]
    elif isinstance(rows, range):
        chosen = rows
        if rows.start < 0 or rows.stop > count:
            raise IndexOutOfRange(f"rows {rows.start}..{rows.stop - 1} are out of range: {said}, 0..{count - 1}")
    else:
        raise NotAnIndex(f"rows must be a range or a slice of query positions, got {rows!r}")
    if chosen.step != 1:
        raise ValueError(f"rows must be consecutive (step 1), got {rows!r}")
    if len(chosen) == 0:
        spelled = f"{'' if rows.start is None else rows.start}:{'' if rows.stop is None else rows.stop}"
        raise ValueError(f"no rows selected by {spelled if isinstance(rows, slice) else rows}: {said}")
    return chosen
