"""The viewer and ``serve`` on every decoder family (tiny random checkpoints of
tests/fixtures/tiny_families.py): the HTML page written by ``attnkit inspect --format html``
and the server's ``/api/attention`` answer both carry every layer's and head's map, equal to
the model's own ``run``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from attnkit import models
from attnkit.cli import main
from attnkit.serve import create_app
from attnkit.viz.viewer import ViewerData
from tests.fixtures.tiny_families import CASES
from tests.viz.test_viewer_html import page_parts

pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"  # longer than the sliding windows of the tiny families


@pytest.fixture(scope="module")
def folders(tiny_family_folder) -> dict[str, str]:
    return {case: str(tiny_family_folder(case)) for case in sorted(CASES)}


def _assert_every_map_equals_run(section, model) -> None:
    expected = model.run(TEXT).attentions
    assert section.layers == tuple(range(model.num_layers))
    assert section.heads == tuple(range(model.num_heads))
    assert section.query_tokens == tuple(TEXT.split())
    for layer in section.layers:
        for head in section.heads:
            difference = (section.map(layer, head) - expected[layer][0, head]).abs().max()
            assert difference < 1e-5, (layer, head, float(difference))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_html_viewer_shows_every_family(case, folders, tmp_path) -> None:
    folder = folders[case]
    argv = ["inspect", TEXT, "--model", folder, "--format", "html", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    (page,) = tmp_path.glob("*_viewer.html")
    data = ViewerData.from_json(page_parts(page.read_text())["data"])
    assert data.kind == "causal" and data.text == TEXT
    _assert_every_map_equals_run(data.sections["self"], models.load(folder))


def test_serve_answers_for_every_family(folders) -> None:
    app = create_app(list(folders.values()), max_tokens=32)
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    info = client.get("/api/info").json()
    assert sorted(entry["name"] for entry in info["models"]) == sorted(folders)
    for case in folders:
        response = client.post("/api/attention", json={"text": TEXT, "model": case})
        assert response.status_code == 200, (case, response.text[:300])
        data = ViewerData.from_json(response.text)
        assert data.model_name == case
        _assert_every_map_equals_run(data.sections["self"], app.state.models[case].model)
