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

    monkeypatch.setattr(importlib.import_module(f"attnkit.cli.{command[0]}"), "load_model_of", no_loading)
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


def test_bidirectional_controls_are_escaped_like_other_controls():
    # Before: U+202E (right-to-left override) and the isolates reached the terminal raw and
    # reordered the rest of a table row.
    controls = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    escaped = terminal_safe(f"cat{controls}dog")
    assert escaped == "cat" + "".join(f"\\u{ord(c):04x}" for c in controls) + "dog"
    assert json.loads(json_terminal_safe(json.dumps({"t": controls}, ensure_ascii=False))) == {"t": controls}
    assert terminal_safe("שלום עולם مرحبا") == "שלום עולם مرحبا"  # right-to-left text itself stays


@pytest.mark.parametrize("temperature", ["nan", "inf", "-1"])
def test_a_temperature_that_is_not_a_finite_number_is_a_clear_error(capsys, monkeypatch, smollm2, temperature):
    # Before: --temperature nan reached torch.multinomial ("probability tensor contains
    # either inf, nan"), a traceback.
    from attnkit.cli import generate

    monkeypatch.setattr(generate, "load_model_of", lambda *args, **kwargs: smollm2)
    code, out, err = _run(capsys, "generate", "--temperature", temperature, "Hi")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith("attnkit: error: temperature must be a finite number >= 0, got"), err


def test_a_file_of_texts_is_read_only_up_to_its_limit(capsys, monkeypatch, tmp_path):
    # Before: --file /dev/zero read 7 GB, then MemoryError.
    from attnkit.cli import heads

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(heads, "load_model_of", no_loading)
    monkeypatch.setattr(heads, "MAX_FILE_BYTES", 1000)
    big = tmp_path / "texts.txt"
    big.write_text("the cat sat\n" * 100)
    for argv in (["heads", "--file", str(big)], ["heads", "--ablate", "--mean", "--file", "/dev/zero", "the cat sat"]):
        code, _, err = _run(capsys, *argv, "--out", str(tmp_path / "out"))
        assert code == 2 and "Traceback" not in err, err
        assert err.startswith(f"attnkit: error: --file {argv[argv.index('--file') + 1]} is larger than 1.0 kB"), err


def test_warnings_pass_through_the_terminal_escaping(capsys, monkeypatch):
    import warnings

    from attnkit import cli

    def warning_command(args):
        warnings.warn(f"Glyph 27 ({HOSTILE}) missing from font", UserWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(cli, "build_parser", lambda: _parser_running(warning_command))
    code, _, err = _run(capsys, "anything")
    assert code == 0 and "\x1b" not in err and "\x9b" not in err
    assert err.startswith("attnkit: warning: Glyph 27 (cat\\x1b]0;pwned")


def _parser_running(command):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("word")
    parser.set_defaults(func=command)
    return parser
