"""Every row of docs/transformerlens.md's table runs: its attnkit cell is evaluated on
SmolLM2 after the page's setup block (context managers entered around a run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.test_code_blocks import code_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "transformerlens.md"
_ROW = re.compile(r"^\| (?P<tl>.+?) \| `(?P<attnkit>[^`]+)` \|$")


def table_rows() -> list[tuple[str, str]]:
    """``(TransformerLens cell, attnkit expression)`` of every row of the page's table."""
    rows = [m.group("tl", "attnkit") for line in PAGE.read_text().splitlines() if (m := _ROW.match(line))]
    return [(tl, attnkit) for tl, attnkit in rows if tl != "TransformerLens"]


@pytest.fixture(scope="module")
def namespace(smollm2) -> dict:
    setup = next(block for block in code_blocks(PAGE) if block.language == "python")
    scope: dict = {"__name__": "docs_transformerlens"}
    exec(compile(setup.text, f"{PAGE.name}:{setup.line}", "exec"), scope)
    return scope


def test_the_table_has_every_name():
    expressions = " ".join(attnkit for _, attnkit in table_rows())
    for name in ("W_E", "W_pos", "W_gate", "b_U", "loss_fn", "to_str_tokens", "composition_scores", "detect_heads"):
        assert name in expressions, name


@pytest.mark.slow
@pytest.mark.parametrize("row", table_rows(), ids=lambda row: row[0])
def test_row_runs(namespace, row):
    _, expression = row
    value = eval(expression, namespace)  # noqa: S307 (the page's own code)
    if hasattr(value, "__enter__"):
        with value:
            namespace["model"].run(namespace["text"], return_weights=False)
    assert value is not None or "W_pos" in expression
