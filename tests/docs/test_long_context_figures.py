"""The figures of docs/long-contexts.md's "Gemma 3 at 32K tokens" are the benchmark's.

The page's two tables are read back and compared with the row of
``benchmarks/results/bench_long_context.json`` that the command shown there wrote (32,768
tokens, too long to rerun in the suite); and the benchmark's own computation, rerun at
2,048 tokens on Gemma 3, equals the 2,048-token row saved by the same run of that command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "long-contexts.md"
RESULTS = ROOT / "benchmarks" / "results" / "bench_long_context.json"
SECTION = "## Gemma 3 at 32K tokens"


def _rows(length: int) -> dict[tuple[int, int], dict]:
    data = json.loads(RESULTS.read_text())
    (row,) = [row for row in data["rows"] if row["tokens"] == length]
    return {(head["layer"], head["head"]): head for head in row["summaries"]["heads"]}


def _table_lines(header_start: str) -> list[list[str]]:
    section = PAGE.read_text().split(SECTION, 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").split("|")])
    return body


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_global_heads_table_is_the_32k_row() -> None:
    heads = _rows(32768)
    lines = _table_lines("| layer | head | sink")
    assert len(lines) == 12, "three global layers of four heads"
    for cells in lines:
        layer, head = int(re.match(r"\d+", cells[0]).group()), int(cells[1])
        saved = heads[layer, head]
        shown = dict(zip(("sink", "distance", "distance_q50", "distance_q90", "within_window", "entropy"), cells[2:]))
        assert _number(shown["sink"]) == pytest.approx(saved["sink"], abs=0.005), (layer, head)
        assert _number(shown["distance"]) == pytest.approx(saved["distance"], abs=0.5), (layer, head)
        assert _number(shown["distance_q50"]) == saved["distance_q50"], (layer, head)
        assert _number(shown["distance_q90"]) == saved["distance_q90"], (layer, head)
        assert _number(shown["within_window"]) == pytest.approx(saved["within_window"], abs=0.005), (layer, head)
        assert _number(shown["entropy"]) == pytest.approx(saved["entropy"], abs=0.05), (layer, head)


def test_the_local_layers_table_is_the_32k_row() -> None:
    heads = _rows(32768)
    lines = _table_lines("| layer (local)")
    assert len(lines) == 15, "fifteen sliding-window layers"
    for cells in lines:
        layer = int(cells[0])
        columns = [[_number(value) for value in cell.split(",")] for cell in cells[1:]]
        for head in range(4):
            saved = heads[layer, head]
            mean, median, q90, within = (column[head] for column in columns)
            assert mean == pytest.approx(saved["distance"], abs=0.5), (layer, head)
            assert (median, q90) == (saved["distance_q50"], saved["distance_q90"]), (layer, head)
            assert within == pytest.approx(saved["within_window"], abs=0.005), (layer, head)


@pytest.mark.slow
def test_the_benchmarks_summaries_reproduce_at_2048_tokens(gemma3) -> None:
    """The ``summaries`` cell of ``bench_long_context.py`` at 2,048 tokens, in this process,
    equals the row the documented run saved (floats within 1e-4 of their size: the summaries
    are float32 sums whose order may differ by thread count)."""
    from attnkit.inspect.long_context import long_context_summaries
    from benchmarks.bench_long_context import LOCAL_STATISTICS, TEXT

    tokens = 2048
    ids = gemma3.tokenizer.encode(TEXT * (tokens // 20 + 1)).ids[0, :tokens]
    table = long_context_summaries(gemma3, ids, top_k=8, local_statistics=LOCAL_STATISTICS).head_table()
    saved = _rows(tokens)
    assert {(row["layer"], row["head"]) for row in table} == set(saved)
    for row in table:
        expected = saved[row["layer"], row["head"]]
        assert set(row) == set(expected)
        for key, value in row.items():
            if isinstance(value, float):
                assert value == pytest.approx(expected[key], rel=1e-4, abs=1e-6), (row["layer"], row["head"], key)
            else:
                assert value == expected[key], (row["layer"], row["head"], key)
