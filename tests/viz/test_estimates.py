"""The size estimates live apart from the writers (attnkit.viz.estimates); their old path,
attnkit.viz.export, still gives them until 0.3, with a warning."""

from __future__ import annotations

import pytest

from attnkit.viz import estimates, export


@pytest.mark.parametrize("name", ["estimate_map_json", "estimate_map_canvas", "estimate_viewer_html"])
def test_the_estimates_still_import_from_export_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"attnkit.viz.export.{name} is now attnkit.viz.estimates.{name}"):
        assert getattr(export, name) is getattr(estimates, name)


def test_export_holds_no_estimate_of_its_own() -> None:
    assert not [name for name in vars(export) if name.startswith("estimate_")]


def test_the_long_page_bound_still_imports_from_the_long_view_with_a_warning() -> None:
    from attnkit.viz.viewer import long_view

    path = "attnkit.viz.viewer.long_view.estimate_long_html is now attnkit.viz.estimates.estimate_long_html"
    with pytest.warns(DeprecationWarning, match=path):
        assert long_view.estimate_long_html is estimates.estimate_long_html
    assert not [name for name in vars(long_view) if name.startswith("estimate_")]
