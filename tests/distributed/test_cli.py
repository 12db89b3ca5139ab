"""`attnkit train --nproc N` (torchrun underneath): the run of one process, written by rank 0;
and the errors it gives before starting any process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.train import load_checkpoint
from tests.fixtures.tiny_training import TINY_TRAIN_ARGS

# Several processes each (torchrun-style ranks): seconds per test, left out of make test-fast.
pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = ["--task", "reverse", *TINY_TRAIN_ARGS, "--steps", "30"]


def _attnkit(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "attnkit.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.timeout(180)
def test_train_nproc_two_equals_one_process(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *TINY, "--out", str(one)]) == 0
    capsys.readouterr()
    done = _attnkit("train", *TINY, "--nproc", "2", "--out", str(two), timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "30 steps of 8 on 2 processes (gloo) (1 thread each)" in done.stdout
    assert done.stdout.count("held-out exact match:") == 1  # rank 0 alone reports
    losses_one = load_checkpoint(one / "checkpoint.pt")["losses"]
    losses_two = load_checkpoint(two / "checkpoint.pt")["losses"]
    assert float(((losses_two - losses_one).abs() / losses_one).max()) <= 1e-4
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nproc", "0"], "--nproc must be >= 1, got 0"),
        (["--nproc", "3", "--batch-size", "2"], "--batch-size (2) must be >= --nproc (3)"),
        (["--nproc", "2", "--heads", "3"], "d_model must be divisible by heads"),
    ],
)
def test_train_nproc_errors_come_before_any_process_starts(extra, message, tmp_path, capsys):
    assert main(["train", *TINY, *extra, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "checkpoint.pt").exists()


def test_train_under_torchrun_with_another_nproc_is_an_error(tmp_path, capsys, monkeypatch):
    # What torchrun sets for a one-process job; --nproc 2 contradicts it.
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    try:
        assert main(["train", *TINY, "--nproc", "2", "--out", str(tmp_path)]) == 2
        assert "differs from the number of processes torchrun started (1)" in capsys.readouterr().err
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
