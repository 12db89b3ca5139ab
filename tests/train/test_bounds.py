"""Training configurations and checkpoints that would exhaust memory, crash at the first
step or write NaN: each is refused up front, naming the field. Checkpoints are crafted and
re-saved with a recomputed checksum (the checksum detects corruption, not tampering)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.train.budget import TRAIN_MEMORY_LIMIT, estimated_memory
from attnkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from attnkit.train.loop import TrainConfig, run
from tests.fixtures.tiny_training import TINY_TRAIN_ARGS
from tests.train.test_loop import TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--d-model", "2000000", "--heads", "2"], "d_model must be at most 65,536, got 2,000,000"),
        (["--symbols", "1000000000"], "symbols must be at most 65,536"),
        (["--layers", "100000"], "layers must be at most 64"),
        (["--batch-size", "10000000"], "batch_size must be at most 65,536"),
        (["--d-model", "8192", "--heads", "2"], "this run would need about 26.9 GiB of memory (d_model=8192"),
        (["--warmup", "100000000"], "warmup must be at most 10,000,000"),
        (["--seed", "-1"], "seed must be >= 0"),
    ],
)
def test_sizes_beyond_memory_are_refused_before_anything_is_allocated(capsys, tmp_path, argv, message):
    out = tmp_path / "run"
    code = main(["train", "--task", "copy", "--out", str(out), "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"attnkit: error: {message}"), err
    assert "Traceback" not in err and not out.exists()


def test_the_memory_estimate_grows_with_the_model_and_stays_small_for_the_defaults():
    for task in ("copy", "reverse", "sort", "addition"):
        config = TrainConfig.for_task(task)
        assert estimated_memory(config, config.validate()) < 200 * 2**20  # the defaults train in well under 1 GiB
    small = TrainConfig.for_task("copy", d_model=512, heads=2)
    large = dataclasses.replace(small, d_model=1024)
    assert estimated_memory(large, large.validate()) > 2 * estimated_memory(small, small.validate())
    assert estimated_memory(large, large.validate()) < TRAIN_MEMORY_LIMIT


def _set_group(state, key, value):
    state["optimizer"]["param_groups"][0][key] = value


def _first_weight(state):
    return next(iter(state["model"].values()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["config"].update(d_model=10**9), r"d_model must be at most 65,536"),
        (lambda s: s["config"].update(d_model=8192, heads=2), r"this run would need about .* GiB of memory"),
        (lambda s: _set_group(s, "lr", "abc"), r"optimizer.param_groups\[0\].lr must be a finite number, got 'abc'"),
        (lambda s: _set_group(s, "lr", math.nan), r"optimizer.param_groups\[0\].lr must be a finite number, got nan"),
        (lambda s: _set_group(s, "lr", -1.0), r"optimizer.param_groups\[0\].lr must be >= 0"),
        (lambda s: _set_group(s, "betas", "x"), r"optimizer.param_groups\[0\].betas must be a list of 2"),
        (lambda s: _set_group(s, "amsgrad", "yes"), r"optimizer.param_groups\[0\].amsgrad must be true, false or null"),
        (lambda s: _set_group(s, "colour", 1), r"optimizer.param_groups\[0\] has unknown fields \['colour'\]"),
        (
            lambda s: s["optimizer"]["param_groups"][0].pop("lr"),
            r"optimizer.param_groups\[0\] lacks the fields \['lr'\]",
        ),
        (lambda s: _set_group(s, "params", [0]), r"optimizer.param_groups\[0\].params must be a list of"),
        (lambda s: s["optimizer"].update(state="nope"), r"optimizer.state must be a dict, got 'nope'"),
        (lambda s: s["optimizer"]["state"].update({999: {}}), r"optimizer.state\[999\]: not the index of one of"),
        (
            lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)),
            r"optimizer.state\[0\].exp_avg must be a torch.float32 tensor of shape",
        ),
        (
            lambda s: s["optimizer"]["state"][0]["exp_avg_sq"].fill_(math.nan),
            r"optimizer.state\[0\].exp_avg_sq holds values that are not finite",
        ),
        (lambda s: s["scheduler"].update(last_epoch="x"), r"scheduler.last_epoch must be an integer, got 'x'"),
        (lambda s: s["scheduler"].update(last_epoch=3), r"scheduler.last_epoch must be the step 5"),
        (lambda s: s["scheduler"].update(base_lrs=[math.inf]), r"scheduler.base_lrs\[0\] must be a finite number"),
        (lambda s: _first_weight(s).fill_(math.nan), r"model\..* holds values that are not finite"),
        (lambda s: s.update(seconds=math.nan), r"seconds must be a finite number"),
        (lambda s: s.update(seconds=-5.0), r"seconds must be a finite number >= 0"),
        (lambda s: s["losses"].fill_(math.inf), r"losses must be finite numbers"),
        (lambda s: s["rng"].update(cuda="x"), r"rng.cuda must be a generator state"),
    ],
)
def test_crafted_training_state_with_a_valid_checksum_is_a_clear_error(tmp_path, change, message):
    run(TINY, tmp_path, stop_after=5, progress=False)
    path = tmp_path / CHECKPOINT_NAME
    state = load_checkpoint(path)
    change(state)
    before = save_checkpoint(state, path).read_bytes()
    with pytest.raises(ValueError, match=message):
        run(TINY, tmp_path, resume=True, progress=False)
    assert path.read_bytes() == before  # the checkpoint is left as it was


def test_an_untouched_checkpoint_still_resumes(tmp_path):
    run(TINY, tmp_path, stop_after=5, progress=False)
    result = run(TINY, tmp_path, resume=True, progress=False)
    assert result.finished and result.step == TINY.steps
    json.loads((tmp_path / "metrics.json").read_text())


def test_a_run_that_diverges_writes_valid_json(tmp_path):
    # Before: NaN losses went into metrics.json as NaN, which JSON readers refuse.
    run(dataclasses.replace(TINY, lr=1e30, clip=1e30), tmp_path, progress=False)

    def refuse(constant):
        raise ValueError(f"metrics.json holds {constant}, which is not JSON")

    metrics = json.loads((tmp_path / "metrics.json").read_text(), parse_constant=refuse)
    assert metrics["train"]["final_loss"] is None
    # Its weights are NaN, so it is not evaluated (generation refuses logits that are not
    # finite), and the metrics say why.
    assert metrics["diverged"] is True and metrics["held_out"] is None and metrics["example"] is None


@pytest.mark.slow
def test_fuzzed_training_checkpoints_resume_or_give_a_clear_error_under_a_memory_limit():
    """Hypothesis tampers with every field of a tiny training checkpoint and re-saves it
    with a recomputed checksum, in a subprocess limited to 3 GiB of address space (see
    tests/train/fuzz_resume.py): every case resumes and trains a step, or raises a
    ValueError. Never a raw exception or an allocation past the limit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.train.fuzz_resume"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "fuzzed" in done.stdout


