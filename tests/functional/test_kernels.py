"""The kernel table as modules see it: names, options and what stays per call."""

from __future__ import annotations

import pytest

from attnkit.functional.kernels import KERNEL_SPECS, check_kernel_options


@pytest.mark.parametrize("option", ["return_state", "state", "return_lse", "causal"])
def test_what_changes_a_kernels_result_is_never_a_modules_option(option):
    for name, spec in KERNEL_SPECS.items():
        assert option not in (spec.option_names() or []), name
    with pytest.raises(TypeError, match=f"kernel 'linear' takes no option '{option}'; its options: feature_map"):
        check_kernel_options("linear", {option: True})


def test_a_kernels_options_are_returned_as_a_copy():
    given = {"window": 4}
    checked = check_kernel_options("local", given)
    assert checked == given and checked is not given
