"""The training loop: it learns, the same seed gives the same numbers, a run stopped and
resumed equals one that was not, and bad options are clear errors."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from attnkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint
from attnkit.train.loop import TrainConfig, alignment_fractions, check_resumable, lr_factor, run, saved_config

# Tiny, with dropout so that resuming must restore the dropout RNG too.
TINY = TrainConfig(
    task="reverse",
    length=5,
    symbols=6,
    d_model=16,
    heads=2,
    layers=1,
    ff=32,
    dropout=0.1,
    steps=24,
    batch_size=8,
    warmup=4,
    eval_size=20,
    checkpoint_every=5,
    seed=3,
)


def without_time(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "time"}


@pytest.mark.slow
def test_a_tiny_model_learns_to_copy(tmp_path) -> None:
    config = TrainConfig(
        task="copy",
        length=6,
        symbols=8,
        d_model=32,
        heads=2,
        layers=2,
        ff=64,
        steps=200,
        batch_size=64,
        lr=3e-3,
        warmup=20,
        eval_size=200,
        checkpoint_every=200,
    )
    result = run(config, tmp_path, progress=False)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert result.finished and metrics == result.metrics
    assert metrics["train"]["final_loss"] < 0.1 * metrics["train"]["first_loss"]
    assert metrics["held_out"]["exact_match"] >= 0.9  # chance is 8^-6
    # Copying is read off the diagonal by a cross-attention head.
    assert metrics["alignment"]["pattern"] == "diagonal" and metrics["alignment"]["best"]["fraction"] > 0.9
    assert (tmp_path / "cross_attention.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_same_seed_same_result_and_resume_equals_uninterrupted(tmp_path) -> None:
    straight = run(TINY, tmp_path / "a", progress=False)
    again = run(TINY, tmp_path / "b", progress=False)
    assert without_time(straight.metrics) == without_time(again.metrics)

    stopped = run(TINY, tmp_path / "c", stop_after=12, progress=False)
    assert not stopped.finished and stopped.step == 12 and stopped.metrics is None
    assert load_checkpoint(tmp_path / "c" / CHECKPOINT_NAME)["step"] == 12
    resumed = run(TINY, tmp_path / "c", resume=True, progress=False)
    assert resumed.finished and without_time(resumed.metrics) == without_time(straight.metrics)
    a = load_checkpoint(tmp_path / "a" / CHECKPOINT_NAME)
    c = load_checkpoint(tmp_path / "c" / CHECKPOINT_NAME)
    assert all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
    assert torch.equal(a["losses"], c["losses"]) and len(a["losses"]) == TINY.steps

    other_seed = run(dataclasses.replace(TINY, seed=4), tmp_path / "d", progress=False)
    assert other_seed.metrics["train"] != straight.metrics["train"]


@pytest.mark.slow
def test_reverse_reports_every_heads_anti_diagonal_fraction(tmp_path) -> None:
    metrics = run(dataclasses.replace(TINY, layers=2), tmp_path, progress=False).metrics
    alignment = metrics["alignment"]
    assert alignment["pattern"] == "anti-diagonal"
    assert len(alignment["fractions"]) == 2 and all(len(row) == 2 for row in alignment["fractions"])
    best = alignment["best"]
    assert best["fraction"] == max(max(row) for row in alignment["fractions"])
    assert alignment["fractions"][best["layer"]][best["head"]] == best["fraction"]
    assert metrics["example"]["heatmap"] == "cross_attention.png"
    assert len(metrics["example"]["input"]) == 5 and len(metrics["example"]["prediction"]) == 6


def test_addition_draws_decoder_self_attention(tmp_path) -> None:
    config = dataclasses.replace(TINY, task="addition", digits=2, steps=3)
    metrics = run(config, tmp_path, progress=False).metrics
    assert metrics["model"]["kind"] == "decoder-only" and "alignment" not in metrics
    assert metrics["example"]["heatmap"] == "self_attention.png" and (tmp_path / "self_attention.png").is_file()


def test_alignment_fractions_count_argmax_on_the_expected_key() -> None:
    anti = torch.eye(4).flip(1)  # [s_q, s_k]: query i attends to key 3 - i
    weights = torch.stack([anti, torch.eye(4)])[None, None].expand(2, 3, 2, 4, 4)  # [L, n, h, s_q, s_k]
    fractions = alignment_fractions(weights, torch.tensor([3, 2, 1, 0]))
    assert fractions.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    # Only the first 3 query rows are counted; the identity hits the anti-diagonal on none of them.
    assert alignment_fractions(torch.eye(4)[None, None, None], torch.tensor([3, 2, 1])).tolist() == [[0.0]]


def test_task_defaults() -> None:
    assert TrainConfig.for_task("addition").steps == 8000 and TrainConfig.for_task("reverse").steps == 1000
    assert TrainConfig.for_task("addition", steps=5, lr=0.1) == TrainConfig(task="addition", steps=5, lr=0.1)


def test_schedule_warms_up_then_decays_to_zero() -> None:
    factors = [lr_factor(s, warmup=10, steps=110) for s in range(110)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == 1.0 and factors[10] == 1.0
    assert factors[60] == pytest.approx(0.5) and factors[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.99)))
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(task="rotate"), "unknown task 'rotate'"),
        (dict(steps=0), "steps must be >= 1, got 0"),
        (dict(batch_size=-1), "batch_size must be >= 1, got -1"),
        (dict(d_model=30, heads=4), "d_model must be divisible by heads, got d_model=30 and heads=4"),
        (dict(d_model=15, heads=1), "d_model must be even"),
        (dict(lr=0.0), "lr must be > 0"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(length=3, symbols=4), "has only 64 distinct inputs"),
        (dict(device="tpu9"), "unknown device 'tpu9'"),
    ],
)
def test_bad_options_are_clear_errors(tmp_path, change, message) -> None:
    with pytest.raises(ValueError, match=message):
        run(dataclasses.replace(TINY, **change), tmp_path, progress=False)


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        run(dataclasses.replace(TINY, device="cuda"), tmp_path, progress=False)


def test_resume_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="nothing to resume: no checkpoint.pt in"):
        run(TINY, tmp_path, resume=True, progress=False)
    run(TINY, tmp_path, stop_after=5, progress=False)
    assert saved_config(tmp_path) == TINY
    with pytest.raises(ValueError, match="already holds a checkpoint.pt; resume it"):
        run(TINY, tmp_path, progress=False)
    differences = r"another config \(steps: checkpoint 24, asked 48; lr: checkpoint 0.003, asked 0.002\)"
    with pytest.raises(ValueError, match=differences):
        run(dataclasses.replace(TINY, lr=2e-3, steps=48), tmp_path, resume=True, progress=False)
    # Device, evaluation size and checkpoint interval do not change the training.
    check_resumable(TINY, dataclasses.replace(TINY, eval_size=5, checkpoint_every=1, device="cuda"))
    (tmp_path / "sub").write_text("a file where a directory should be")
    with pytest.raises(ValueError, match="cannot write to output directory"):
        run(TINY, tmp_path / "sub" / "out", progress=False)


@pytest.mark.slow
def test_the_python_api_trains_on_as_many_threads_as_the_command(tmp_path) -> None:
    from attnkit.cli import build_parser
    from attnkit.train.loop import DEFAULT_THREADS

    assert build_parser().parse_args(["train", "--task", "copy", "--out", str(tmp_path)]).threads == DEFAULT_THREADS
    before = torch.get_num_threads()
    result = run(dataclasses.replace(TINY, steps=2, eval_size=4), tmp_path / "default", progress=False)
    assert result.metrics["environment"]["threads"] == DEFAULT_THREADS == 1
    result = run(dataclasses.replace(TINY, steps=2, eval_size=4), tmp_path / "two", progress=False, threads=2)
    assert result.metrics["environment"]["threads"] == 2
    assert torch.get_num_threads() == before  # restored after the run
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        run(TINY, tmp_path / "zero", progress=False, threads=0)
