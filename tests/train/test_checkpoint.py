"""Checkpoints: plain data round-trips, a failed write leaves the previous checkpoint
whole, and files that are not plain data are refused."""

from __future__ import annotations

import pytest
import torch

from attnkit.train import checkpoint
from attnkit.train.checkpoint import load_checkpoint, save_checkpoint


class Payload:
    """Any class: unpickling it would mean importing and running code named by the file."""


def test_round_trip(tmp_path) -> None:
    state = {"step": 7, "weights": {"w": torch.randn(3, 4)}, "history": [1.5, 2.5], "name": "reverse", "none": None}
    path = save_checkpoint(state, tmp_path / "ckpt.pt")
    loaded = load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["history"] == [1.5, 2.5] and loaded["name"] == "reverse"
    assert torch.equal(loaded["weights"]["w"], state["weights"]["w"])
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left behind
    (tmp_path / "plain").touch()
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777  # not mkstemp's 0600


def test_a_write_that_dies_midway_leaves_the_old_checkpoint(tmp_path, monkeypatch) -> None:
    path = save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")

    def dying_save(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # as if the process were interrupted inside torch.save

    monkeypatch.setattr(checkpoint.torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"step": 2}, path)
    assert load_checkpoint(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_unreadable_or_unsafe_files_are_refused(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="is not a readable checkpoint"):
        load_checkpoint(tmp_path / "garbage.pt")
    # An arbitrary Python object would need code execution to unpickle: weights_only refuses it.
    torch.save({"obj": Payload()}, tmp_path / "object.pt")
    with pytest.raises(ValueError, match="is not a readable checkpoint"):
        load_checkpoint(tmp_path / "object.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="holds a list, not a dict"):
        load_checkpoint(tmp_path / "list.pt")
