"""The commands and the server on bridged models (tiny random checkpoints of
tests.fixtures.bridge_checkpoints.py): ``inspect`` (JSON records and the viewer, labelled
``bridge:<model_type>``), ``heads`` (ablation and long-context statistics), ``patch``,
``generate`` and ``serve`` take a bridged model as they take a native one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.long_context import long_context_summaries
from attnkit.serve import create_app
from attnkit.viz.viewer import ViewerData
from tests.fixtures.bridge_checkpoints import write_bridge_checkpoint
from tests.viz.test_viewer_html import page_parts

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"  # longer than the sliding windows
LONG = " ".join(f"w{(i * 7) % 40 + 1}" for i in range(50))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bridge-cli")
    return {
        model_type: write_bridge_checkpoint(model_type, root / f"tiny-{model_type}")
        for model_type in ("olmo2", "cohere2")
    }


def _assert_every_map_equals_run(section, model) -> None:
    expected = model.run(TEXT).attentions
    assert section.layers == tuple(range(model.num_layers))
    for layer in section.layers:
        for head in section.heads:
            assert (section.map(layer, head) - expected[layer][0, head]).abs().max() < 1e-5, (layer, head)


def test_inspect_writes_records_and_a_viewer_labelled_bridged(folders, tmp_path, capsys) -> None:
    folder = folders["cohere2"]
    assert (
        main(
            ["inspect", TEXT, "--model", str(folder), "--layer", "-1", "--format", "json", "--out", str(tmp_path), "-q"]
        )
        == 0
    )
    (record,) = tmp_path.glob("*_layer1_head0.json")
    assert json.loads(record.read_text())["model"] == "tiny-cohere2 (bridge:cohere2)"
    argv = ["inspect", TEXT, "--model", str(folder), "--format", "html", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    (page,) = tmp_path.glob("*_viewer.html")
    html = page.read_text()
    assert "<title>Attention: tiny-cohere2 (bridge:cohere2)</title>" in html
    data = ViewerData.from_json(page_parts(html)["data"])
    _assert_every_map_equals_run(data.sections["self"], models.load(folder))


def test_heads_ablates_and_ranks_long_context_statistics(folders, tmp_path, capsys) -> None:
    folder = folders["cohere2"]
    argv = ["heads", TEXT, "--model", str(folder), "--ablate", "--target", "w5", "--out", str(tmp_path), "-q"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tiny-cohere2 (bridge:cohere2) · zero ablation of each head" in out
    data = json.loads((tmp_path / "tiny-cohere2_bridge_cohere2_ablation.json").read_text())
    assert len(data["effects"]) == 2 and len(data["effects"][0]) == 4
    code = main(["heads", LONG, "--stat", "sink", "--model", str(folder), "--top", "3", "--out", str(tmp_path), "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    sinks = [float(line.split()[2]) for line in out.splitlines()[1:4]]
    assert sinks == sorted(sinks, reverse=True)


def test_long_context_statistics_equal_the_maps(folders) -> None:
    model = models.load(folders["cohere2"])
    summary = long_context_summaries(model, LONG, layers=[0, 1], top_k=3, window=4)
    run = model.run(LONG)
    for layer in (0, 1):  # layer 0 has a sliding window of 6
        maps = run.attentions[layer][0].double()  # [h, s, s]
        got = summary.summaries[layer].top_weights.double()  # [h, s, 3], 0 past the keys a row has
        torch.testing.assert_close(got, maps.topk(3, dim=-1).values, rtol=0, atol=1e-6)


def test_patch_and_generate_take_a_bridged_model(folders, tmp_path, capsys) -> None:
    folder = folders["olmo2"]
    argv = ["patch", "--clean", "w3 w17 w5 w99", "--corrupt", "w3 w18 w5 w99", "--target", "w7", "--wrong", "w9"]
    assert main([*argv, "--model", str(folder), "--out", str(tmp_path), "-q"]) == 0
    assert "patching each head of 'w3 w17 w5 w99' into 'w3 w18 w5 w99'" in capsys.readouterr().out
    data = json.loads((tmp_path / "tiny-olmo2_bridge_olmo2_patching.json").read_text())
    assert len(data["effects"]) == 2
    assert main(["generate", "w1 w2 w3", "--model", str(folder), "--max-new-tokens", "3"]) == 0
    assert len(capsys.readouterr().out.split()) == 3


def test_serve_answers_for_bridged_models(folders) -> None:
    app = create_app([str(folder) for folder in folders.values()], max_tokens=32)
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    info = {entry["name"]: entry for entry in client.get("/api/info").json()["models"]}
    assert {name: entry["family"] for name, entry in info.items()} == {
        "tiny-olmo2": "bridge:olmo2",
        "tiny-cohere2": "bridge:cohere2",
    }
    for name in info:
        response = client.post("/api/attention", json={"text": TEXT, "model": name})
        assert response.status_code == 200, (name, response.text[:300])
        _assert_every_map_equals_run(ViewerData.from_json(response.text).sections["self"], app.state.models[name].model)
