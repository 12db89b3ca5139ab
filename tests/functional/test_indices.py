"""Layer and head indices: one reading everywhere, errors told apart by their type."""

from __future__ import annotations

import pytest

from attnkit.functional.indices import IndexOutOfRange, NotAnIndex, normalize_index, select_indices


def test_negative_indices_count_from_the_end_and_selections_are_sorted_and_distinct():
    assert normalize_index(-1, 6, "layer") == 5
    assert select_indices([3, -1, 3, 0], 6, "layer") == [0, 3, 5]
    assert select_indices(True, 3, "head") == select_indices(None, 3, "head") == [0, 1, 2]
    assert select_indices(False, 3, "head") == [] == select_indices([], 3, "head")


def test_out_of_range_and_not_an_index_are_typed_errors_and_stay_value_and_type_errors():
    with pytest.raises(IndexOutOfRange, match=r"layer 6 is out of range: this model has 6 layers, 0\.\.5") as err:
        select_indices([6], 6, "layer", context="this model has 6 layers")
    assert isinstance(err.value, ValueError)
    with pytest.raises(IndexOutOfRange, match=r"head -1 is out of range: there are 4 heads, 0\.\.3$"):
        normalize_index(-1, 4, "head", from_end=False)
    with pytest.raises(NotAnIndex, match="layer indices must be ints, got True") as err_type:
        select_indices([True], 6, "layer")
    assert isinstance(err_type.value, TypeError)
    with pytest.raises(NotAnIndex, match=r"head indices must be ints, got '1'"):
        normalize_index("1", 4, "head")  # type: ignore[arg-type]
