"""The command line against bad paths and hostile text: unwritable --out, a folder as
--input, control characters and undecodable bytes never reach the terminal raw."""

from __future__ import annotations

import importlib
import json

import pytest

from attnkit.cli import main
from attnkit.viz.terminal import json_terminal_safe, terminal_safe

HOSTILE = "cat\x1b]0;pwned\x07 \x1b[2J sat \x9b1m"


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", [["inspect", "hello"], ["heads", "hello"]])
def test_an_unwritable_out_is_refused_before_any_work(capsys, tmp_path, command, monkeypatch, minilm_path):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(importlib.import_module(f"attnkit.cli.{command[0]}"), "load_model", no_loading)
    (tmp_path / "file").write_text("a file, not a folder")
    code, _, err = _run(capsys, *command, "--out", str(tmp_path / "file" / "out"), "--model", "minilm")
    assert code == 2 and err.startswith(f"attnkit: error: cannot write to --out {tmp_path / 'file' / 'out'}")


def test_an_out_that_fails_while_writing_is_a_clear_error(capsys, tmp_path, monkeypatch, minilm_path):
    from attnkit.viz import export

    def failing(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(export, "write_json", failing)
    code, _, err = _run(capsys, "inspect", "hello", "--model", "minilm", "--out", str(tmp_path), "--format", "json")
    assert code == 2 and err.endswith(f"attnkit: error: cannot write to --out {tmp_path}: Permission denied\n")
    assert "Traceback" not in err


def test_explain_input_that_is_a_folder(capsys, tmp_path):
    code, _, err = _run(capsys, "explain", "--input", str(tmp_path))
    assert code == 2 and err == f"attnkit: error: {tmp_path} is a folder; give a JSON file\n"
    (tmp_path / "bad.json").write_text('{"tokens": 3, "q": [[1]], "k": [[1]], "v": [[1]]}')
    code, _, err = _run(capsys, "explain", "--input", str(tmp_path / "bad.json"))
    assert code == 2 and "tokens must be a list of tokens, got int" in err


def test_control_characters_are_escaped_in_explain(capsys, tmp_path):
    tokens = HOSTILE.split()
    row = [[1.0, 0.0]] * len(tokens)
    (tmp_path / "in.json").write_text(json.dumps({"tokens": tokens, "q": row, "k": row, "v": row}))
    for extra in ([], ["--json"]):
        code, out, err = _run(capsys, "explain", "--input", str(tmp_path / "in.json"), *extra)
        assert code == 0, err
        assert not any(c in out for c in "\x1b\x07\x9b")
    assert json.loads(out)["key_tokens"] == tokens  # the JSON escapes stand for the same tokens
    code, out, _ = _run(capsys, "explain", "--input", str(tmp_path / "in.json"))
    assert "cat\\x1b]0;pwned\\x07" in out
    code, _, err = _run(capsys, "explain", "--query", "\x1b[31mred")
    assert code == 2 and "\x1b" not in err and "\\x1b[31mred" in err


def test_control_characters_and_undecodable_bytes_in_inspect(capsys, tmp_path, minilm_path):
    code, out, err = _run(capsys, "inspect", HOSTILE, "--model", "minilm", "--out", str(tmp_path), "--format", "json")
    assert code == 0, err
    assert not any(c in out + err for c in "\x1b\x07\x9b")
    # A Latin-1 byte on a UTF-8 command line reaches Python as a lone surrogate.
    code, _, err = _run(capsys, "inspect", "caf\udce9", "--model", "minilm", "--out", str(tmp_path))
    assert code == 2 and "the text is not valid Unicode: '\\udce9' at character 3" in err


def test_terminal_safe_keeps_text_and_escapes_controls():
    assert terminal_safe("a\tb\nc 고파서") == "a\tb\nc 고파서"
    assert terminal_safe("\x1b[2J\x07\x7f\x9b\ud800\r") == "\\x1b[2J\\x07\\x7f\\x9b\\ud800\\r"
    text = json.dumps({"t": HOSTILE + "\ud800"}, ensure_ascii=False)
    assert json.loads(json_terminal_safe(text)) == {"t": HOSTILE + "\ud800"}
    assert not any(c in json_terminal_safe(text) for c in "\x1b\x07\x9b\ud800")
