"""benchmarks/bench_tutorial_recipe.py at a tiny size: its arguments are checked, every
contender runs in its own process and reports time and peak memory, a configuration that
would not fit the memory available is skipped, and the results are written where asked.
(The full TinyLlama-shaped configuration needs about 18 GB and is run by hand.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_tutorial_recipe as bench

SCRIPT = Path(bench.__file__)
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "100"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "7,0"], "--tokens must be at least 1"),
        (["--tokens", "seven"], "--tokens must be whole numbers separated by commas, got 'seven'"),
        (["--dtypes", "float32,float64"], "--dtypes must be of float32, bfloat16, got float64"),
        (["--hidden", "100", "--heads", "3"], "--hidden must be a multiple of --heads"),
        ([*TINY, "--tokens", "100"], "--tokens must stay below --vocab (100)"),
    ],
)
def test_arguments_are_checked_before_anything_runs(args, message):
    done = _run(args)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.slow
def test_a_tiny_configuration_runs_every_contender_in_its_own_process(tmp_path):
    out, cache = tmp_path / "results", tmp_path / "cache"
    done = _run([*TINY, "--tokens", "7", "--dtypes", "float32", "--cache", str(cache), "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((out / "tutorial_recipe.json").read_text())
    (row,) = data["rows"]
    assert (row["dtype"], row["tokens"]) == ("float32", 7)
    assert sorted(row["contenders"]) == sorted(bench.CONTENDERS)
    for cell in row["contenders"].values():
        assert cell["tokens"] == 7 and cell["peak_bytes"] > 0 and cell["first_s"] > 0 and cell["warm_s"] > 0
    assert row["attnkit_time_ratio"] > 0 and row["attnkit_memory_ratio"] > 0
    table = (out / "tutorial_recipe.md").read_text()
    assert table.startswith("## The tutorial's recipe") and "| float32 | 7 |" in table
    (folder,) = cache.iterdir()
    assert json.loads((folder / "written.json").read_text())["layers"] == 2


@pytest.mark.slow
def test_a_configuration_larger_than_the_free_memory_is_skipped(tmp_path, monkeypatch):
    args = bench.arguments().parse_args([*TINY, "--tokens", "7", "--dtypes", "float32", "--cache", str(tmp_path)])
    bench._check(bench.arguments(), args)
    monkeypatch.setattr(bench, "available_bytes", lambda: 10**6)
    monkeypatch.setattr(bench, "run_child", lambda *a: pytest.fail("nothing should run"))
    (row,) = bench.measure(args, lambda text: None)
    assert all(cell["skipped"].startswith("needs about 1.1 GB, 0.0 GB free") for cell in row["contenders"].values())
    assert "attnkit_time_ratio" not in row
    assert "| skipped | needs about" in bench.markdown(args, [row])
