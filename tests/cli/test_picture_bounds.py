"""Pictures within memory: --dpi and --figsize are checked when the arguments are read, and
the canvas a PNG is drawn on is estimated with the other outputs, before the model runs."""

from __future__ import annotations

import pytest

import attnkit.inspect.methods
from attnkit.cli import inspect as inspect_command
from attnkit.cli import main
from attnkit.viz.estimates import estimate_map_canvas
from attnkit.viz.heatmap import MAX_CANVAS_BYTES, new_figure, save_figure


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dpi", "nan"], "argument --dpi: must be a number above 0 and at most 10000, got 'nan'"),
        (["--dpi", "1e6"], "argument --dpi: must be a number above 0 and at most 10000, got '1e6'"),
        (["--dpi", "20000"], "argument --dpi: must be a number above 0 and at most 10000"),
        (["--dpi", "-3"], "argument --dpi: must be a number above 0"),
        (["--figsize", "nan,nan"], "argument --figsize: width and height must be numbers above 0 and at most 1000"),
        (["--figsize", "inf,3"], "argument --figsize: width and height must be numbers above 0"),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "heads"])
def test_impossible_picture_options_are_refused_when_read(capsys, command, argv, message):
    # Before: --dpi nan and --figsize nan,nan were refused by matplotlib after the model ran;
    # --dpi 1e6 ended in MemoryError.
    with pytest.raises(SystemExit) as exit_:
        main([command, "--model", "minilm", *argv, "hi"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_a_max_size_too_large_for_a_number_is_a_clear_error(capsys):
    code = main(["inspect", "--model", "minilm", "--max-size", "9" * 400, "hi"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("attnkit: error: --max-size must be at most 1 PB"), err


def test_a_canvas_over_the_limit_is_refused_with_its_estimate_before_the_model_runs(
    capsys, tmp_path, monkeypatch, minilm
):
    def no_running(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(inspect_command, "load_model_of", lambda *args, **kwargs: minilm)
    monkeypatch.setattr(attnkit.inspect.methods, "method_map", no_running)  # imported by the command when it runs
    argv = ["inspect", "--model", "minilm", "--format", "png", "--out", str(tmp_path), "--dpi", "2000", "hi"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "attnkit: error: the canvas of each PNG (pixels × 4 bytes, drawn before compression) would be about" in err
    assert "over the 20.0 MB limit per file, so nothing was written" in err and "lower --dpi" in err
    assert list(tmp_path.iterdir()) == []


def test_the_canvas_estimate_follows_dpi_figure_size_and_heads():
    assert estimate_map_canvas(3, 1, dpi=100, figsize=(10, 5)) == 4 * 1000 * 500
    assert estimate_map_canvas(3, 1, dpi=200, figsize=(10, 5)) == 4 * estimate_map_canvas(
        3, 1, dpi=100, figsize=(10, 5)
    )
    assert estimate_map_canvas(40, 1) < 20 * 10**6  # the default picture of a long text fits the default limit
    assert estimate_map_canvas(40, 64) > estimate_map_canvas(40, 12)  # several heads: a grid of panels


def test_the_library_refuses_a_canvas_beyond_memory_before_drawing(tmp_path):
    with pytest.raises(ValueError, match="figsize must be two finite numbers of inches above 0, got \\(nan, nan\\)"):
        new_figure((float("nan"), float("nan")))
    fig = new_figure((16, 14))
    with pytest.raises(ValueError, match=r"canvas of about 3\.6 GB, over the 0\.5 GB limit"):
        save_figure(fig, tmp_path / "big.png", dpi=2000)
    with pytest.raises(ValueError, match="dpi must be a finite number above 0, got nan"):
        save_figure(fig, tmp_path / "nan.png", dpi=float("nan"))
    assert MAX_CANVAS_BYTES < 16 * 14 * 2000 * 2000 * 4
    assert not list(tmp_path.iterdir())
