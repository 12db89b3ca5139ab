"""The server under abuse: foreign Host names, text that is not Unicode, failures, clients
that hang up, floods past the queue, and concurrent requests served in batches."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.cli.serve import allowed_hosts
from attnkit.serve import background, create_app
from attnkit.viz.viewer import ViewerData, content_security_policy
from tests.fixtures.tiny_decoder import TinyModel

SECURITY = {
    "content-security-policy": content_security_policy(app=True) + "; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
}


def _secured(response: httpx.Response) -> bool:
    return all(response.headers.get(k) == v for k, v in SECURITY.items())


class GatedModel(TinyModel):
    """A TinyModel whose runs wait until the test opens the gate, and that records what
    ran: each call's texts."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls: list[list[str]] = []

    def _wait(self, texts: list[str]) -> None:
        self.calls.append(texts)
        self.started.set()
        assert self.gate.wait(30), "the test never opened the gate"

    def run(self, text, **kwargs):
        self._wait([text])
        return super().run(text, **kwargs)

    def run_batch(self, texts, **kwargs):
        self._wait(list(texts))
        return super().run_batch(texts, **kwargs)


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _post_in_thread(url: str, text: str, results: dict[str, httpx.Response]) -> threading.Thread:
    def post() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            results[text] = http.post("/api/attention", json={"text": text})

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def _send_and_leave_open(url: str, route: str, body: dict) -> socket.socket:
    """A socket that has sent a POST of ``body`` to ``route`` and not read the answer: close
    it to hang up."""
    address = urlsplit(url)
    data = json.dumps(body).encode()
    s = socket.create_connection((address.hostname, address.port))
    s.sendall(
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (route.encode(), len(data), data)
    )
    return s


# ---------------------------------------------------------------- Host check


@pytest.mark.parametrize(
    ("host", "extra", "accepted", "refused"),
    [
        ("127.0.0.1", [], ["127.0.0.1:8000", "localhost:8000", "[::1]:8000"], ["evil.example", "evil.example:8000"]),
        ("0.0.0.0", [], ["127.0.0.1:8000", "LOCALHOST"], ["evil.example", "0.0.0.0:8000"]),
        ("0.0.0.0", ["box.lan", "192.168.1.5"], ["box.lan:8000", "192.168.1.5:8000"], ["evil.example"]),
        ("::1", [], ["[::1]:8000", "[::1]"], ["[::2]:8000", "evil.example"]),
        ("::", ["[fe80::1]"], ["[fe80::1]:8000", "[::1]:8000"], ["[::]:8000"]),
        # "" and "0" bind every address too: they are wildcards, not names to answer to.
        ("", [], ["127.0.0.1:8000"], ["", ":8000", "evil.example"]),
        ("0", [], ["localhost:8000"], ["0", "0:8000", "evil.example"]),
        # Only a port may follow the name.
        ("::1", [], ["[::1]:8000"], ["[::1]evil", "[::1]:evil", "[::1]:8000x", "localhost:evil", "localhost:"]),
    ],
)
def test_the_host_is_always_checked(host, extra, accepted, refused):
    app = create_app(["tiny"], loader=lambda name: TinyModel(), allowed_hosts=allowed_hosts(host, extra))
    client = TestClient(app)
    for name in accepted:
        assert client.get("/api/info", headers={"host": name}).status_code == 200, name
    for name in refused:
        response = client.get("/api/info", headers={"host": name})
        assert response.status_code == 400 and "does not answer to the host name" in response.json()["detail"]
        assert _secured(response), name


def test_create_app_answers_only_loopback_names_by_default():
    client = TestClient(create_app(["tiny"], loader=lambda name: TinyModel()))
    assert client.get("/api/info", headers={"host": "localhost:1234"}).status_code == 200
    assert client.get("/api/info", headers={"host": "testserver"}).status_code == 400


# ---------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(["tiny"], loader=lambda name: TinyModel()), base_url="http://127.0.0.1:8000")


