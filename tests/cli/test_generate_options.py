"""``attnkit generate --no-stop-at-eos`` and ``--top-p`` reach the model's ``generate``, on a
tiny random qwen2 whose end-of-sequence token is the first one it produces greedily."""

from __future__ import annotations

import json
import shutil

import pytest

from attnkit import models
from attnkit.cli import generate, main

pytest.importorskip("transformers")

PROMPT = "w3 w17 w5"


@pytest.fixture(scope="module")
def ending(tiny_family_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("generate-cli") / "qwen2"
    shutil.copytree(tiny_family_folder("qwen2"), folder)
    first = next(models.load(folder).generate_ids(PROMPT, max_new_tokens=1))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": first}))
    return models.load(folder)


def _printed(capsys, monkeypatch, model, *options: str) -> str:
    monkeypatch.setattr(generate, "load_model_of", lambda *args, **kwargs: model)
    assert main(["generate", PROMPT, "--max-new-tokens", "4", *options]) == 0
    return capsys.readouterr().out


def test_no_stop_at_eos_prints_past_the_end_of_sequence_token(capsys, monkeypatch, ending):
    assert _printed(capsys, monkeypatch, ending) == "\n"
    expected = ending.tokenizer.decode(list(ending.generate_ids(PROMPT, max_new_tokens=4, stop_at_eos=False)))
    assert expected and _printed(capsys, monkeypatch, ending, "--no-stop-at-eos") == expected + "\n"


def test_top_p_samples_from_the_nucleus(capsys, monkeypatch, ending):
    greedy = _printed(capsys, monkeypatch, ending, "--no-stop-at-eos")
    tiny_nucleus = ("--no-stop-at-eos", "--temperature", "1", "--top-p", "1e-6", "--seed", "0")
    assert _printed(capsys, monkeypatch, ending, *tiny_nucleus) == greedy
    assert "top_p must be a probability mass" in _error(capsys, monkeypatch, ending, "--top-p", "2")


def _error(capsys, monkeypatch, model, *options: str) -> str:
    monkeypatch.setattr(generate, "load_model_of", lambda *args, **kwargs: model)
    assert main(["generate", PROMPT, *options]) == 2
    return capsys.readouterr().err
