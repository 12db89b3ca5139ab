"""`attnkit train`: a tiny run end to end, stop and resume, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from attnkit.cli import main
from tests.fixtures.tiny_training import TINY_TRAIN_ARGS

TINY = [*TINY_TRAIN_ARGS, "--steps", "20"]


def train(capsys, *argv):
    code = main(["train", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_tiny_reverse_run_writes_metrics_heatmap_and_checkpoint(capsys, tmp_path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the run's 1 thread, so that undoing it shows
    try:
        code, out, err = train(capsys, "--task", "reverse", "--out", str(tmp_path), *TINY)
        assert code == 0, err
        assert torch.get_num_threads() == 2  # --threads is undone when the command returns
    finally:
        torch.set_num_threads(threads)
    assert "reverse: encoder-decoder, 1+1 layers, d_model 16, 2 heads, ff 32; 20 steps of 8 on cpu (1 thread)" in out
    assert "held-out exact match:" in out and "anti-diagonal alignment" in out and "best head: layer 0, head" in out
    for name in ("metrics.json", "cross_attention.png", "checkpoint.pt"):
        assert f"wrote {tmp_path / name}" in out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["steps"] == 20 and metrics["steps"] == 20
    assert set(metrics) >= {"config", "steps", "train", "held_out", "alignment", "time", "example"}


@pytest.mark.slow
def test_stop_after_then_resume_equals_a_straight_run(capsys, tmp_path) -> None:
    assert train(capsys, "--task", "sort", "--out", str(tmp_path / "a"), *TINY)[0] == 0
    code, out, _ = train(capsys, "--task", "sort", "--out", str(tmp_path / "b"), *TINY, "--stop-after", "10")
    assert code == 0 and "stopped after step 10 of 20" in out and "--resume" in out
    assert not (tmp_path / "b" / "metrics.json").exists()
    # Options not typed again are taken from the checkpoint.
    code, out, err = train(capsys, "--out", str(tmp_path / "b"), "--resume", "--no-progress")
    assert code == 0, err
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in "ab")
    assert a.pop("time") and b.pop("time") and a == b


def test_addition_defaults_to_more_steps(capsys, tmp_path) -> None:
    code, out, err = train(capsys, "--task", "addition", "--out", str(tmp_path), "--stop-after", "1", "--no-progress")
    assert code == 0, err
    assert "addition: decoder-only, 2 layers, d_model 128, 4 heads, ff 256; 8000 steps of 64" in out
    assert "stopped after step 1 of 8000" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "steps must be >= 1, got 0"),
        (["--d-model", "30", "--heads", "4"], "d_model must be divisible by heads, got d_model=30 and heads=4"),
        (["--length", "2"], "has only 36 distinct inputs"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--device", "cuda:99"], "cuda"),
    ],
)
def test_bad_options(capsys, tmp_path, argv, message) -> None:
    code, _, err = train(capsys, "--task", "reverse", "--out", str(tmp_path), *TINY, *argv)
    assert code == 2 and err.startswith("attnkit: error: ") and message in err


def test_unknown_task_and_missing_task(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--task", "rotate", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "invalid choice: 'rotate'" in capsys.readouterr().err
    code, _, err = train(capsys, "--out", str(tmp_path))
    assert code == 2 and "--task is required" in err


def test_resume_errors_and_unwritable_output(capsys, tmp_path) -> None:
    code, _, err = train(capsys, "--out", str(tmp_path / "empty"), "--resume")
    assert code == 2 and "nothing to resume: no checkpoint.pt in" in err
    assert train(capsys, "--task", "reverse", "--out", str(tmp_path / "run"), *TINY, "--stop-after", "5")[0] == 0
    code, _, err = train(capsys, "--task", "copy", "--out", str(tmp_path / "run"), "--resume")
    assert code == 2 and "another config (task: checkpoint 'reverse', asked 'copy')" in err
    code, _, err = train(capsys, "--task", "reverse", "--out", str(tmp_path / "run"), *TINY)
    assert code == 2 and "already holds a checkpoint.pt" in err
    (tmp_path / "file").write_text("not a directory")
    code, _, err = train(capsys, "--task", "reverse", "--out", str(tmp_path / "file" / "run"), *TINY)
    assert code == 2 and "cannot write to output directory" in err


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_result(capsys, tmp_path) -> None:
    # A real SIGKILL right after the first checkpoint (one after every step), then --resume.
    options = ["--task", "copy", *TINY, "--steps", "300"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnkit.cli",
            "train",
            "--out",
            str(tmp_path / "killed"),
            *options,
            "--checkpoint-every",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = tmp_path / "killed" / "checkpoint.pt"
    deadline = time.monotonic() + 60
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.kill()
    process.wait()
    assert not (tmp_path / "killed" / "metrics.json").exists()  # it died before the end
    # Checkpoints every step cost a file sync each; the rest of the run needs only the last.
    resume = ["--out", str(tmp_path / "killed"), "--resume", "--checkpoint-every", "300", "--no-progress"]
    assert train(capsys, *resume)[0] == 0
    assert train(capsys, "--out", str(tmp_path / "straight"), *options, "--checkpoint-every", "300")[0] == 0
    killed, straight = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("killed", "straight"))
    assert killed.pop("time") and straight.pop("time") and killed == straight
