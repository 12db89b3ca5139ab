"""Layer and head indices: one reading everywhere, errors told apart by their type."""

from __future__ import annotations

import pytest

from attnkit.functional.indices import IndexOutOfRange, NotAnIndex, normalize_index, normalize_rows, select_indices


def test_negative_indices_count_from_the_end_and_selections_are_sorted_and_distinct():
    assert normalize_index(-1, 6, "layer") == 5
    assert select_indices([3, -1, 3, 0], 6, "layer") == [0, 3, 5]
    assert select_indices(True, 3, "head") == select_indices(None, 3, "head") == [0, 1, 2]
    assert select_indices(False, 3, "head") == [] == select_indices([], 3, "head")


def test_a_selection_may_keep_the_order_it_was_given_in():
    assert select_indices([3, -1, 3, 0], 6, "layer", in_given_order=True) == [3, 5, 0]
    assert select_indices(None, 3, "head", in_given_order=True) == [0, 1, 2]


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


def test_rows_are_a_range_or_a_slice_of_consecutive_positions() -> None:
    assert normalize_rows(None, 10) == range(10)
    assert normalize_rows(slice(-3, None), 10) == range(7, 10)
    assert normalize_rows(slice(2, 100), 10) == range(2, 10)  # a slice is clipped as Python clips it
    assert normalize_rows(range(4, 6), 10) == range(4, 6)
    with pytest.raises(IndexOutOfRange, match=r"rows 8..11 are out of range: the text has 10 tokens, 0..9"):
        normalize_rows(range(8, 12), 10, context="the text has 10 tokens")
    with pytest.raises(ValueError, match="step 1"):
        normalize_rows(slice(0, 10, 2), 10)
    with pytest.raises(ValueError, match="no rows selected"):
        normalize_rows(slice(5, 5), 10)
    with pytest.raises(NotAnIndex, match="rows must be a range or a slice"):
        normalize_rows([1, 2], 10)  # type: ignore[arg-type]
    with pytest.raises(NotAnIndex, match="a slice of ints"):
        normalize_rows(slice(1.5, 3), 10)
