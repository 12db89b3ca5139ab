"""``POST /api/attention`` for an encoder–decoder: a source (``text``) and a target
(``decoder_text``, or the model's own greedy one), answered with the encoder, decoder and
cross-attention the library computes, and refused where it does not apply."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from attnkit import models
from attnkit.serve import create_app
from attnkit.viz.viewer import ViewerData
from tests.fixtures.tiny_decoder import TinyModel
from tests.fixtures.tiny_encoder_decoder import write_encoder_decoder_folder

SOURCE = "3 0 5 1 2"
TARGET = "2 1 5 0 3"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_encoder_decoder_folder(tmp_path_factory.mktemp("served") / "reverse")


@pytest.fixture(scope="module")
def client(folder):
    def loader(name):
        return TinyModel() if name == "tiny" else models.load(name)

    app = create_app([str(folder), "tiny"], loader=loader, max_weights=2000)
    return TestClient(app, base_url="http://127.0.0.1")


def post(client, **body):
    return client.post("/api/attention", json={"model": "reverse", **body})


def test_info_names_the_kind_and_both_depths(client) -> None:
    served = {m["name"]: m for m in client.get("/api/info").json()["models"]}
    assert served["reverse"]["kind"] == "encoder-decoder"
    assert (served["reverse"]["layers"], served["reverse"]["decoder_layers"]) == (2, 2)
    assert (served["tiny"]["kind"], served["tiny"]["decoder_layers"]) == ("causal", 0)


def test_a_given_target_gives_the_three_kinds_of_the_library(client, folder) -> None:
    response = post(client, text=SOURCE, decoder_text=TARGET, layers=[1], heads=[0])
    assert response.status_code == 200, response.text
    data = ViewerData.from_json(response.text)
    assert data.kind == "encoder-decoder" and list(data.sections) == ["encoder", "decoder", "cross"]
    assert (data.text, data.target_text, data.generated) == (SOURCE, TARGET, False)
    cross = data.sections["cross"]
    assert list(cross.query_tokens) == TARGET.split() and list(cross.key_tokens) == SOURCE.split()
    assert data.sections["decoder"].causal and data.sections["decoder"].key_tokens[0] == "<s>"
    run = models.load(folder).run_encoder_decoder(SOURCE, TARGET, heads=[0])
    for kind in ("encoder", "decoder", "cross"):
        expected = run.attentions(kind)[1][0, 0]  # layer 1, head 0: [s_q, s_k]
        torch.testing.assert_close(data.sections[kind].map(1, 0), expected, rtol=0, atol=1e-4)  # stored as uint16


def test_without_a_target_the_model_writes_it_and_says_so(client, folder) -> None:
    for body in ({}, {"decoder_text": "  "}):
        data = ViewerData.from_json(post(client, text=SOURCE, **body).text)
        expected = models.load(folder).run_encoder_decoder(SOURCE, max_new_tokens=64)
        assert data.generated and data.target_text == expected.target_text
        assert data.sections["cross"].query_tokens[-1] == expected.target_tokens[-1]
        assert len(data.sections["cross"].query_tokens) == len(expected.target_tokens)


def test_word_level_on_both_sides(client) -> None:
    data = ViewerData.from_json(post(client, text=SOURCE, decoder_text=TARGET, level="word").text)
    assert data.level == "word" and list(data.sections["cross"].key_tokens) == SOURCE.split()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"text": "3 0 9"}, 422, "has no token for '9'; its vocabulary is '<s>', '</s>', '0', '1'"),
        ({"text": SOURCE, "decoder_text": "9 x 9"}, 422, "has no token for '9', 'x'; its vocabulary is"),
        ({"text": SOURCE, "decoder_text": "\ud800"}, 422, "the decoder text is not valid Unicode"),
        ({"text": SOURCE, "layers": [2]}, 422, "reverse has 2 layers"),
        ({"text": SOURCE, "decoder_text": "0 1 2 3 4 5 " * 5}, 422, "30 target tokens is 4300 weights, more than"),
        ({"text": SOURCE, "decoder_text": TARGET, "model": "tiny"}, 422, "tiny reads one text"),
    ],
)
def test_refusals(client, body, status, message) -> None:
    # As JSON text with escapes: a lone surrogate has no UTF-8 encoding of its own.
    content = json.dumps({"model": "reverse", **body})
    response = client.post("/api/attention", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status and message in response.json()["detail"], response.text
