"""Per-head statistics of an encoder-decoder's three kinds of attention, and the alignment
score of cross-attention heads (the measure of alignment in translation), on a tiny random
T5 and on hand-made maps."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.cli import main
from attnkit.inspect.encoder_decoder import alignment_hits, read_alignments, survey_encoder_decoder


def test_alignment_hits_count_the_aligned_argmax() -> None:
    # Two heads over 4 target and 4 source words: head 0 reverses, head 1 copies.
    reverse = torch.eye(4).flip(-1)
    cross = torch.stack([reverse, torch.eye(4)])[None]  # [1, 2, 4, 4]
    hits, aligned = alignment_hits(cross, 4, 4, "anti-diagonal")
    assert aligned == 4 and hits.tolist() == [[4.0, 0.0]]
    hits, _ = alignment_hits(cross, 4, 4, "diagonal")
    assert hits.tolist() == [[0.0, 4.0]]
    # Links given by hand; a target word may have several aligned source words.
    hits, aligned = alignment_hits(cross, 4, 4, [(3, 0), (0, 0), (1, 1)])
    assert aligned == 2 and hits.tolist() == [[1.0, 2.0]]
    with pytest.raises(ValueError, match="outside the 4 source and 4 target words"):
        alignment_hits(cross, 4, 4, [(4, 0)])


def test_alignment_files_are_read_in_the_pharaoh_format(tmp_path) -> None:
    path = tmp_path / "align.txt"
    path.write_text("0-0 1-2 2-1\n\n")
    assert read_alignments(str(path), 2) == [[(0, 0), (1, 2), (2, 1)], []]
    assert read_alignments("diagonal", 2) == ["diagonal", "diagonal"]
    with pytest.raises(ValueError, match="has 2 lines for 3 source/target pairs"):
        read_alignments(str(path), 3)
    path.write_text("0:1\n")
    with pytest.raises(ValueError, match="line 1: links are source-target word indices"):
        read_alignments(str(path), 1)


def test_survey_of_each_kind(tiny_t5) -> None:
    pairs = [("the big dog ran", "a cat sat"), ("the red house", None)]
    cross = survey_encoder_decoder(tiny_t5, pairs, alignments=["diagonal", "anti-diagonal"], max_new_tokens=3)
    assert cross.attention == "cross" and cross.num_layers == 3
    assert list(cross.statistics) == ["entropy", "first", "last", "alignment"]
    assert all(v.shape == (3, 4) for v in cross.statistics.values())
    assert 0 <= float(cross.statistics["alignment"].min()) <= float(cross.statistics["alignment"].max()) <= 1
    # By hand for the first pair: the mass on the first source token of the last layer.
    run = tiny_t5.run_encoder_decoder(*pairs[0])
    first = run.cross_attentions[2][0, :, :, 0].mean(-1)
    second = tiny_t5.run_encoder_decoder("the red house", max_new_tokens=3).cross_attentions[2][0, :, :, 0].mean(-1)
    torch.testing.assert_close(cross.statistics["first"][2], (first + second) / 2)
    encoder = survey_encoder_decoder(tiny_t5, pairs[:1], attention="encoder")
    assert encoder.num_layers == 2 and "previous" in encoder.statistics
    with pytest.raises(ValueError, match="alignments go with cross-attention"):
        survey_encoder_decoder(tiny_t5, pairs[:1], attention="decoder", alignments=["diagonal"])


def test_heads_command_takes_pairs_and_an_alignment(capsys, tmp_path, tiny_t5_path) -> None:
    texts, align = tmp_path / "pairs.txt", tmp_path / "align.txt"
    texts.write_text("the big dog ran\ta cat sat\nthe red house\tred blue house\n")
    align.write_text("0-0 1-1 2-2\n1-0 2-2\n")
    code = main(["heads", "--file", str(texts), "--model", str(tiny_t5_path), "--align", str(align),
                 "--out", str(tmp_path), "--format", "json", "--quiet"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "cross-attention (target → source) · 3 layers × 4 heads · 2 source/target pairs" in out
    assert "alignment: aligned target words whose most-attended source word is aligned, layers × heads" in out
    data = json.loads((tmp_path / "tiny-t5_heads.json").read_text())
    assert data["attention"] == "cross" and len(data["statistics"]["alignment"]["values"]) == 3
    code = main(["heads", "a b", "--model", str(tiny_t5_path), "--attention", "encoder", "--align", "diagonal",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code != 0 and "--align scores cross-attention heads" in capsys.readouterr().err
