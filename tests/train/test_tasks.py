"""Toy tasks: right answers, seeded streams, and held-out inputs that never occur in
training."""

from __future__ import annotations

import pytest
import torch

from attnkit.train.tasks import BOS, EOS, HELD_OUT_EVERY, TASKS, AdditionTask, held_out_side, make_task


def sample(task, n=64, seed=0, held_out=False):
    return task.sample(n, torch.Generator().manual_seed(seed), held_out=held_out)


def test_sequence_targets_are_the_answer_then_eos() -> None:
    for name, answer in [("copy", lambda x: x), ("reverse", lambda x: x.flip(1)), ("sort", lambda x: x.sort(1).values)]:
        task = make_task(name, length=7, symbols=5)
        batch = sample(task)
        assert batch.inputs.shape == (64, 7) and batch.targets.shape == (64, task.target_length) == (64, 8)
        assert torch.equal(batch.targets[:, :-1], answer(batch.inputs))
        assert (batch.targets[:, -1] == EOS).all()
        assert batch.inputs.min() >= 2 and batch.inputs.max() < 2 + 5  # symbols only, no BOS/EOS
    assert make_task("reverse").vocab[:3] == ["<s>", "</s>", "0"] and BOS == 0


def test_addition_writes_the_sum() -> None:
    task = make_task("addition", digits=3)
    batch = sample(task, n=200)
    assert batch.inputs.shape == (200, 8) and batch.targets.shape == (200, 5)
    for inputs, targets in zip(batch.inputs, batch.targets):
        text = "".join(task.tokens(inputs))
        a, b = text.rstrip("=").split("+")
        assert len(a) == len(b) == 3 and text.endswith("=")
        assert task.tokens(targets) == [*f"{int(a) + int(b):04d}", "</s>"]
    assert task.decoder_only and not make_task("sort").decoder_only


def test_same_generator_state_gives_the_same_examples() -> None:
    task = make_task("sort")
    a, b, c = sample(task, seed=1), sample(task, seed=1), sample(task, seed=2)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


@pytest.mark.slow
@pytest.mark.parametrize("task", [make_task("copy", length=2, symbols=32), AdditionTask(digits=2)])
def test_held_out_inputs_never_occur_in_training(task) -> None:
    # Small input spaces (1024 and 10^4 inputs): random training batches cover nearly
    # all training inputs, yet none is held out.
    train = {tuple(row.tolist()) for row in sample(task, n=20_000).inputs}
    held_out = {tuple(row.tolist()) for row in sample(task, n=2_000, seed=99, held_out=True).inputs}
    assert train.isdisjoint(held_out)
    assert len(held_out) > 0.5 * task.distinct_inputs / HELD_OUT_EVERY
    assert held_out_side(sample(task, held_out=True).inputs).all()


def test_alignments() -> None:
    assert make_task("reverse", length=4).aligned_keys().tolist() == [3, 2, 1, 0]
    assert make_task("copy", length=4).aligned_keys().tolist() == [0, 1, 2, 3]
    assert make_task("sort").aligned_keys() is None and make_task("addition").aligned_keys() is None
    assert make_task("reverse").alignment == "anti-diagonal"


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown task 'rotate'; expected one of copy, reverse, sort, addition"):
        make_task("rotate")
    with pytest.raises(ValueError, match="has only 81 distinct inputs; at least 1000"):
        make_task("copy", length=4, symbols=3)
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        make_task("reverse", length=0)
    with pytest.raises(ValueError, match="digits must be >= 1"):
        make_task("addition", digits=0)
    assert set(TASKS) == {"copy", "reverse", "sort", "addition"}
