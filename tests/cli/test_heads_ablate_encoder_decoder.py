"""`attnkit heads SOURCE --ablate --decoder-text TARGET` and `attnkit patch --clean SOURCE
--corrupt SOURCE --target TARGET` on a tiny random T5: every head of the encoder, decoder
self- and cross-attention, as the library ablates and patches them."""

from __future__ import annotations

import json

import pytest

from attnkit.cli import main
from attnkit.inspect import interventions

# Slow (a tiny T5 and BART written and loaded for the module: about 6 s): outside make test-fast.
pytestmark = pytest.mark.slow

SOURCE, TARGET = "the big dog ran", "a cat sat"


@pytest.mark.slow
def test_an_encoder_decoders_heads_are_ablated_on_the_target(tiny_t5, tiny_t5_path, tmp_path, capsys):
    argv = ["heads", SOURCE, "--ablate", "--decoder-text", TARGET, "--model", str(tiny_t5_path)]
    assert main([*argv, "--out", str(tmp_path), "--quiet", "--format", "json,png"]) == 0
    printed = capsys.readouterr().out
    assert "decoder 0 cross" in printed and "change in log p(target) of the decoder" in printed
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    expected = interventions.head_ablation(tiny_t5, SOURCE, target=TARGET)
    assert data["rows"] == expected.row_labels and data["rows"][0] == "encoder 0"
    assert data["effects"] == [[round(v, 6) for v in row] for row in expected.effects.tolist()]
    assert next(tmp_path.glob("*.png")).stat().st_size > 0


def test_an_encoder_decoder_needs_the_decoder_text(tiny_t5_path, tmp_path, capsys):
    argv = ["heads", SOURCE, "--ablate", "--model", str(tiny_t5_path), "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 2
    assert "is an encoder-decoder: --ablate measures log p of the --decoder-text TARGET" in capsys.readouterr().err


def test_attnkit_patch_patches_an_encoder_decoders_heads(tiny_t5, tiny_t5_path, tmp_path, capsys):
    clean, corrupt = "the big dog ran to the red house", "the big cat ran to the red house"
    argv = ["patch", "--clean", clean, "--corrupt", corrupt, "--target", TARGET, "--model", str(tiny_t5_path)]
    assert main([*argv, "--out", str(tmp_path), "--quiet", "--format", "json"]) == 0
    assert "decoder 1 cross" in capsys.readouterr().out
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    expected = interventions.activation_patching(tiny_t5, clean, corrupt, target=TARGET)
    assert data["rows"] == expected.row_labels and data["target"] == TARGET
    assert data["effects"] == [[round(v, 6) for v in row] for row in expected.effects.tolist()]
