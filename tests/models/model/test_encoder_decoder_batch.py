"""``run_encoder_decoder_batch``: several source/target pairs in one padded pass (a source mask,
targets padded at the end) equal transformers given the same padded batch with its
attention masks, and each equals ``run_encoder_decoder`` of its pair."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit import models
from tests.fixtures.encoder_decoder_checkpoints import write_bart, write_t5

transformers = pytest.importorskip("transformers")

SOURCES = ["the big dog ran to the red house", "a cat sat", "the tree and the river"]
TARGETS = ["a cat sat on the mat", "the dog", "big blue house in the park is red"]


@pytest.fixture(scope="module", params=["t5", "bart"])
def pair(request, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("batch")
    if request.param == "t5":
        folder = write_t5(root / "t5", gated=True, seed=2)
    else:
        folder = write_bart(root / "bart", encoder_attention_heads=2, decoder_attention_heads=8, seed=2)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    return models.load(folder), hf, _pad_id(folder)


def _pad_id(folder: Path) -> int:
    import json

    return int(json.loads((folder / "config.json").read_text())["pad_token_id"])


def test_a_padded_batch_equals_transformers_with_its_masks(pair) -> None:
    model, hf, pad = pair
    runs = model.run_encoder_decoder_batch(SOURCES, TARGETS)
    s_src = max(run.source_ids.shape[1] for run in runs)
    s_tgt = max(run.target_ids.shape[1] for run in runs)
    source = torch.full((len(runs), s_src), pad)  # [b, s_src]
    source_mask = torch.zeros(len(runs), s_src, dtype=torch.long)
    decoder = torch.full((len(runs), s_tgt), pad)  # [b, s_tgt]
    decoder_mask = torch.zeros(len(runs), s_tgt, dtype=torch.long)
    for row, run in enumerate(runs):
        n, m = run.source_ids.shape[1], run.decoder_input_ids.shape[1]
        source[row, :n], source_mask[row, :n] = run.source_ids[0], 1
        decoder[row, :m], decoder_mask[row, :m] = run.decoder_input_ids[0], 1
    with torch.no_grad():
        want = hf(
            input_ids=source,
            attention_mask=source_mask,
            decoder_input_ids=decoder,
            decoder_attention_mask=decoder_mask,
            output_attentions=True,
        )
    assert len({run.source_ids.shape[1] for run in runs}) == 3  # every row padded differently
    for row, run in enumerate(runs):
        n, m = run.source_ids.shape[1], run.target_ids.shape[1]
        torch.testing.assert_close(run.logits[0], want.logits[row, :m], rtol=0, atol=1e-4)
        for layer in run.encoder_attentions:
            got, ref = run.encoder_attentions[layer][0], want.encoder_attentions[layer][row, :, :n, :n]
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        for layer in run.cross_attentions:
            got, ref = run.cross_attentions[layer][0], want.cross_attentions[layer][row, :, :m, :n]
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
            got, ref = run.decoder_attentions[layer][0], want.decoder_attentions[layer][row, :, :m, :m]
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_each_run_of_a_batch_equals_its_own_run(pair) -> None:
    model, _, _ = pair
    runs = model.run_encoder_decoder_batch(SOURCES, [TARGETS[0], None, TARGETS[2]], decoder_layers=[-1], heads=[1])
    for source, target, run in zip(SOURCES, [TARGETS[0], None, TARGETS[2]], runs, strict=True):
        alone = model.run_encoder_decoder(source, target, decoder_layers=[-1], heads=[1])
        assert run.generated == (target is None) and run.target_tokens == alone.target_tokens
        assert run.source_text == alone.source_text and run.target_text == alone.target_text
        assert torch.equal(run.decoder_input_ids, alone.decoder_input_ids)
        assert run.heads == alone.heads
        torch.testing.assert_close(run.cross_attentions[-1], alone.cross_attentions[-1], rtol=0, atol=1e-6)
        torch.testing.assert_close(run.encoder_attentions[0], alone.encoder_attentions[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(run.logits, alone.logits, rtol=0, atol=1e-5)


def test_a_batch_refuses_mismatched_targets(pair) -> None:
    model, _, _ = pair
    with pytest.raises(ValueError, match="one target \\(or None\\) per source: got 1 targets for 3 sources"):
        model.run_encoder_decoder_batch(SOURCES, TARGETS[:1])
    with pytest.raises(ValueError, match="non-empty list"):
        model.run_encoder_decoder_batch("the cat")
