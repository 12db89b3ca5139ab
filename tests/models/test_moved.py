"""The old module paths of ``attnkit.models`` (:data:`attnkit.models.moved.MOVED_MODULES`):
each still imports, with a warning naming the new path, and nothing of attnkit spells one."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.models.moved import MOVED_MODULES

ROOT = Path(__file__).resolve().parents[2]


def _new_paths(old: str) -> tuple[str, ...]:
    new = MOVED_MODULES[old]
    return (new,) if isinstance(new, str) else new


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_imports_with_a_warning_naming_the_new_one(old: str) -> None:
    sys.modules.pop(old, None)
    try:
        with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} is now {re.escape(_new_paths(old)[0])}"):
            module = importlib.import_module(old)
        new = [importlib.import_module(path) for path in _new_paths(old)]
        if len(new) == 1:
            assert module is new[0]
        for name in {name for target in new for name in vars(target) if not name.startswith("_")}:
            owner = next(target for target in new if hasattr(target, name))
            assert getattr(module, name) is getattr(owner, name), name
    finally:
        sys.modules.pop(old, None)


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_an_attribute_of_attnkit_models_with_the_warning(old: str) -> None:
    """``attnkit.models.registry.MANIFEST`` worked after ``import attnkit.models`` (the
    package imported the module): so it does for one release."""
    import attnkit.models

    sys.modules.pop(old, None)
    vars(attnkit.models).pop(old.rsplit(".", 1)[1], None)
    try:
        with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} is now"):
            module = getattr(attnkit.models, old.rsplit(".", 1)[1])
        assert module is sys.modules[old]
    finally:
        sys.modules.pop(old, None)
        vars(attnkit.models).pop(old.rsplit(".", 1)[1], None)


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_no_file_any_more(old: str) -> None:
    """A module left at an old path would be imported instead of the new one, silently."""
    relative = Path(*old.split("."))
    assert not (ROOT / "src" / relative.with_suffix(".py")).exists()
    assert not (ROOT / "src" / relative / "__init__.py").exists()


def test_nothing_spells_an_old_path() -> None:
    old_path = re.compile("|".join(rf"\b{re.escape(old)}(?![\w])" for old in MOVED_MODULES))
    tracked = subprocess.run(
        [
            "git",
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "src",
            "tests",
            "benchmarks",
            "docs",
            "README.md",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    mentions = [
        f"{name}: {match.group(0)}"
        for name in tracked
        if name not in ("src/attnkit/models/moved.py", "tests/models/test_moved.py")
        and name.endswith((".py", ".md", ".yml"))
        and (ROOT / name).is_file()
        for match in old_path.finditer((ROOT / name).read_text(encoding="utf-8"))
    ]
    assert mentions == []
