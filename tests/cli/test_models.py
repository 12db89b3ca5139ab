"""`attnkit models fetch|list` and `attnkit generate`."""

from __future__ import annotations

import pytest

from attnkit.cli import main

pytestmark = pytest.mark.slow


def test_models_list_and_fetch_when_cached(capsys, smollm2_path, minilm_path):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2  llama" in out and "minilm   bert" in out and str(smollm2_path) in out
    assert main(["models", "fetch", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"smollm2: already fetched, {smollm2_path}" in out and f"minilm: already fetched, {minilm_path}" in out


def test_models_list_when_empty(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert main(["models", "list"]) == 0
    assert "no models in" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["models", "fetch", "gpt-9"])
    assert "invalid choice: 'gpt-9'" in capsys.readouterr().err


def test_generate_streams_a_greedy_continuation(capsys, smollm2_path):
    assert main(["generate", "The capital of France is", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out == " Paris.\n\n"


def test_generate_errors_name_the_fix(capsys, tmp_path, monkeypatch, minilm_path):
    assert main(["generate", "hi", "--model", "minilm"]) == 2
    assert "minilm is a bidirectional encoder (bert); it cannot generate text" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", "nosuch"]) == 2
    assert (
        "--model 'nosuch' is neither a known model (smollm2, minilm, gemma3), a folder, nor a Hugging Face name ORG/NAME"
        in capsys.readouterr().err
    )
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert main(["generate", "hi"]) == 2
    assert "run `attnkit models fetch smollm2` first" in capsys.readouterr().err