def test_a_disk_that_fills_while_saving_is_a_clear_error_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, capsys
):
    # Before: torch.save's RuntimeError escaped the OSError handling: a traceback.
    from attnkit.train import checkpoint

    real_save = torch.save
    saves = []

    def filling_save(obj, f):
        saves.append(1)
        if len(saves) > 1:
            f.write(b"half")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file")
        real_save(obj, f)

    monkeypatch.setattr(checkpoint.torch, "save", filling_save)
    argv = ["train", "--task", "reverse", "--out", str(tmp_path), *TINY_TRAIN_ARGS, "--steps", "10"]
    code = main([*argv, "--checkpoint-every", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.startswith("attnkit: error: cannot write the checkpoint") and "PytorchStreamWriter failed" in err
    assert "the previous checkpoint in" in err and "is intact" in err
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["step"] == 5
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))  # no temporary file left


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path):
    # Before: two runs started together into one folder both exited 0; one's files were lost.
    from attnkit.train.folder_lock import folder_lock

    tmp_path.mkdir(exist_ok=True)
    with folder_lock(tmp_path):
        with pytest.raises(ValueError, match=rf"another attnkit train run \(process {os.getpid()}\) is writing into"):
            run(TINY, tmp_path, progress=False)
        assert not (tmp_path / CHECKPOINT_NAME).exists()
    run(TINY, tmp_path, stop_after=5, progress=False)  # free again once the first run is done
    with folder_lock(tmp_path):  # and the run released it
        pass


@pytest.mark.slow
def test_two_runs_started_together_do_not_both_write(tmp_path):
    argv = [sys.executable, "-m", "attnkit.cli", "train", "--task", "reverse", "--out", str(tmp_path)]
    argv += [*TINY_TRAIN_ARGS, "--steps", "40"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    runs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    for p in runs:
        p.stdout.close()
        p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "another attnkit train run" in refused or "already holds a checkpoint.pt" in refused, refused
