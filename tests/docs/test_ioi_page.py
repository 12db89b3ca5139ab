"""docs/ioi.md runs, and prints what it shows: its python blocks run in order on SmolLM2, and
what each prints equals the ``text`` block right after it (the blocks of TransformerLens
code, introduced by prose, are not run): text exactly, every number within 1e-4."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from tests.docs.test_code_blocks import code_blocks, run_python_block

PAGE = Path(__file__).resolve().parents[2] / "docs" / "ioi.md"
_NUMBER = re.compile(r"[-+]?\d+\.\d+")
TOLERANCE = 1e-4


def shown_outputs() -> list[tuple[int, str | None]]:
    """``(index of each python block, the text block right after it or None)``: a text block
    follows a python block when nothing but blank lines stands between them."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = code_blocks(PAGE)
    pairs = []
    for i, block in enumerate(blocks):
        if block.language != "python":
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        end = text.find("```\n", text.index(block.text)) + 4
        between = text[end : text.index("```text", end)] if after is not None and after.language == "text" else "x"
        pairs.append((i, after.text if after is not None and not between.strip() else None))
    return pairs


def same_figures(shown: str, printed: str) -> bool:
    """The same lines, their words equal and their numbers within :data:`TOLERANCE`."""
    shown_lines, printed_lines = shown.strip().splitlines(), printed.strip().splitlines()
    if len(shown_lines) != len(printed_lines):
        return False
    for expected, actual in zip(shown_lines, printed_lines):
        if _NUMBER.split(expected) != _NUMBER.split(actual):
            return False
        pairs = zip(_NUMBER.findall(expected), _NUMBER.findall(actual))
        if any(abs(float(a) - float(b)) > TOLERANCE + 1e-9 for a, b in pairs):
            return False
    return True


def test_every_printing_block_shows_its_output():
    blocks = code_blocks(PAGE)
    printing = [i for i, _ in shown_outputs() if "print(" in blocks[i].text]
    assert printing and all(output is not None for i, output in shown_outputs() if i in printing)


def test_figures_compare_within_the_tolerance():
    assert same_figures("L23H3: +0.7400 (patching +0.6774)", "L23H3: +0.7401 (patching +0.6774)")
    assert not same_figures("L23H3: +0.7400", "L23H3: +0.7402")
    assert not same_figures("L23H3: +0.7400", "L23H2: +0.7400")
    assert not same_figures("L23H3: +0.7400", "L23H3: +0.7400\nL29H1: +0.2959")


@pytest.mark.slow
def test_the_page_prints_what_it_shows(smollm2_path):
    blocks = code_blocks(PAGE)
    namespace: dict = {"__name__": "docs_ioi"}
    for index, shown in shown_outputs():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            run_python_block(blocks[index], namespace)
        if shown is not None:
            assert same_figures(shown, printed.getvalue()), (
                f"the block at {blocks[index].id} printed\n{printed.getvalue()}\nbut the page shows\n{shown}"
            )
