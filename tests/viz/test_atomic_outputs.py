"""Outputs are written through a temporary file and an atomic rename: a full disk leaves
the file written before intact (never a truncated JSON) and no temporary file behind."""

from __future__ import annotations

import errno
import json

import pytest

from attnkit.cli import inspect as inspect_command
from attnkit.cli import main
from attnkit.viz import files
from attnkit.viz.export import write_json
from attnkit.viz.heatmap import new_figure, save_figure


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "map.json"
    write_json({"good": 1}, path)
    monkeypatch.setattr(files.os, "fsync", _disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        write_json({"new": "x" * 10_000}, path)
    assert json.loads(path.read_text()) == {"good": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["map.json"]


def test_a_failed_picture_keeps_the_previous_picture(tmp_path, monkeypatch):
    path = tmp_path / "map.png"
    save_figure(new_figure((2, 2)), path)
    before = path.read_bytes()
    figure = new_figure((3, 3))

    def half_then_full(target, **kwargs):
        with open(target, "wb") as f:
            f.write(b"\x89PNG half")
        _disk_full()

    monkeypatch.setattr(figure, "savefig", half_then_full)
    with pytest.raises(OSError, match="No space left on device"):
        save_figure(figure, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["map.png"]


def test_inspect_on_a_full_disk_is_a_clear_error_and_overwrites_nothing(capsys, tmp_path, monkeypatch, minilm):
    # Before: the JSON was written in place; a full disk left it truncated, not valid JSON.
    monkeypatch.setattr(inspect_command, "load_model_of", lambda *args, **kwargs: minilm)
    argv = ["inspect", "--model", "minilm", "--format", "json,html", "--out", str(tmp_path), "the cat sat"]
    assert main(argv) == 0
    written = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    monkeypatch.setattr(files.os, "fsync", _disk_full)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "attnkit: error: cannot write to --out" in err and "No space left on device" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == written
