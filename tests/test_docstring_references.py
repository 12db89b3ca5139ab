"""Every ``:class:`attnkit.…``` (and ``:func:``, ``:meth:``, ``:attr:``, ``:mod:``, ``:data:``,
``:exc:``) reference in the sources' docstrings and comments names something that exists: a
module, a name in it, or an attribute of a class (a field, or one its docstring's
``Attributes:`` section lists)."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"
REFERENCE = re.compile(r":(?:class|func|meth|attr|mod|data|exc):`~?(attnkit(?:\.\w+)+)`")


def _exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if hasattr(found, attribute):
                found = getattr(found, attribute)
            elif inspect.isclass(found):
                # An instance attribute: a field, or one the class's docstring lists.
                listed = re.search(rf"^\s+{attribute}:", inspect.getdoc(found) or "", re.M)
                return attribute in getattr(found, "__annotations__", {}) or listed is not None
            else:
                return False
        return True
    return False


def test_every_reference_names_something_that_exists() -> None:
    missing = [
        f"{path.relative_to(SRC)}: {match.group(1)}"
        for path in sorted(SRC.rglob("*.py"))
        for match in REFERENCE.finditer(path.read_text(encoding="utf-8"))
        if not _exists(match.group(1))
    ]
    assert not missing, f"references to nothing: {missing}"
