"""Every command that loads a model passes on ``--revision`` and ``--dtype``: none of them
ignores either (``attnkit inspect --long``, ``heads --long`` and ``heads --detect`` did)."""

from __future__ import annotations

import pytest

from attnkit import models
from attnkit.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "the cat sat"],
        ["inspect", "--long", "the cat sat"],
        ["heads", "the cat sat"],
        ["heads", "--long", "the cat sat"],
        ["heads", "--stat", "retrieval"],
        ["heads", "--detect", "induction", "the cat sat"],
        ["heads", "--ablate", "the cat sat", "--target", " on"],
        ["patch", "--clean", "the cat sat", "--corrupt", "the dog sat", "--target", " on"],
        ["generate", "the cat sat"],
    ],
    ids=lambda argv: " ".join(a for a in argv if a.startswith("-") or a in ("inspect", "heads", "patch", "generate")),
)
def test_the_model_is_loaded_with_the_revision_and_dtype_asked(monkeypatch, capsys, tmp_path, argv):
    asked = {}

    def load(name, **options):
        asked.update(options, name=name)
        raise OSError("loading stopped here by the test")

    monkeypatch.setattr(models, "load", load)
    monkeypatch.chdir(tmp_path)  # where a command writes by default
    code = main([*argv, "--model", "org/name", "--revision", "v1", "--dtype", "bfloat16"])
    assert code != 0 and "loading stopped here by the test" in capsys.readouterr().err
    assert (asked["name"], asked["revision"], asked["dtype"]) == ("org/name", "v1", "bfloat16")
