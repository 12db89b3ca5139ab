"""`attnkit explain`: the notes' worked example, options, JSON, and errors."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest

from attnkit.cli import main
from attnkit.viz.terminal import display_width


def context_vector(out: str) -> list[float]:
    """The context vector that the summary's ``context`` line prints."""
    found = re.search(r"^context +\[([^\]]*)\]", out, re.M)
    assert found, f"no context line in:\n{out}"
    return [float(x) for x in found.group(1).split(",")]


def run(capsys, *argv):
    code = main(["explain", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_reproduces_the_notes_numbers(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    softmax = out.split("Step 3.")[1].split("Step 4.")[0]
    rows = {
        line.split()[0]: float(line.split()[-1])
        for line in softmax.splitlines()
        if line.split() and line.split()[0] in {"the₁", "cat", "sat", "on", "the₂", "mat"}
    }
    # Printed with 4 decimals: each within one unit of the last, which another processor's
    # float sums may round the other way.
    notes = {"the₁": 0.1296, "cat": 0.1296, "sat": 0.3522, "on": 0.1296, "the₂": 0.1296, "mat": 0.1296}
    assert rows == pytest.approx(notes, abs=1e-4)
    assert context_vector(out) == pytest.approx([0.1575, 0.1575, 0.1316, 0.1575], abs=1e-4)
    for step in ("Step 0.", "Step 1.", "Step 2.", "Step 3.", "Step 4.", "Summary of shapes"):
        assert step in out
    assert "(1 x 4) × (6 x 4)ᵀ" in out and "(1 x 6)" in out


@pytest.mark.parametrize("argv", [[], ["--query", "all"], ["--query", "all", "--causal"], ["--score", "dot"]])
def test_output_fits_an_80_column_terminal(capsys, argv):
    _, out, _ = run(capsys, *argv)
    assert max(display_width(line) for line in out.splitlines()) <= 80


def test_json_output_is_machine_readable(capsys):
    code, out, _ = run(capsys, "--json")
    data = json.loads(out)
    [sat] = data["queries"]
    assert sat["token"] == "sat" and sat["index"] == 2
    assert [round(w, 4) for w in sat["weights"]] == [0.1296, 0.1296, 0.3522, 0.1296, 0.1296, 0.1296]
    assert [round(c, 4) for c in sat["context"]] == [0.1575, 0.1575, 0.1316, 0.1575]
    assert sat["scores"] == [2, 2, 4, 2, 2, 2] and sat["scaled_scores"] == [1, 1, 2, 1, 1, 1]
    assert data["scale"] == 0.5


def test_dot_score_is_not_scaled(capsys):
    _, out, _ = run(capsys, "--score", "dot", "--json")
    [sat] = json.loads(out)["queries"]
    assert sat["scaled_scores"] == sat["scores"]
    e2, e4 = 2.718281828**2, 2.718281828**4
    assert round(sat["weights"][2], 4) == round(e4 / (e4 + 5 * e2), 4)


def test_causal_masks_later_tokens_and_rows_sum_to_one(capsys):
    _, out, _ = run(capsys, "--causal", "--query", "all", "--json")
    queries = json.loads(out)["queries"]
    assert len(queries) == 6
    for row in queries:
        i = row["index"]
        assert all(w == 0 for w in row["weights"][i + 1 :])
        assert abs(sum(row["weights"]) - 1) < 1e-9
    assert queries[0]["weights"][0] == 1.0
    _, text, _ = run(capsys, "--causal")
    assert "masked" in text


def test_query_by_row_number_and_case_insensitive_token(capsys):
    _, out, _ = run(capsys, "--query", "5", "--json")
    assert json.loads(out)["queries"][0]["token"] == "mat"
    _, out, _ = run(capsys, "--query", "CAT", "--json")
    assert json.loads(out)["queries"][0]["token"] == "cat"


def test_input_file_with_korean_tokens_stays_aligned(capsys, tmp_path):
    path = tmp_path / "ko.json"
    path.write_text(
        json.dumps(
            {
                "tokens": ["어제", "밤에", "배가", "고파서"],
                "q": [[1, 0], [0, 1], [1, 1], [0.5, 0.5]],
                "k": [[1, 0], [0, 1], [1, 1], [0.5, 0.5]],
                "v": [[1, 2], [3, 4], [5, 6], [7, 8]],
            },
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "--input", str(path), "--query", "배가")
    assert code == 0
    table = out.split("Step 0.")[1].split("\n\n")[0].splitlines()[1:]
    header, rule, rows = table[0], table[1], table[2:]
    assert len(rows) == 4
    q_column = display_width(header.split("Q")[0])
    assert q_column == len(rule.split(" ")[0]) + 2  # the rule under the tokens is as wide as 고파서
    assert {display_width(line.split("[")[0]) for line in rows} == {q_column}


def test_cross_attention_input_with_query_tokens(capsys, tmp_path):
    path = tmp_path / "cross.json"
    path.write_text(
        json.dumps(
            {"query_tokens": ["je"], "tokens": ["I", "am"], "q": [[1, 0]], "k": [[1, 0], [0, 1]], "v": [[1], [0]]}
        )
    )
    code, out, _ = run(capsys, "--input", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["queries"][0]["token"] == "je" and len(data["queries"][0]["weights"]) == 2


@pytest.mark.parametrize(
    ("content", "argv", "message"),
    [
        (None, ["--query", "dog"], "query 'dog' is not one of the tokens"),
        (None, ["--query", "the"], "matches rows [0, 4]"),
        ("{", [], "is not valid JSON"),
        ('{"tokens": ["a"], "q": [[1]]}', [], "is missing k, v"),
        (
            '{"tokens": ["a", "b"], "q": [[1], [2]], "k": [[1]], "v": [[1]]}',
            [],
            "k has 1 rows and v 1, but there are 2 tokens",
        ),
        ('{"tokens": ["a"], "q": [[1, 2]], "k": [[1]], "v": [[1]]}', [], "q and k must have the same width"),
        ('{"tokens": ["a"], "q": [1], "k": [[1]], "v": [[1]]}', [], "q must be a 2-D list"),
    ],
)
def test_bad_input_is_a_clear_error(capsys, tmp_path, content, argv, message):
    if content is not None:
        path = tmp_path / "in.json"
        path.write_text(content)
        argv = [*argv, "--input", str(path)]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err


def test_missing_input_file(capsys, tmp_path):
    code, _, err = run(capsys, "--input", str(tmp_path / "nope.json"))
    assert code == 2 and "input file not found" in err


@pytest.mark.slow
def test_console_script_runs():
    result = subprocess.run(
        [sys.executable, "-m", "attnkit.cli", "explain"], capture_output=True, text=True, check=True
    )
    assert context_vector(result.stdout) == pytest.approx([0.1575, 0.1575, 0.1316, 0.1575], abs=1e-4)


def columns(line: str) -> list[tuple[int, int]]:
    """The display-column ``(start, end)`` of each cell of a table line: text separated by
    two or more spaces, wide characters counting two columns."""
    spans = []
    for match in re.finditer(r"\S+(?: \S+)*", line):
        start = display_width(line[: match.start()])
        spans.append((start, start + display_width(match.group())))
    return spans


def test_every_table_stays_aligned_with_wide_and_combining_characters(capsys, tmp_path):
    # Hangul and full-width letters take two columns, a combining accent none.
    tokens = ["어제", "pizza", "ｆｕｌｌ", "cafe\u0301", "🍕", "배(1/3)"]
    eye = [[1.0 if i == j else 0.0 for j in range(3)] for i in range(len(tokens))]
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"tokens": tokens, "q": eye, "k": eye, "v": eye}, ensure_ascii=False), encoding="utf-8")
    code, out, _ = run(capsys, "--input", str(path), "--query", "all")
    assert code == 0
    lines = out.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"-+( +-+)*", line)]
    assert len(rules) > 10
    for r in rules:
        rule = columns(lines[r])
        body = [lines[r - 1]] + list(itertools.takewhile(str.strip, lines[r + 1 :]))
        for line in body:
            for start, end in columns(line):
                # Each cell starts where its column starts (left-aligned) or ends where it
                # ends (right-aligned), within the table's width.
                assert any(start == s or end == e for s, e in rule), (lines[r], line)
                assert end <= rule[-1][1] or start == rule[-1][0], (lines[r], line)
