"""The import hook that keeps old module paths working for one release
(:class:`attnkit.deprecation.MovedModules`), on packages written into a temporary folder."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnkit.deprecation import MovedModules


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package ``movedpkg`` whose modules ``old`` and ``split`` moved into ``wing``."""
    root = tmp_path / "movedpkg"
    (root / "wing").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "wing" / "__init__.py").write_text("")
    (root / "wing" / "new.py").write_text("VALUE = 1\n")
    (root / "wing" / "first.py").write_text("A = 'first'\nSHARED = 'first'\n")
    (root / "wing" / "second.py").write_text("B = 'second'\nSHARED = 'second'\n")
    (root / "caller.py").write_text("import movedpkg.old\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = MovedModules(
        {"movedpkg.old": "movedpkg.wing.new", "movedpkg.split": ("movedpkg.wing.first", "movedpkg.wing.second")},
        removed_in="9.9",
    )
    hook.install()
    yield "movedpkg"
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, MovedModules) and "movedpkg.old" in f.moved)]
    for name in [m for m in sys.modules if m == "movedpkg" or m.startswith("movedpkg.")]:
        del sys.modules[name]


def test_an_old_path_is_the_new_module_with_a_warning_naming_both(package: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"^movedpkg\.old is now movedpkg\.wing\.new; .* attnkit 9\.9$"):
        old = importlib.import_module("movedpkg.old")
    new = importlib.import_module("movedpkg.wing.new")
    assert old is new
    assert new.__spec__.name == "movedpkg.wing.new"  # the old path's spec does not stick


def test_from_an_old_path_import_a_name(package: str) -> None:
    with pytest.warns(DeprecationWarning):
        from movedpkg.old import VALUE  # type: ignore[import-not-found]
    assert VALUE == 1


def test_the_warning_points_at_the_importing_line(package: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module("movedpkg.caller")
    assert [Path(w.filename).name for w in caught] == ["caller.py"]
    assert caught[0].lineno == 1


def test_a_split_module_reads_each_name_from_the_first_new_module_that_has_it(package: str) -> None:
    with pytest.warns(
        DeprecationWarning, match=r"^movedpkg\.split is now movedpkg\.wing\.first and movedpkg\.wing\.second; "
    ):
        split = importlib.import_module("movedpkg.split")
    assert (split.A, split.B, split.SHARED) == ("first", "second", "first")
    assert {"A", "B", "SHARED"} <= set(dir(split))
    with pytest.raises(AttributeError, match=r"has no attribute 'C' \(its names moved to movedpkg\.wing\.first"):
        split.C  # noqa: B018


def test_a_path_outside_the_table_is_left_to_the_other_finders(package: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("movedpkg.never_was")


def test_installing_again_replaces_the_hook_for_the_same_paths(package: str) -> None:
    again = MovedModules(
        {"movedpkg.old": "movedpkg.wing.new", "movedpkg.split": "movedpkg.wing.first"}, removed_in="9.9"
    )
    again.install()
    assert sum(isinstance(f, MovedModules) and "movedpkg.old" in f.moved for f in sys.meta_path) == 1
    assert sys.meta_path[-1] is again


def test_a_moved_name_is_read_from_its_new_module_with_a_warning_naming_both() -> None:
    from attnkit.deprecation import moved_names

    __getattr__ = moved_names("oldmod", {"dumps": "json"}, removed_in="9.9")
    with pytest.warns(DeprecationWarning, match=r"oldmod\.dumps is now json\.dumps; the old path goes in attnkit 9\.9"):
        assert __getattr__("dumps") is importlib.import_module("json").dumps
    with pytest.raises(AttributeError, match="module 'oldmod' has no attribute 'loads'"):
        __getattr__("loads")