def test_text_that_is_not_unicode_is_a_422_with_the_security_headers(client):
    body = b'{"text": "a \\ud800 b"}'
    response = client.post("/api/attention", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and _secured(response)
    assert response.json()["detail"] == "the text is not valid Unicode: a lone surrogate at character 2"


def test_a_failure_inside_is_a_json_500_with_the_security_headers():
    class Broken(TinyModel):
        def run(self, text, **kwargs):
            raise RuntimeError("boom")

        def run_batch(self, texts, **kwargs):
            raise RuntimeError("boom")

    client = TestClient(create_app(["tiny"], loader=lambda name: Broken()), base_url="http://127.0.0.1")
    response = client.post("/api/attention", json={"text": "a b"})
    assert response.status_code == 500 and _secured(response)
    assert response.json() == {"detail": "the server failed on this request (an internal error, logged on the server)"}
    assert client.get("/api/info").status_code == 200


def test_info_does_not_reveal_local_paths(tmp_path):
    folder = tmp_path / "secret-place" / "my-model"
    app = create_app([str(folder)], loader=lambda spec: TinyModel())
    client = TestClient(app, base_url="http://127.0.0.1")
    info = client.get("/api/info").text
    assert "secret-place" not in info and json.loads(info)["default_model"] == "my-model"
    data = client.post("/api/attention", json={"text": "a b", "model": "my-model"})
    assert data.status_code == 200 and "secret-place" not in data.text
    with pytest.raises(ValueError, match="distinct names"):
        create_app([str(tmp_path / "a" / "m"), str(tmp_path / "b" / "m")], loader=lambda spec: TinyModel())


# ---------------------------------------------------------------- load


def test_abandoned_requests_never_run():
    model = GatedModel()
    app = create_app(["tiny"], loader=lambda name: model)
    batcher = app.state.models["tiny"].batcher
    results: dict[str, httpx.Response] = {}
    with background(app) as url:
        first = _post_in_thread(url, "keeps the model busy", results)
        _until(model.started.is_set, "the first run")
        sockets = [_send_and_leave_open(url, "/api/attention", {"text": f"gone {n}"}) for n in range(5)]
        _until(lambda: batcher.waiting() == 5, "five waiting requests")
        for s in sockets:
            s.close()
        _until(lambda: batcher.waiting() == 0, "the hung-up requests to be dropped")
        model.gate.set()
        first.join()
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.post("/api/attention", json={"text": "after"}).status_code == 200
    assert results["keeps the model busy"].status_code == 200
    assert model.calls == [["keeps the model busy"], ["after"]]


def test_a_full_queue_answers_429_with_retry_after():
    model = GatedModel()
    app = create_app(["tiny"], loader=lambda name: model, max_queue=2)
    batcher = app.state.models["tiny"].batcher
    results: dict[str, httpx.Response] = {}
    with background(app) as url:
        threads = [_post_in_thread(url, "first", results)]
        _until(model.started.is_set, "the first run")
        threads += [_post_in_thread(url, f"queued {n}", results) for n in range(2)]
        _until(lambda: batcher.waiting() == 2, "two waiting requests")
        with httpx.Client(base_url=url, timeout=30) as http:
            refused = http.post("/api/attention", json={"text": "one too many"})
        model.gate.set()
        for thread in threads:
            thread.join()
    assert refused.status_code == 429 and _secured(refused)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["detail"].startswith("the server is busy: 2 requests are waiting for this model")
    assert {text: r.status_code for text, r in results.items()} == {"first": 200, "queued 0": 200, "queued 1": 200}


def test_concurrent_requests_share_one_forward_pass():
    model = GatedModel()
    app = create_app(["tiny"], loader=lambda name: model)
    batcher = app.state.models["tiny"].batcher
    texts = ["the cat sat", "on the mat", "a much longer text than the others here"]
    results: dict[str, httpx.Response] = {}
    with background(app) as url:
        threads = [_post_in_thread(url, "first", results)]
        _until(model.started.is_set, "the first run")
        threads += [_post_in_thread(url, text, results) for text in texts]
        _until(lambda: batcher.waiting() == 3, "three waiting requests")
        model.gate.set()
        for thread in threads:
            thread.join()
    assert batcher.batches == [1, 3] and sorted(model.calls[1]) == sorted(texts)
    for text in texts:
        section = ViewerData.from_json(results[text].text).sections["self"]
        alone = TinyModel.run(model, text).attentions
        for layer in (0, 1):
            torch.testing.assert_close(section.weights[layer], alone[layer][0], atol=2e-5, rtol=0)


def test_cli_checks_allow_host_and_max_queue(capsys):
    from attnkit.cli import main

    assert main(["serve", "--allow-host", "box.lan:8000", "--model", "minilm"]) == 2
    assert "--allow-host takes a host name or address without port or wildcard" in capsys.readouterr().err
    assert main(["serve", "--allow-host", "*", "--model", "minilm"]) == 2
    assert "without port or wildcard, got '*'" in capsys.readouterr().err
    assert main(["serve", "--max-queue", "0", "--model", "minilm"]) == 2
    assert "--max-queue must be at least 1, got 0" in capsys.readouterr().err
    assert main(["serve", "--max-long-tokens", "0", "--model", "minilm"]) == 2
    assert "--max-long-tokens must be at least 1, got 0" in capsys.readouterr().err


def test_wildcard_and_loopback_addresses_in_their_short_forms():
    from attnkit.cli.serve import is_loopback, is_wildcard

    assert all(is_wildcard(h) for h in ("", "0", "0.0.0.0", "::", "[::]", "0.0"))
    assert not any(is_wildcard(h) for h in ("127.0.0.1", "localhost", "box.lan", "192.168.1.5"))
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("", "0", "0.0.0.0", "box.lan"))
    assert allowed_hosts("", []) == allowed_hosts("0", []) == allowed_hosts("0.0.0.0", [])


