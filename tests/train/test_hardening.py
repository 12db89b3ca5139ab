"""Training runs against what goes wrong around them: temporary files of killed writers,
flipped bytes and crafted fields in a checkpoint, an output folder that stops being
writable, absurd step counts and learning rates."""

from __future__ import annotations

import dataclasses
import math
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

from attnkit.cli import main
from attnkit.train import loop
from attnkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from attnkit.train.loop import TrainConfig, run
from tests.fixtures.tiny_training import TINY_TRAIN_ARGS
from tests.train.test_loop import TINY


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_temporary_files_of_killed_writers_are_removed(tmp_path):
    dead = tmp_path / f".{CHECKPOINT_NAME}.{_dead_pid()}.k2j3.tmp"
    legacy = tmp_path / f".{CHECKPOINT_NAME}.k2j3abcd.tmp"  # named before writers put their pid in
    alive = tmp_path / f".{CHECKPOINT_NAME}.1.x.tmp"  # pid 1 always runs: another writer, left alone
    other = tmp_path / ".notes.txt.tmp"
    for path in (dead, legacy, alive, other):
        path.write_bytes(b"half a checkpoint")
    run(TINY, tmp_path, stop_after=5, progress=False)
    assert not dead.exists() and not legacy.exists() and alive.exists() and other.exists()


def _data_offset(path, member_suffix: str) -> tuple[int, int]:
    """Where the bytes of the zip member ending in ``member_suffix`` start, and how many."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if i.filename.endswith(member_suffix)), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def test_flipped_bytes_inside_a_tensor_are_detected(tmp_path):
    run(TINY, tmp_path, stop_after=5, progress=False)
    path = tmp_path / CHECKPOINT_NAME
    start, size = max((_data_offset(path, f"data/{n}") for n in range(3)), key=lambda x: x[1])
    data = bytearray(path.read_bytes())
    data[start + size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is corrupt: its content does not match the checksum stored with it"):
        run(TINY, tmp_path, resume=True, progress=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(step=-1), r"step -1 is outside 0..24"),
        (lambda s: s.update(step=10**12), r"step 1000000000000 is outside 0..24"),
        (lambda s: s.update(step="5"), r"field 'step' is missing or of the wrong type"),
        (lambda s: s.pop("optimizer"), r"field 'optimizer' is missing or of the wrong type"),
        (lambda s: s.update(losses=torch.zeros(3)), r"losses must be 5 floats, got torch.float32 \[3\]"),
        (lambda s: s["rng"].update(torch="x"), r"field 'rng' must hold the generator states"),
        (lambda s: s["config"].update(lr="fast"), r"config field lr must be float, got 'fast'"),
        (lambda s: s["config"].update(steps=2**40), r"steps must be at most 10,000,000"),
        (lambda s: s["config"].update(heads=0), r"heads must be >= 1"),
        (lambda s: s["config"].update(colour=1), r"not a training config"),
        (
            lambda s: s["model"].pop(next(iter(s["model"]))),
            r"model does not have the fields it needs: missing \[network.source_embedding.token.weight\], unknown \[\]",
        ),
        (
            lambda s: s["model"].update({k: torch.zeros(1) for k in list(s["model"])[:1]}),
            r"model.network.source_embedding.token.weight must be a torch.float32 tensor of shape \[8, 16\], got .* shape \[1\]",
        ),
    ],
)
def test_crafted_checkpoint_fields_are_clear_errors(tmp_path, change, message):
    run(TINY, tmp_path, stop_after=5, progress=False)
    path = tmp_path / CHECKPOINT_NAME
    state = load_checkpoint(path)
    change(state)
    save_checkpoint(state, path)
    with pytest.raises(ValueError, match=message):
        run(TINY, tmp_path, resume=True, progress=False)


def test_an_output_folder_that_stops_being_writable_is_a_clear_error(tmp_path, monkeypatch, capsys):
    writes = []

    def failing_save(state, path):
        writes.append(path)
        if len(writes) > 1:
            raise PermissionError(13, "Permission denied", str(path))
        return save_checkpoint(state, path)

    monkeypatch.setattr(loop, "save_checkpoint", failing_save)
    expected = r"cannot write the checkpoint .*checkpoint.pt at step 10: Permission denied; the previous checkpoint"
    with pytest.raises(OSError, match=expected):
        run(TINY, tmp_path / "lib", progress=False)
    assert load_checkpoint(tmp_path / "lib" / CHECKPOINT_NAME)["step"] == 5
    writes.clear()
    code = main(
        [
            "train",
            *("--task", "reverse", "--out", str(tmp_path / "cli")),
            *TINY_TRAIN_ARGS,
            *("--steps", "20", "--checkpoint-every", "5"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("attnkit: error: cannot write the checkpoint") and "Traceback" not in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(steps=2_000_000_000), "steps must be at most 10,000,000, got 2,000,000,000"),
        (dict(lr=math.inf), "lr must be a finite number, got inf"),
        (dict(lr=math.nan), "lr must be > 0, got nan"),
        (dict(weight_decay=math.inf), "weight_decay must be a finite number, got inf"),
    ],
)
def test_absurd_options_are_clear_errors(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        run(dataclasses.replace(TINY, **change), tmp_path, progress=False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--steps", "2000000000"], "steps must be at most"), (["--lr", "inf"], "lr must be a finite number")],
)
def test_absurd_options_on_the_command_line(capsys, tmp_path, argv, message):
    code = main(["train", "--task", "reverse", "--out", str(tmp_path), "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err


def test_config_round_trip_keeps_checking_types():
    assert TrainConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="config field layers must be int, got True"):
        TrainConfig.from_dict({**TINY.to_dict(), "layers": True})
