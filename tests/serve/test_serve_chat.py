"""``attnkit serve`` with a chat model: ``chat`` in a request reads the text in the model's
chat template (the response's self section carries the turns), ``GET /api/info`` says which
models have one, a model without one is refused in one line; and in a real headless
Chromium, the app's Chat template menu shows the turns."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from attnkit.models import load
from attnkit.serve import background, create_app
from attnkit.viz.viewer import ViewerData
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.fixtures.chat import write_chat_model

LOCAL = "http://127.0.0.1:8000"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the cat sat"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-chat")
    return {"chat": write_chat_model(root / "chat"), "plain": write_chat_model(root / "plain", template=None)}


@pytest.fixture(scope="module")
def app(folders):
    return create_app(
        ["chat", "plain"], loader=lambda name: load(str(folders[name])), allowed_hosts=["127.0.0.1", "localhost"]
    )


def test_info_says_which_models_have_a_chat_template(app):
    models = TestClient(app, base_url=LOCAL).get("/api/info").json()["models"]
    assert {m["name"]: m["chat_template"] for m in models} == {"chat": True, "plain": False}


def test_a_chat_request_counts_the_template_tokens_and_carries_the_turns(app, folders):
    client = TestClient(app, base_url=LOCAL)
    response = client.post("/api/attention", json={"text": json.dumps(MESSAGES), "model": "chat", "chat": True})
    assert response.status_code == 200, response.text
    section = ViewerData.from_json(response.text).sections["self"]
    chat = load(str(folders["chat"])).apply_chat_template(MESSAGES)
    assert len(section.query_tokens) == len(chat.encoded.tokens)
    assert section.turns == chat.turns
    plain = client.post("/api/attention", json={"text": "the cat sat", "model": "chat"})
    assert ViewerData.from_json(plain.text).sections["self"].turns is None


def test_a_model_without_a_template_is_refused_in_one_line(app):
    response = TestClient(app, base_url=LOCAL).post(
        "/api/attention", json={"text": "the cat sat", "model": "plain", "chat": True}
    )
    detail = response.json()["detail"]
    assert response.status_code == 422 and "has no chat template" in detail and "\n" not in detail


def test_the_app_page_reads_the_text_in_the_chat_template(app, page):
    with background(app) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-state=empty]")
        assert page.is_visible("#ak-chat-field")
        page.get_by_label("Text", exact=True).fill("the cat sat")
        page.get_by_label("Chat template", exact=True).select_option(value="on")
        page.get_by_role("button", name="Show attention").click()
        Viewer(page).wait()
        chips = page.locator("#ak-turns .ak-turn-chip").all_text_contents()
        assert [chip.split(":")[0] for chip in chips] == ["1. user", "2. assistant"]
        assert page.get_attribute("#ak-q-0", "data-role") == "user"
        page.get_by_label("Model", exact=True).select_option("plain")
        assert not page.is_visible("#ak-chat-field")
