"""BART with other head counts in its encoder and decoder (3 and 7; 4 and 2): heads are
per stack everywhere — run_encoder_decoder's records, head selection, ``attnkit inspect`` (its
maps and the HTML page), ``attnkit heads`` and ``serve``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.encoder_decoder import survey_encoder_decoder
from attnkit.viz.viewer import ViewerData
from tests.fixtures.encoder_decoder_checkpoints import write_bart

transformers = pytest.importorskip("transformers")

SOURCE = "the big dog ran to the red house"
TARGET = "a cat sat on the mat"
# name → (d_model, encoder heads, decoder heads)
SHAPES = {"bart-3-7": (42, 3, 7), "bart-4-2": (32, 4, 2)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stack-heads")
    return {
        name: write_bart(root / name, d_model=e, encoder_attention_heads=enc, decoder_attention_heads=dec)
        for name, (e, enc, dec) in SHAPES.items()
    }


def _page(path: Path) -> ViewerData:
    """The data a viewer page embeds."""
    found = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', path.read_text(), re.S)
    assert found is not None
    return ViewerData.from_json(found.group(1))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_run_encoder_decoder_holds_every_head_of_each_stack_as_transformers(folders, name: str) -> None:
    _, enc, dec = SHAPES[name]
    model = models.load(folders[name])
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folders[name], attn_implementation="eager").eval()
    assert model.heads_per_kind == {"encoder": enc, "decoder": dec, "cross": dec}
    run = model.run_encoder_decoder(SOURCE, TARGET)
    assert run.heads == {"encoder": list(range(enc)), "decoder": list(range(dec)), "cross": list(range(dec))}
    start = torch.tensor([[model.module.decoder_start_token_id]])
    with torch.no_grad():
        want = hf(
            input_ids=run.source_ids,
            decoder_input_ids=torch.cat((start, run.target_ids[:, :-1]), dim=1),
            output_attentions=True,
        )
    torch.testing.assert_close(run.encoder_attentions[1], want.encoder_attentions[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(run.decoder_attentions[2], want.decoder_attentions[2], rtol=0, atol=1e-5)
    torch.testing.assert_close(run.cross_attentions[2], want.cross_attentions[2], rtol=0, atol=1e-5)


def test_heads_are_checked_against_each_stack(folders) -> None:
    model = models.load(folders["bart-3-7"])
    with pytest.raises(ValueError, match="encoder has 3 heads per layer"):
        model.run_encoder_decoder(SOURCE, TARGET, heads=[5])
    run = model.run_encoder_decoder(SOURCE, TARGET, heads={"decoder": [5], "cross": [6, 1]})
    assert run.heads == {"encoder": [0, 1, 2], "decoder": [5], "cross": [6, 1]}
    assert run.decoder_attentions[0].shape[1] == 1 and run.cross_attentions[0].shape[1] == 2
    full = model.run_encoder_decoder(SOURCE, TARGET)
    torch.testing.assert_close(run.cross_attentions[0][:, 0], full.cross_attentions[0][:, 6], rtol=0, atol=0)
    with pytest.raises(ValueError, match="heads are selected per kind"):
        model.run_encoder_decoder(SOURCE, TARGET, heads={"self": [0]})


def test_inspect_shows_the_heads_of_the_kind_asked(capsys, folders, tmp_path: Path) -> None:
    folder = str(folders["bart-3-7"])
    argv = ["inspect", SOURCE, "--model", folder, "--decoder-text", TARGET, "--out", str(tmp_path), "--quiet"]
    assert main([*argv, "--attention", "decoder", "--heads", "5", "--format", "json,html"]) == 0, capsys.readouterr()
    data = json.loads((tmp_path / "bart-3-7_decoder_layer2_head5.json").read_text())
    assert data["heads"] == [5]
    page = _page(tmp_path / "bart-3-7_viewer.html")
    assert page.sections["decoder"].heads == (5,) and page.sections["encoder"].heads == (0, 1, 2)
    capsys.readouterr()
    assert main([*argv, "--attention", "encoder", "--heads", "5", "--format", "json"]) == 2
    assert "the encoder attention of bart-3-7 has 3 heads per layer" in capsys.readouterr().err


def test_the_html_page_holds_each_stacks_heads(capsys, folders, tmp_path: Path) -> None:
    folder = str(folders["bart-4-2"])
    code = main(["inspect", SOURCE, "--model", folder, "--out", str(tmp_path), "--format", "html", "--quiet"])
    assert code == 0, capsys.readouterr().err
    page = _page(tmp_path / "bart-4-2_viewer.html")
    heads = {kind: section.heads for kind, section in page.sections.items()}
    assert heads == {"encoder": (0, 1, 2, 3), "decoder": (0, 1), "cross": (0, 1)}


def test_a_head_survey_counts_the_heads_of_its_stack(folders) -> None:
    model = models.load(folders["bart-3-7"])
    for kind, count in (("encoder", 3), ("decoder", 7), ("cross", 7)):
        survey = survey_encoder_decoder(model, [(SOURCE, TARGET)], attention=kind)
        assert survey.num_heads == count
        assert all(values.shape[-1] == count for values in survey.statistics.values())


def test_serve_answers_with_each_stacks_heads(folders) -> None:
    from fastapi.testclient import TestClient

    from attnkit.serve import create_app

    client = TestClient(create_app([str(folders["bart-4-2"])], loader=models.load), base_url="http://127.0.0.1")
    info = client.get("/api/info").json()["models"][0]
    assert (info["heads"], info["decoder_heads"]) == (4, 2)
    body = {"model": "bart-4-2", "text": SOURCE, "decoder_text": TARGET}
    response = client.post("/api/attention", json=body)
    assert response.status_code == 200, response.text
    data = ViewerData.from_json(response.text)
    assert {kind: section.heads for kind, section in data.sections.items()} == {
        "encoder": (0, 1, 2, 3),
        "decoder": (0, 1),
        "cross": (0, 1),
    }
    # Head 3 is the encoder's only: the decoder's sections are left out.
    response = client.post("/api/attention", json=body | {"heads": [3]})
    assert response.status_code == 200, response.text
    assert list(ViewerData.from_json(response.text).sections) == ["encoder"]
