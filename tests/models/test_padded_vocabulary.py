"""A T5 whose embedding has more rows than its tokenizer has ids (real T5: 32,128 rows,
32,100 ids): ids the tokenizer lacks show as ``<id N>``, are left out of decoded text,
and neither the library, ``attnkit inspect`` nor ``serve`` fails on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit import models
from attnkit.cli import main
from tests.fixtures.encoder_decoder_checkpoints import VOCAB_SIZE, write_t5

SOURCE = "the big dog ran to the red house"
TOKENIZER_SIZE = 30  # of the embedding's VOCAB_SIZE rows


BEYOND = 37  # an embedding row the tokenizer has no id for


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The padded T5, its row :data:`BEYOND` set along the decoder's first output so that
    greedy decoding produces that id first (the head is tied to the embedding)."""
    folder = write_t5(tmp_path_factory.mktemp("padded") / "padded-t5", tokenizer_size=TOKENIZER_SIZE)
    module = models.load(folder).module
    with torch.no_grad():
        memory = module.encode(models.load(folder).tokenize(SOURCE).ids)
        first = module.decode(torch.tensor([[module.decoder_start_token_id]]), memory)[0, -1]  # [e]
    tensors = load_file(folder / "model.safetensors")
    tensors["shared.weight"][BEYOND] = 100 * first / first.norm()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def model(folder: Path) -> models.Model:
    return models.load(folder)


def test_the_tokenizer_has_fewer_ids_than_the_embedding_has_rows(model) -> None:
    assert model.tokenizer.vocab_size == TOKENIZER_SIZE < model.config.vocab_size == VOCAB_SIZE


def test_a_generated_id_the_tokenizer_lacks_shows_as_a_placeholder(model) -> None:
    run = model.run_encoder_decoder(SOURCE, max_new_tokens=8)
    ids = run.target_ids[0].tolist()
    assert ids[0] == BEYOND and run.target_tokens[0] == f"<id {BEYOND}>"
    for token_id, token in zip(ids, run.target_tokens, strict=True):
        assert token == (f"<id {token_id}>" if token_id >= TOKENIZER_SIZE else model.tokenizer.id_to_token(token_id))
    # The decoded text leaves them out, as transformers' decode does.
    assert "<id" not in run.target_text
    assert run.target_text == model.tokenizer.decode([i for i in ids if i < TOKENIZER_SIZE], skip_special_tokens=True)
    # Given as ids, such a target runs too.
    again = model.run_encoder_decoder(SOURCE, run.target_ids[0])
    assert again.target_tokens == run.target_tokens
    assert again.decoder_input_tokens[1] == f"<id {BEYOND}>"


def test_a_negative_id_is_still_refused(model) -> None:
    with pytest.raises(ValueError, match="token ids must be >= 0, got -1"):
        model.tokenizer.id_to_token(-1)


def test_inspect_shows_the_placeholder(capsys, tmp_path: Path, folder: Path) -> None:
    code = main(
        ["inspect", SOURCE, "--model", str(folder), "--out", str(tmp_path), "--format", "png,html,json", "--quiet"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "<id " in out
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".html", ".json", ".png"]


def test_serve_answers_with_the_placeholder(folder: Path) -> None:
    from fastapi.testclient import TestClient

    from attnkit.serve import create_app

    client = TestClient(create_app([str(folder)], loader=models.load), base_url="http://127.0.0.1")
    response = client.post("/api/attention", json={"model": "padded-t5", "text": SOURCE})
    assert response.status_code == 200, response.text
    assert "<id " in response.text
