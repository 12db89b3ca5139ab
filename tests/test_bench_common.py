"""benchmarks/common.py's timing: contenders measured in turn, and the ratio of two of them
taken round by round."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.common import interleaved_samples, interleaved_times, paired_ratio


def test_contenders_run_in_turn_the_order_alternating_each_round():
    calls: list[str] = []
    ticks = itertools.count()
    samples = interleaved_samples(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        repeat=3,
        warmup=1,
        clock=lambda: float(next(ticks)),
    )
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then a b, b a, a b
    assert samples == {"a": [1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0]}
    assert interleaved_times({"a": lambda: None}, repeat=3, clock=lambda: float(next(ticks))) == {"a": 1.0}


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    # b is 2x slower than a in every round; rounds 3-5 ran during a spell that made
    # everything 3x slower, and in round 2 the spell began after a had run.
    a = [1.0, 1.0, 3.0, 3.0, 3.0]
    b = [2.0, 6.0, 6.0, 6.0, 6.0]
    assert paired_ratio(b, a) == 2.0  # rounds: 2, 6, 2, 2, 2
    assert paired_ratio([2.0, 9.0, 4.0], [1.0, 1.0, 1.0]) == 4.0  # the median, not the mean


@pytest.mark.parametrize(("numerator", "denominator"), [([], []), ([1.0], [1.0, 2.0])])
def test_paired_ratio_refuses_lists_that_do_not_pair(numerator, denominator):
    with pytest.raises(ValueError, match=f"got {len(numerator)} and {len(denominator)}"):
        paired_ratio(numerator, denominator)
