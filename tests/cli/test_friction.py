"""Small frictions of the commands and pictures: options refused before the model loads,
an error that names the target, a colour-bar label that fits, repeated tokens told apart
on a picture's axes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.cli import heads as heads_command
from attnkit.cli import main
from attnkit.cli import patch as patch_command


def _no_loading(*args, **kwargs):
    raise AssertionError("the model loaded before the options were checked")


def test_stat_alignment_without_align_says_it_needs_align(capsys, monkeypatch) -> None:
    monkeypatch.setattr(heads_command, "load_model_of", _no_loading)
    code = main(["heads", "the cat sat", "--model", "smollm2", "--stat", "alignment"])
    err = capsys.readouterr().err
    assert code == 2 and "--stat alignment needs --align FILE" in err, err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--metric", "log-p", "--target", " Mary", "--wrong", " John"], "--metric log-p measures the --target"),
        (["--metric", "cosine", "--wrong", " John"], "--metric cosine compares sentence embeddings"),
    ],
)
def test_patch_checks_the_metric_and_its_tokens_before_loading(capsys, monkeypatch, options, message) -> None:
    monkeypatch.setattr(patch_command, "load_model_of", _no_loading)
    argv = ["patch", "--clean", "John gave it to", "--corrupt", "Mary gave it to", "--model", "smollm2"]
    code = main([*argv, *options])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


@pytest.mark.slow
def test_serve_says_it_is_the_target_that_is_too_long(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from attnkit import models
    from attnkit.serve import create_app
    from tests.fixtures.encoder_decoder_checkpoints import write_bart

    folder = write_bart(tmp_path / "bart")  # 64 positions
    client = TestClient(create_app([str(folder)], loader=models.load), base_url="http://127.0.0.1")
    response = client.post("/api/attention", json={"model": "bart", "text": "the cat", "decoder_text": "the cat " * 45})
    assert response.status_code == 422
    assert response.json()["detail"] == "the target (decoder_text) is 92 tokens long; bart reads at most 64 tokens"


@pytest.mark.slow
def test_a_long_colour_bar_label_of_a_one_row_grid_stays_in_the_picture() -> None:
    from attnkit.viz.head_grid import plot_head_grid

    label = "fraction of the logit difference ' Mary' - ' John' restored"
    fig = plot_head_grid(
        torch.linspace(-1, 1, 15)[None], title="patching resid_pre by position", label=label,
        rows=["0-29"], columns=[f"t{i}" for i in range(15)], xlabel="position (clean token)",
    )  # fmt: skip
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    shown = fig.axes[1].yaxis.label
    box, page = shown.get_window_extent(renderer), fig.bbox
    assert page.y0 <= box.y0 and box.y1 <= page.y1 and box.x1 <= page.x1, (box, page)
    assert " ".join(shown.get_text().split()) == label  # wrapped, not cut


def test_repeated_tokens_are_numbered_on_the_axes_of_a_position_picture(tmp_path: Path, monkeypatch) -> None:
    import attnkit.viz.head_grid
    from attnkit.inspect.interventions import InterventionEffects
    from attnkit.viz.export import write_effects

    drawn = {}

    def capture(values, path, **options):
        drawn.update(options)
        return path

    monkeypatch.setattr(attnkit.viz.head_grid, "draw_head_grid", capture)
    tokens = ["When", " John", " and", " Mary", ",", " John", " gave"]
    effects = InterventionEffects(
        model_name="m", kind="patching", metric="logit difference", by="position", component="resid_pre",
        layers=[0, 1], columns=[t.strip() for t in tokens], effects=torch.zeros(1, len(tokens)),
        texts={"clean": "c", "corrupt": "d"}, tokens=tokens, target=" Mary", wrong=" John", replacement="clean",
        baseline={"clean": 1.0, "corrupt": 0.0},
    )  # fmt: skip
    write_effects(effects, tmp_path, ["png"])
    assert drawn["columns"] == ["When", "John₁", "and", "Mary", ",", "John₂", "gave"]
