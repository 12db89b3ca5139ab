"""A model whose float32 weights are finite but whose scores overflow (query and key
weights of 1e20 in layer 1: q·k ~ 1e40 is infinite, its softmax NaN): every output refuses
the numbers that are not finite, naming what holds them, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnkit import models
from attnkit.cli import main
from attnkit.inspect import interventions
from tests.fixtures.crafted import tiny_llama_tensors, write_tiny_llama


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory) -> Path:
    folder = write_tiny_llama(tmp_path_factory.mktemp("models") / "overflowing")
    tensors = tiny_llama_tensors()
    for name in ("q_proj", "k_proj"):
        tensors[f"model.layers.1.self_attn.{name}.weight"] *= 1e20
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["inspect", "the cat sat", "--format", "json,png,html", "--layers", "0,1"],
            # A softmax over scores that overflow is NaN across the row.
            "the attention map of layer 1 of overflowing has 9 of 9 values that are NaN or infinite",
        ),
        (
            ["patch", "--clean", "the cat sat", "--corrupt", "a cat sat", "--target", "mat", "--wrong", "b"],
            "the patching effects (fraction of the logit difference 'mat' - 'b' restored) of overflowing has 4 of 4",
        ),
        (["heads", "the cat sat on the mat"], "the head statistic 'entropy' of overflowing has 2 of 4 values"),
    ],
)
def test_outputs_that_are_not_finite_are_refused_before_any_file(capsys, tmp_path, overflowing, argv, message):
    out = tmp_path / "out"
    code = main([*argv, "--model", str(overflowing), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not out.exists() or not list(out.iterdir())


def test_generate_refuses_logits_that_are_not_finite(capsys, overflowing):
    code = main(["generate", "the cat", "--model", str(overflowing)])
    err = capsys.readouterr().err
    assert code == 2 and "the next-token logits has 16 of 16 values that are NaN or infinite" in err
    with pytest.raises(ValueError, match="the next-token logits has"):
        list(models.load(overflowing).generate_ids("the cat", max_new_tokens=3))


def test_serve_answers_422_naming_the_layer(overflowing):
    from fastapi.testclient import TestClient

    from attnkit.serve import create_app

    client = TestClient(create_app(["tiny"], loader=lambda name: models.load(overflowing)), base_url="http://127.0.0.1")
    response = client.post("/api/attention", json={"text": "the cat sat"})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("the attention weights of layer 1 of tiny has ") and "NaN or infinite" in detail


def test_a_metric_function_returning_nan_is_refused(tmp_path):
    model = models.load(write_tiny_llama(tmp_path / "tiny"))

    def nan_metric(out: torch.Tensor) -> torch.Tensor:
        return out[:, 0] * float("nan")

    with pytest.raises(ValueError, match="the metric function's result has 1 of 1 values that are NaN or infinite"):
        interventions.activation_patching(model, "the cat sat", "a cat sat", metric=nan_metric)


def test_the_viewer_page_is_refused_before_it_is_written(tmp_path, overflowing):
    from attnkit.viz.export import write_viewer

    message = r"the attention weights of layer 1 of overflowing has \d+ of 18 values that are NaN or infinite"
    with pytest.raises(ValueError, match=message):
        write_viewer(models.load(overflowing), "the cat sat", tmp_path)
    assert list(tmp_path.iterdir()) == []
