"""The web app's API: answers, refusals with clear messages, limits, headers, and no
file but its own page."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.cli import main
from attnkit.serve import create_app
from attnkit.viz.viewer import ViewerData, content_security_policy
from tests.fixtures.tiny_decoder import TinyModel

TEXT = "the cat sat on the mat because it was tired"
LOCAL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def loaded() -> list[str]:
    return []


@pytest.fixture(scope="module")
def client(loaded) -> TestClient:
    def loader(name: str) -> TinyModel:
        loaded.append(name)
        return TinyModel(seed=len(loaded))

    app = create_app(
        ["tiny", "tiny2"], loader=loader, max_tokens=64, max_weights=20_000, max_chars=2_000, max_body_bytes=4_096
    )
    return TestClient(app, base_url=LOCAL)


def test_models_load_once_at_creation(client, loaded):
    for _ in range(3):
        assert client.post("/api/attention", json={"text": "a b"}).status_code == 200
    assert loaded == ["tiny", "tiny2"]


def test_info(client):
    info = client.get("/api/info").json()
    assert info["default_model"] == "tiny"
    assert info["models"][0] == {
        "name": "tiny",
        "family": "llama",
        "kind": "causal",
        "layers": 2,
        "decoder_layers": 0,
        "heads": 4,
        "decoder_heads": 0,
        "max_tokens": 64,
        "max_long_tokens": 0,  # a stand-in without long-context maps
        "windows": None,
        "chat_template": False,  # a stand-in without a checkpoint folder
    }
    assert (info["max_chars"], info["max_weights"], info["max_body_bytes"]) == (2_000, 20_000, 4_096)


def test_attention_matches_the_model(client):
    response = client.post("/api/attention", json={"text": TEXT, "layers": [1, 0, 1], "heads": [3, 1]})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    data = ViewerData.from_json(response.text)
    section = data.sections["self"]
    assert data.model_name == "tiny" and data.kind == "causal" and data.text == TEXT
    assert section.query_tokens == tuple(TEXT.split())
    assert section.layers == (0, 1) and section.heads == (1, 3)
    expected = client.app.state.models["tiny"].model.run(TEXT, return_weights=[0, 1], heads=[1, 3]).attentions
    for layer in (0, 1):
        for n, head in enumerate((1, 3)):
            assert (section.map(layer, head) - expected[layer][0, n]).abs().max() < 1e-5
    other = ViewerData.from_json(client.post("/api/attention", json={"text": TEXT, "model": "tiny2"}).text)
    assert other.model_name == "tiny2" and other.sections["self"].layers == (0, 1)
    assert not (other.sections["self"].weights[:, 1] - section.weights[:, 0]).abs().max() < 1e-3


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"text": ""}, 422, "the text is empty"),
        ({"text": " \n\t "}, 422, "the text is empty"),
        ({"text": "a " * 65}, 422, "the text is 65 tokens, more than the limit of 64 for tiny"),
        ({"text": "a" * 2_001}, 422, "2001 characters, more than this server's limit of 2000"),
        (
            {"text": "a " * 60},
            422,
            "2 layers x 4 heads x 60^2 tokens is 28800 weights, more than this server's "
            "limit of 20000: ask for at most 1 layer or fewer heads",
        ),
        ({"text": "a", "model": "gpt-5"}, 422, "unknown model 'gpt-5': this server has 'tiny', 'tiny2'"),
        ({"text": "a", "layers": [2]}, 422, "layer 2 is out of range: tiny has 2 layers, 0..1"),
        ({"text": "a", "layers": [-1]}, 422, "layer -1 is out of range"),
        ({"text": "a", "heads": [4]}, 422, "head 4 is out of range: tiny has 4 heads, 0..3"),
        ({"text": "a", "heads": []}, 422, "heads must not be an empty list"),
        ({"text": "a", "layers": ["0"]}, 422, "invalid request: layers.0: Input should be a valid integer"),
        ({"text": 7}, 422, "invalid request: text: Input should be a valid string"),
        ({}, 422, "invalid request: text: Field required"),
        ({"text": "a", "colour": "red"}, 422, "colour: Extra inputs are not permitted"),
        ({"text": "a", "level": "sentence"}, 422, "invalid request: level: Input should be 'token' or 'word'"),
        ({"text": "a", "level": None}, 422, "invalid request: level: Input should be 'token' or 'word'"),
        ([1, 2], 422, "invalid request"),
    ],
)
def test_bad_requests_get_a_clear_4xx(client, body, status, detail):
    response = client.post("/api/attention", json=body)
    assert response.status_code == status, response.text[:300]
    assert detail in response.json()["detail"]
    # ... and the server stays healthy.
    assert client.post("/api/attention", json={"text": "still fine"}).status_code == 200


def test_malformed_and_oversized_bodies(client):
    bad = client.post("/api/attention", content=b'{"text": "a",', headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["detail"]
    big = json.dumps({"text": "a " * 3_000}).encode()
    declared = client.post("/api/attention", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413
    assert declared.json() == {"detail": "the request body is larger than this server's limit of 4096 bytes"}

    # A body streamed without Content-Length is counted as it arrives.
    def chunks():
        for n in range(0, len(big), 1000):
            yield big[n : n + 1000]

    streamed = client.post("/api/attention", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in streamed.request.headers
    assert streamed.status_code == 413 and "larger than" in streamed.json()["detail"]
    assert client.get("/api/info").status_code == 200


def test_security_headers_and_no_other_files(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-mode="app"' in page.text
    for response in (page, client.get("/api/info"), client.post("/api/attention", json={"text": ""})):
        policy = response.headers["content-security-policy"]
        assert policy == content_security_policy(app=True) + "; frame-ancestors 'none'"
        assert policy.startswith("default-src 'none'") and "connect-src 'self'" in policy
        assert response.headers["x-content-type-options"] == "nosniff"
    for path in [
        "/../pyproject.toml",
        "/static/../../pyproject.toml",
        "/%2e%2e/pyproject.toml",
        "/viewer.js",
        "/static/viewer.js",
        "/docs",
        "/redoc",
        "/etc/passwd",
    ]:
        assert client.get(path).status_code == 404, path
    schema = client.get("/openapi.json").json()
    assert {"/api/attention", "/api/info"} <= set(schema["paths"])
    assert "ViewerDataBody" in schema["components"]["schemas"]


def test_host_check_defeats_dns_rebinding():
    app = create_app(["tiny"], loader=lambda name: TinyModel(), allowed_hosts=["127.0.0.1", "localhost"])
    assert TestClient(app, base_url="http://127.0.0.1:8000").get("/api/info").status_code == 200
    refused = TestClient(app, base_url="http://evil.example").get("/api/info")
    assert refused.status_code == 400 and "content-security-policy" in refused.headers


def test_create_app_checks_its_arguments():
    with pytest.raises(ValueError, match="distinct names"):
        create_app(["a", "a"], loader=lambda name: TinyModel())
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        create_app(["a"], loader=lambda name: TinyModel(), max_tokens=0)


def test_cli_reports_what_it_cannot_serve(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert main(["serve", "--model", str(tmp_path / "no-such-model"), "--port", "0"]) == 2
    assert "attnkit: error:" in capsys.readouterr().err
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be 0..65535" in capsys.readouterr().err
    assert main(["serve", "--model", "minilm", "--model", "minilm"]) == 2
    assert "names a model twice" in capsys.readouterr().err


def test_word_level_on_a_real_model(minilm_path):
    """``"level": "word"`` turns MiniLM's "didn", "'", "t" into one row and column "didn't";
    each word's row is its tokens' rows averaged, summed over each key word's tokens."""
    client = TestClient(create_app(["minilm"]), base_url=LOCAL)
    text = "The animal didn't cross the road."
    body = {"text": text, "layers": [1, 5], "heads": [0, 7]}
    tokens = ViewerData.from_json(client.post("/api/attention", json=body).text).sections["self"]
    assert tokens.query_tokens == ("[CLS]", "The", "animal", "didn", "'", "t", "cross", "the", "road", ".", "[SEP]")
    response = client.post("/api/attention", json={**body, "level": "word"})
    assert response.status_code == 200, response.text[:300]
    words = ViewerData.from_json(response.text).sections["self"]
    assert (
        words.query_tokens
        == words.key_tokens
        == ("[CLS]", "The", "animal", "didn't", "cross", "the", "road", ".", "[SEP]")
    )
    assert words.layers == (1, 5) and words.heads == (0, 7)
    torch.testing.assert_close(words.weights.sum(-1), torch.ones(2, 2, 9), atol=1e-4, rtol=0)
    token_map = tokens.map(5, 7)  # [11, 11]; "didn't" is tokens 3..5, word 3
    assert words.map(5, 7)[3, 2].item() == pytest.approx(token_map[3:6, 2].mean().item(), abs=1e-4)
    assert words.map(5, 7)[2, 3].item() == pytest.approx(token_map[2, 3:6].sum().item(), abs=1e-4)