# ---------------------------------------------------------------- long-context routes under load


class Gate:
    """A permanent hook on every layer of a real model (the long routes need one): it records
    each layer each pass reaches, as ``(tokens, layer)``, and holds the passes at their
    first layer until the test opens it."""

    def __init__(self, model) -> None:
        self.open = threading.Event()
        self.started = threading.Event()
        self.reached: list[tuple[int, int]] = []
        for layer in range(model.num_layers):
            model.module.add_hook(model.hook_name("resid_pre", layer), self._hook(layer))

    def _hook(self, layer: int) -> Callable[[torch.Tensor], None]:
        def hook(resid: torch.Tensor) -> None:  # [1, s, e]
            self.reached.append((resid.shape[1], layer))
            self.started.set()
            assert self.open.wait(30), "the test never opened the gate"

        return hook


@pytest.fixture(scope="module")
def long_folder(tmp_path_factory):
    from tests.fixtures.tiny_families import write_tiny_family

    folder = tmp_path_factory.mktemp("long") / "gemma3"
    write_tiny_family("gemma3_text", folder)
    return folder


@pytest.fixture()
def gated_long_app(long_folder):
    """``(app, gate, long queue)``: a tiny Gemma 3 (3 layers, 64 tokens of context), gated, with
    at most 2 waiting requests per queue."""
    from attnkit import models

    model = models.load(long_folder)
    gate = Gate(model)
    app = create_app([str(long_folder)], loader=lambda spec: model, max_queue=2)
    return app, gate, app.state.models["gemma3"].long_queue


def _words(n: int) -> str:
    return " ".join(f"w{i + 1}" for i in range(n))


def _map_in_thread(url: str, words: int, results: dict[int, httpx.Response]) -> threading.Thread:
    def post() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            results[words] = http.post("/api/long/map", json={"text": _words(words), "layer": 2, "head": 0})

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def _with_thread_probe(app):
    """``app`` with a route that says how many of the server's worker threads are taken."""
    import anyio.to_thread
    from fastapi.responses import JSONResponse

    async def probed(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/probe/worker-threads":
            taken = anyio.to_thread.current_default_thread_limiter().borrowed_tokens
            await JSONResponse({"taken": taken})(scope, receive, send)
        else:
            await app(scope, receive, send)

    return probed


def test_long_maps_wait_in_a_bounded_queue_that_holds_no_thread(gated_long_app):
    app, gate, queue = gated_long_app
    results: dict[int, httpx.Response] = {}
    with background(_with_thread_probe(app)) as url:
        threads = [_map_in_thread(url, 5, results)]
        _until(gate.started.is_set, "the first map")
        threads += [_map_in_thread(url, n, results) for n in (6, 7)]
        _until(lambda: queue.waiting() == 2, "two waiting maps")
        with httpx.Client(base_url=url, timeout=30) as http:
            refused = http.post("/api/long/map", json={"text": _words(8), "layer": 2, "head": 0})
            # The running map and those waiting take none of the worker threads that the
            # server's other routes may need, and /api/info needs none at all.
            assert http.get("/probe/worker-threads").json() == {"taken": 0}
            assert http.get("/api/info").status_code == 200
        gate.open.set()
        for thread in threads:
            thread.join()
    assert refused.status_code == 429 and _secured(refused)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["detail"].startswith("the server is busy: 2 requests are waiting for this model")
    assert {n: r.status_code for n, r in results.items()} == {5: 200, 6: 200, 7: 200}
    # Each map ran once, the first one first (the two that waited in either order).
    ran = [n for n, layer in gate.reached if layer == 2]
    assert ran[0] == 5 and sorted(ran) == [5, 6, 7]


def test_long_maps_whose_client_has_gone_never_run_or_stop_at_the_next_layer(gated_long_app):
    app, gate, queue = gated_long_app
    with background(app) as url:
        running = _send_and_leave_open(url, "/api/long/map", {"text": _words(5), "layer": 2, "head": 0})
        _until(gate.started.is_set, "the first map")
        waiting = [
            _send_and_leave_open(url, "/api/long/map", {"text": _words(n), "layer": 2, "head": 0}) for n in (6, 7)
        ]
        _until(lambda: queue.waiting() == 2, "two waiting maps")
        for s in [running, *waiting]:
            s.close()
        _until(lambda: queue.waiting() == 0, "the hung-up maps to be dropped")
        _until(
            lambda: queue.running is not None and queue.running.abandoned.is_set(), "the running map to be abandoned"
        )
        gate.open.set()
        with httpx.Client(base_url=url, timeout=30) as http:
            after = http.post("/api/long/map", json={"text": _words(9), "layer": 2, "head": 0})
    assert after.status_code == 200
    # The abandoned map stopped before its layer 1; the two that waited never ran.
    assert gate.reached == [(5, 0), (9, 0), (9, 1), (9, 2)]
