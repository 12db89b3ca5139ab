"""`attnkit serve`'s long-context routes on a tiny random Gemma 3: the reduced map and the
zoomed block equal the model's own dense weights, and bad requests are refused."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from attnkit import models  # noqa: E402
from attnkit.serve import create_app, long_context  # noqa: E402
from attnkit.serve.long_context import MAX_BLOCK_WEIGHTS  # noqa: E402

TEXT = " ".join(f"w{(i * 11) % 50 + 1}" for i in range(40))
LONG = " ".join(f"w{i % 50 + 1}" for i in range(70))  # past the tiny model's context of 64 tokens
SURROGATE = "the text is not valid Unicode: a lone surrogate at character 0"
LOCAL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def served(tiny_family_folder):
    folder = tiny_family_folder("gemma3_text")
    client = TestClient(create_app([str(folder)]), base_url=LOCAL)
    model = models.load(folder)
    name = model.hook_name("self_attn.pattern", 1)
    dense = model.run(TEXT, return_weights=False, logits=False, names_filter=[name]).cache[name][0]  # [h, s, s]
    return client, folder.name, dense


def test_map_and_zoomed_block_equal_the_dense_weights(served):
    client, name, dense = served
    got = client.post("/api/long/map", json={"text": TEXT, "model": name, "layer": 1, "head": 2, "block": 8})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["block"] == 8 and len(body["tokens"]) == 40
    cells = dense[2].reshape(5, 8, 5, 8)
    torch.testing.assert_close(torch.tensor(body["max"]), cells.amax(dim=(1, 3)), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(body["mean"]), cells.mean(dim=(1, 3)), rtol=1e-5, atol=1e-6)
    assert body["top_keys"] == dense[2].argmax(-1).tolist()
    zoom = client.post(
        "/api/long/block", json={"text": TEXT, "model": name, "layer": 1, "head": 2, "rows": [30, 38], "keys": [3, 20]}
    )
    assert zoom.status_code == 200, zoom.text
    torch.testing.assert_close(torch.tensor(zoom.json()["weights"]), dense[2, 30:38, 3:20], rtol=1e-5, atol=1e-6)
    # A zoom into a text not mapped before runs the model itself.
    other = client.post(
        "/api/long/block", json={"text": TEXT, "model": name, "layer": 1, "head": 0, "rows": [0, 40], "keys": [0, 40]}
    )
    torch.testing.assert_close(torch.tensor(other.json()["weights"]), dense[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("/api/long/map", {"text": " ", "layer": 0, "head": 0}, "the text is empty"),
        ("/api/long/map", {"text": TEXT, "layer": 9, "head": 0}, "layer must be in 0..2"),
        ("/api/long/map", {"text": TEXT, "layer": 0, "head": 0, "block": 0}, "block must be at least"),
        ("/api/long/block", {"text": TEXT, "layer": 0, "head": 0, "rows": [5, 2], "keys": [0, 1]}, "rows must be"),
        ("/api/long/block", {"text": TEXT, "layer": 0, "head": 4, "rows": [0, 2], "keys": [0, 1]}, "head must be"),
        # A block wider than the text would be one cell: refused, whatever its size.
        ("/api/long/map", {"text": "w1 w2", "layer": 0, "head": 0, "block": 12000}, "block must be at most the text's"),
        ("/api/long/map", {"text": TEXT, "layer": 0, "head": 0, "block": 10**23}, "block must be at most the text's"),
        ("/api/long/map", {"text": TEXT, "layer": 0, "head": 0, "block": 2**62}, "block must be at most the text's"),
        ("/api/long/map", {"text": TEXT, "layer": 0, "head": 0, "window": 10**23}, "window must be in 1..256"),
        ("/api/long/map", {"text": TEXT, "layer": 0, "head": 0, "window": 2**62}, "window must be in 1..256"),
        ("/api/long/map", {"text": TEXT, "layer": 10**23, "head": 0}, "layer must be in 0..2"),
        # Past the model's context (64 tokens): the model's own message.
        ("/api/long/block", {"text": LONG, "layer": 0, "head": 0, "rows": [0, 1], "keys": [0, 1]}, "tokens"),
        ("/api/long/map", {"text": LONG, "layer": 0, "head": 0}, "tokens"),
        ("/api/long/block", {"text": "\ud800 cat", "layer": 0, "head": 0, "rows": [0, 1], "keys": [0, 1]}, SURROGATE),
        ("/api/long/map", {"text": "a \ud800", "layer": 0, "head": 0}, "the text is not valid Unicode"),
    ],
)
def test_bad_requests_are_refused(served, route, body, message):
    client, _, _ = served
    # json.dumps writes a lone surrogate as the escape "\ud800", as a browser would send it.
    got = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
    assert got.status_code == 422 and message in got.json()["detail"], got.text


def test_long_routes_have_their_own_token_limit(tiny_family_folder):
    folder = tiny_family_folder("gemma3_text")
    client = TestClient(create_app([str(folder)], max_tokens=8), base_url=LOCAL)
    assert client.get("/api/info").json()["models"][0]["max_long_tokens"] == 64  # the model's context
    # --max-tokens (8) limits /api/attention, not the long routes.
    assert client.post("/api/long/map", json={"text": TEXT, "layer": 0, "head": 0}).status_code == 200
    limited = TestClient(create_app([str(folder)], max_long_tokens=30), base_url=LOCAL)
    assert limited.get("/api/info").json()["models"][0]["max_long_tokens"] == 30
    for route, extra in (("/api/long/map", {}), ("/api/long/block", {"rows": [0, 1], "keys": [0, 1]})):
        got = limited.post(route, json={"text": TEXT, "layer": 0, "head": 0, **extra})
        assert got.status_code == 422
        assert (
            got.json()["detail"] == f"the text is 40 tokens, more than the long-context limit of 30 for {folder.name}"
        )
    assert limited.post("/api/long/map", json={"text": "w1 w2 w3", "layer": 0, "head": 0}).status_code == 200
    with pytest.raises(ValueError, match="max_long_tokens must be at least 1, got 0"):
        create_app([str(folder)], max_long_tokens=0)


def test_map_lists_top_k_keys_and_names_the_zoom_limit(served):
    client, name, dense = served
    got = client.post(
        "/api/long/map", json={"text": TEXT, "model": name, "layer": 1, "head": 3, "block": 4, "top_k": 5}
    ).json()
    top = dense[3].topk(5, dim=-1)
    keys = torch.tensor(got["top_k_keys"])  # [s, 5]; -1 where a query has fewer keys
    shown = keys >= 0
    assert torch.equal(keys[shown], top.indices[shown]) and not shown[4:].logical_not().any()
    torch.testing.assert_close(
        torch.tensor(got["top_k_weights"])[shown], top.values[shown].float(), rtol=1e-5, atol=1e-6
    )
    assert got["max_block_weights"] == MAX_BLOCK_WEIGHTS and "sliding_window" in got


def test_a_zoom_over_the_limit_is_refused_in_one_line_naming_it(served, monkeypatch):
    client, name, _ = served
    monkeypatch.setattr(long_context, "MAX_BLOCK_WEIGHTS", 100)
    body = {"text": TEXT, "model": name, "layer": 1, "head": 0, "rows": [0, 11], "keys": [0, 10]}
    got = client.post("/api/long/block", json=body)
    assert got.status_code == 422
    detail = got.json()["detail"]
    assert detail == (
        "the block is 11 rows × 10 keys = 110 weights, more than this server's limit of 100 per zoom: "
        "ask for fewer rows or keys"
    )
    assert client.post("/api/long/block", json={**body, "rows": [0, 10]}).status_code == 200
    bad = client.post("/api/long/map", json={"text": TEXT, "model": name, "layer": 1, "head": 0, "top_k": 0})
    assert bad.status_code == 422 and "top_k must be in 1..32" in bad.json()["detail"]


def test_map_and_zoom_label_tokens_as_they_read_and_by_words(byte_level_gemma3):
    client = TestClient(create_app([str(byte_level_gemma3)]), base_url=LOCAL)
    text = "the cat sat on the mat and the dog ran"
    request = {"text": text, "model": byte_level_gemma3.name, "layer": 1, "head": 0}
    body = client.post("/api/long/map", json=request).json()
    assert body["tokens"] == text.split() and body["level"] == "token"
    zoom = client.post("/api/long/block", json={**request, "rows": [1, 3], "keys": [0, 2]}).json()
    assert zoom["query_tokens"] == ["cat", "sat"] and zoom["key_tokens"] == ["the", "cat"]
    assert client.post("/api/long/map", json={**request, "level": "word"}).json()["tokens"] == text.split()
    assert client.post("/api/long/map", json={**request, "level": "sentence"}).status_code == 422


def test_colour_modes_come_as_the_exported_page_has_them(served, tiny_family_folder):
    from attnkit.viz.viewer import ViewerData
    from attnkit.viz.viewer.adapters import mode_sections

    client, name, _ = served
    text = TEXT[:60]
    body = {"text": text, "model": name, "layers": [1, 2], "heads": [0, 3], "modes": ["value", "rollout"]}
    got = client.post("/api/attention", json=body)
    assert got.status_code == 200, got.text
    data = ViewerData.from_json(got.text)
    assert list(data.sections) == ["self", "value", "rollout"]
    model = models.load(tiny_family_folder("gemma3_text"))
    want = mode_sections(model, text, ["value", "rollout"], layers=[1, 2], heads=[0, 3])
    for mode in ("value", "rollout"):
        assert data.sections[mode].layers == want[mode].layers and data.sections[mode].heads == want[mode].heads
        torch.testing.assert_close(data.sections[mode].weights, want[mode].weights, atol=2e-5, rtol=0)
    refused = client.post("/api/attention", json={**body, "modes": ["flow"]})
    assert refused.status_code == 422


def test_models_the_summaries_cannot_read_have_no_long_maps(tiny_t5_path):
    """A model of one's own with a ``prepare_input`` is still no :class:`attnkit.models.Model`
    (the summaries hook its modules): no long-context limit, and the routes say why, as
    they do for an encoder-decoder."""
    from tests.fixtures.tiny_decoder import TinyModel

    class WithPrepareInput(TinyModel):
        def prepare_input(self, text: str) -> tuple:
            tokenized = self.tokenize(text)
            return tokenized.ids, tokenized.tokens, None

    client = TestClient(create_app(["own"], loader=lambda name: WithPrepareInput()), base_url=LOCAL)
    assert client.get("/api/info").json()["models"][0]["max_long_tokens"] == 0
    got = client.post("/api/long/map", json={"text": TEXT, "layer": 0, "head": 0})
    assert got.status_code == 422
    assert "own has no long-context maps: model must be an attnkit.models.Model, got WithPrepareInput" in got.text
    t5 = TestClient(create_app([str(tiny_t5_path)]), base_url=LOCAL)
    assert t5.get("/api/info").json()["models"][0]["max_long_tokens"] == 0
    got = t5.post("/api/long/map", json={"text": TEXT, "layer": 0, "head": 0})
    assert got.status_code == 422 and "has no long-context maps: tiny-t5 is an encoder-decoder (t5)" in got.text