def test_api_over_real_http(client):
    from attnkit.serve import background

    with background(client.app) as url:
        assert url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/api/info").json()["default_model"] == "tiny"
            response = http.post("/api/attention", json={"text": "over the wire", "layers": [0]})
            assert response.status_code == 200
            assert ViewerData.from_json(response.text).sections["self"].query_tokens == ("over", "the", "wire")


def test_cli_serves_a_real_model(minilm_path):
    """``attnkit serve --model minilm`` as a user starts it: loopback only, host checked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "attnkit", "serve", "--model", "minilm", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                info = httpx.get(f"{url}/api/info", timeout=2).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "attnkit serve did not start in 60 s"
                time.sleep(0.2)
        assert info["models"] == [
            {
                "name": "minilm",
                "family": "bert",
                "kind": "bidirectional",
                "layers": 6,
                "decoder_layers": 0,
                "heads": 12,
                "decoder_heads": 0,
                "max_tokens": 512,
                "max_long_tokens": 512,  # the model's context
                "windows": None,
                "chat_template": False,  # MiniLM is no chat model
            }
        ]
        response = httpx.post(f"{url}/api/attention", json={"text": "it was tired", "layers": [5]}, timeout=30)
        data = ViewerData.from_json(response.text)
        assert data.sections["self"].query_tokens == ("[CLS]", "it", "was", "tired", "[SEP]")
        rebinding = httpx.get(f"{url}/api/info", headers={"host": "attacker.example"}, timeout=5)
        assert rebinding.status_code == 400
    finally:
        server.terminate()
        server.wait(timeout=10)
    output = server.stdout.read()
    # Start-up says what it loads and how long that took, then where to look.
    assert "attnkit: loading minilm on cpu …" in output and "done in" in output
    assert "open http://127.0.0.1:" in output
