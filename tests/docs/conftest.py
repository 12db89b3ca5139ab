"""The documentation's commands that train for minutes (``RUN_ONCE`` of
tests/docs/test_code_blocks.py) start in their own process as soon as the session knows
which tests it runs, in a folder of their own, and are stopped when the session ends if no
test waited for them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

_folder: tempfile.TemporaryDirectory[str] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    global _folder
    from tests.docs import test_code_blocks

    blocks = [
        item.callspec.params["block"]
        for item in session.items
        if getattr(item, "module", None) is test_code_blocks
        and hasattr(item, "callspec")
        and "block" in item.callspec.params
    ]
    if blocks:
        _folder = tempfile.TemporaryDirectory(prefix="attnkit-docs-")
        test_code_blocks.start_in_background(blocks, Path(_folder.name))


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.docs.test_code_blocks import stop_background

    stop_background()
    if _folder is not None:
        _folder.cleanup()
