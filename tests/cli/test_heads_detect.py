"""`attnkit heads TEXT --detect KIND` on SmolLM2: the printed ranking and grid equal
detect_heads, the JSON and the picture, and option errors before any model loads."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.detectors import detect_heads

# A repeated phrase: induction heads attend to the token after the earlier occurrence.
TEXT = "Alice met Bob at the old mill. Later, Alice met Bob at the old mill."


def run(capsys, *argv):
    code = main(["heads", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_induction_heads_of_smollm2(capsys, tmp_path, smollm2_path):
    code, out, _ = run(capsys, TEXT, "--detect", "induction", "--out", str(tmp_path), "--quiet", "--top", "3")
    assert code == 0
    expected = detect_heads(models.load("smollm2"), TEXT, "induction")
    assert f"smollm2 · induction detector on {TEXT!r}" in out and "layers × heads:" in out
    for layer, head, score in expected.top(3):
        assert any(line.split() == [str(layer), str(head), f"{score:.4f}"] for line in out.splitlines())
    data = json.loads((tmp_path / "smollm2_detect_induction.json").read_text())
    assert data["detector"] == "induction" and data["layers"] == list(range(30))
    assert torch.allclose(torch.tensor(data["scores"]), expected.scores, atol=1e-6)
    assert (tmp_path / "smollm2_detect_induction.png").stat().st_size > 0
    # Some heads of SmolLM2 are induction heads: far above the typical head (the score counts
    # every query, and the first half's have nothing to attend to in the pattern).
    assert expected.top(1)[0][2] > 5 * float(expected.scores.median())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--detect", "induction"], "--detect needs the TEXT to run"),
        (["a b", "--detect", "induction", "--ablate"], "--ablate and --detect are two different analyses"),
        (["a b", "--detect", "induction", "--stat", "entropy"], "--detect takes TEXT alone"),
        (["a b", "--detect", "copying"], "invalid choice: 'copying'"),
    ],
)
def test_bad_options_fail_before_running_a_model(capsys, argv, message):
    try:
        code, out, err = run(capsys, *argv)
    except SystemExit as exit_:  # argparse's own errors
        code, err = exit_.code, capsys.readouterr().err
    assert code == 2 and message in err
