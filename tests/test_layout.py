"""The tests mirror the package: each folder of tests/ is a package of src/attnkit (its
tests), except the few that hold what is not a package's: the stand-in models every test
shares (``fixtures``), the docs' examples run as tests (``docs``) and the installed
package's checks (``packaging``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "attnkit"
NOT_A_PACKAGE_S = {"fixtures", "docs", "packaging"}


def _folders(root: Path) -> set[str]:
    return {
        path.parent.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if path.parent != root and "__pycache__" not in path.parts
    }


def test_every_folder_of_tests_mirrors_a_package() -> None:
    unmirrored = sorted(_folders(TESTS) - _folders(PACKAGE) - NOT_A_PACKAGE_S)
    assert unmirrored == [], f"folders of tests/ with no package of that path in src/attnkit: {unmirrored}"


def test_the_stand_in_models_live_in_fixtures() -> None:
    """A module of tests/ that defines a stand-in model or writes a checkpoint folder lives
    in tests/fixtures/, where the next test looks for one."""
    stray = sorted(
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("*.py")
        if not path.name.startswith(("test_", "conftest", "__init__"))
        and path.parent.name != "fixtures"
        and any(
            word in path.read_text(encoding="utf-8") for word in ("save_pretrained(", "class Fake", "InspectableModel")
        )
    )
    assert stray == []
