"""`attnkit inspect` on an encoder-decoder (a tiny random T5): the three kinds of attention
with source tokens as columns and target tokens as rows, in every format, and a target
generated when none is given."""

from __future__ import annotations

import json
import re

import pytest
import torch

from attnkit.cli import main
from attnkit.viz.viewer import ViewerData

SOURCE = "the big dog ran to the red house"
TARGET = "a cat sat on the mat"


def run(capsys, *argv):
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cross_attention_has_target_rows_and_source_columns(capsys, tmp_path, tiny_t5_path, tiny_t5):
    code, out, err = run(
        capsys, SOURCE, "--model", str(tiny_t5_path), "--decoder-text", TARGET, "--out", str(tmp_path),
        "--format", "json,png,svg,html", "--heads", "0,2", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert "cross-attention (target → source) · 9 source × 7 target tokens" in out
    assert "source: the | big | dog | ran | to | the | red | house | </s>" in out
    assert "target: a | cat | sat | on | the | mat | </s>" in out
    assert "generated" not in out
    data = json.loads((tmp_path / "tiny-t5_cross_layer2_heads0_2.json").read_text())
    assert data["attention"] == "cross" and data["heads"] == [0, 2]
    assert data["labels"] == ["a", "cat", "sat", "on", "the", "mat", "</s>"]
    assert data["key_labels"][:3] == ["the", "big", "dog"] and data["key_text"] == SOURCE
    run_ = tiny_t5.run_encoder_decoder(SOURCE, TARGET, decoder_layers=[2], encoder_layers=False)
    want = run_.cross_attentions[2][0, [0, 2]]  # [2, 7, 9]
    torch.testing.assert_close(torch.tensor(data["weights"]), want, rtol=0, atol=1e-6)  # 6 decimals
    for fmt in ("png", "svg"):
        assert (tmp_path / f"tiny-t5_cross_layer2_heads0_2.{fmt}").stat().st_size > 1000
    html = (tmp_path / "tiny-t5_viewer.html").read_text()
    page = ViewerData.from_json(
        re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', html, re.S).group(1)
    )
    assert page.kind == "encoder-decoder" and list(page.sections) == ["encoder", "decoder", "cross"]
    assert page.sections["cross"].query_tokens[0] == "a" and page.sections["cross"].key_tokens[1] == "big"
    assert page.sections["decoder"].key_tokens[:2] == ("<pad>", "a") and page.sections["decoder"].causal
    assert page.sections["encoder"].layers == (0, 1) and page.sections["cross"].layers == (0, 1, 2)


def test_without_a_target_it_is_generated_and_said(capsys, tmp_path, tiny_t5_path):
    code, out, err = run(
        capsys, SOURCE, "--model", str(tiny_t5_path), "--max-new-tokens", "3", "--attention", "decoder",
        "--format", "json", "--out", str(tmp_path), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("no --decoder-text: tiny-t5 generated the target greedily (3 tokens)")
    data = json.loads((tmp_path / "tiny-t5_decoder_layer2_head0.json").read_text())
    assert len(data["labels"]) == 3 and data["key_tokens"][0] == "<pad>"


def test_words_on_both_sides_and_value_weighted_cross(capsys, tmp_path, tiny_t5_path):
    code, out, err = run(
        capsys, "the big-dog ran", "--model", str(tiny_t5_path), "--decoder-text", "a cat sat", "--level",
        "word", "--method", "value", "--format", "json", "--out", str(tmp_path), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads((tmp_path / "tiny-t5_cross_layer2_head0_value_words.json").read_text())
    assert data["method"] == "value" and data["level"] == "word"
    assert [w["text"] for w in data["key_words"]] == ["the", "big-dog", "ran", "</s>"]


def test_encoder_decoder_options_are_refused_elsewhere(capsys, tmp_path, tiny_t5_path, minilm_path):
    code, _, err = run(capsys, "a cat", "--model", str(minilm_path), "--decoder-text", "x", "--out", str(tmp_path))
    assert code != 0 and "--decoder-text and --attention are for encoder-decoder models" in err
    code, _, err = run(
        capsys, "a cat", "--model", str(tiny_t5_path), "--attention", "encoder", "--method", "value",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code != 0 and "value-weighted cross-attention" in err


@pytest.mark.slow
@pytest.mark.parametrize("asked", ["100", "1000000000"])
def test_a_target_past_the_positions_stops_there_with_a_note(capsys, tmp_path, asked):
    from tests.fixtures.encoder_decoder_checkpoints import write_bart

    # No end token: the greedy target runs until the 64 learned positions are used up.
    folder = write_bart(tmp_path / "endless", eos_token_id=None)
    argv = ["inspect", "the cat sat", "--model", str(folder), "--format", "png", "--out", str(tmp_path / "out")]
    assert main([*argv, "--max-new-tokens", asked, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert (
        f"note: --max-new-tokens {asked} is more than endless has positions for: the target stops at 64 tokens" in out
    )
    assert "generated the target greedily (64 tokens)" in out
