"""Data-parallel training on gloo processes: the loss curve of 2 ranks equals one process's
over 100 steps, rank 0 writes the checkpoint, and a run resumes with another number of
ranks (the checkpoint does not depend on how many wrote it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.train import TrainConfig, load_checkpoint, run
from tests.distributed.processes import run_ranks

# Several processes each (torchrun-style ranks): seconds per test, left out of make test-fast.
pytestmark = pytest.mark.slow

CONFIG = TrainConfig(
    task="reverse",
    length=6,
    symbols=8,
    layers=1,
    d_model=32,
    heads=2,
    ff=64,
    steps=100,
    batch_size=16,
    warmup=10,
    eval_size=20,
    checkpoint_every=40,
    seed=3,
)
RELATIVE_TOLERANCE = 1e-4


def _train_on_ranks(rank: int, world: int, out_dir: str, stop_after: int | None, resume: bool) -> None:
    import attnkit.distributed as ad

    torch.set_num_threads(1)
    result = ad.train(CONFIG, out_dir, ad.init(), resume=resume, stop_after=stop_after, progress=False)
    assert (result.metrics is not None) == (rank == 0 and result.finished), (rank, result)


def _losses(out_dir: Path) -> torch.Tensor:
    return load_checkpoint(out_dir / "checkpoint.pt")["losses"]


def _relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(((a - b).abs() / b.abs()).max())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one")
    torch.set_num_threads(1)
    run(CONFIG, out, progress=False)
    return out


@pytest.mark.timeout(180)
def test_two_ranks_train_the_loss_curve_of_one_process(one_process, tmp_path):
    run_ranks(_train_on_ranks, 2, str(tmp_path), None, False, timeout=150)
    assert _relative_difference(_losses(tmp_path), _losses(one_process)) <= RELATIVE_TOLERANCE
    # Rank 0 wrote the results, and no temporary file is left beside the checkpoint.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in one_process.iterdir())


@pytest.mark.timeout(180)
def test_a_run_resumes_with_another_number_of_ranks(one_process, tmp_path):
    # One process stops at step 50; 3 ranks (rows 6, 5, 5 of each batch of 16) finish it.
    assert not run(CONFIG, tmp_path, stop_after=50, progress=False).finished
    run_ranks(_train_on_ranks, 3, str(tmp_path), None, True, timeout=150)
    assert _relative_difference(_losses(tmp_path), _losses(one_process)) <= RELATIVE_TOLERANCE
