"""``attnkit serve`` with a model that runs through transformers' attention interface (the
bridge): ``GET /api/info`` gives its family, and in a real headless Chromium the model
picker, the title and the summary name it as exported pages do, ``name (bridge:olmo2)``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from attnkit.models import load
from attnkit.serve import background, create_app
from tests.browser import Viewer, browser, page  # noqa: F401 (fixtures)
from tests.fixtures.bridge_checkpoints import write_bridge_checkpoint

LOCAL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    folder = write_bridge_checkpoint("olmo2", tmp_path_factory.mktemp("serve-bridge") / "tiny-olmo2")
    return create_app(["tiny-olmo2"], loader=lambda name: load(str(folder)), allowed_hosts=["127.0.0.1", "localhost"])


def test_info_gives_the_bridged_family(app):
    (model,) = TestClient(app, base_url=LOCAL).get("/api/info").json()["models"]
    assert (model["name"], model["family"]) == ("tiny-olmo2", "bridge:olmo2")


def test_the_app_page_names_the_bridged_family(app, page):
    with background(app) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-state=empty]")
        assert page.locator("#ak-model option").all_text_contents()[0].startswith("tiny-olmo2 (bridge:olmo2) (")
        page.get_by_label("Text", exact=True).fill("w1 w2 w3 w4")
        page.get_by_role("button", name="Show attention").click()
        Viewer(page).wait()
        assert page.title() == "Attention: tiny-olmo2 (bridge:olmo2)"
        assert page.text_content("#ak-summary").startswith("tiny-olmo2 (bridge:olmo2) \u00b7 causal")
