"""benchmarks/bench_tutorial_recipe.py at a tiny size: its arguments are checked, every
contender runs in its own process and reports time and peak memory, a configuration that
would not fit the memory available is skipped, the results are written where asked (after
every contender, so a stopped run keeps what it measured), and ``--render`` rebuilds the
table from them.
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
        (["--only", "plain,eager"], "--only takes contenders of tutorial, attnkit, plain, got eager"),
        (["--rows", "5"], "--rows takes the query rows as A:B"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
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
        assert cell["first_cpu_s"] > 0 and cell["warm_cpu_s"] > 0
    assert data["complete"] and data["warm_runs"] == bench.WARM_RUNS
    assert sorted(bench.ratios(row)) == ["memory", "processor time", "time"]
    assert all(ratio > 0 for ratio in bench.ratios(row).values())
    table = (out / "tutorial_recipe.md").read_text()
    assert table.startswith("## The tutorial's recipe") and "| float32 | 7 |" in table
    assert "attnkit ÷ plain, processor time" in table and "Not measured" not in table
    (folder,) = cache.iterdir()
    assert json.loads((folder / "written.json").read_text())["layers"] == 2


@pytest.mark.slow
def test_a_configuration_larger_than_the_free_memory_is_skipped(tmp_path, monkeypatch):
    args = bench.arguments().parse_args([*TINY, "--tokens", "7", "--dtypes", "float32", "--cache", str(tmp_path)])
    bench._check(bench.arguments(), args)
    monkeypatch.setattr(bench, "available_bytes", lambda device="cpu": 10**6)
    monkeypatch.setattr(bench, "run_child", lambda *a: pytest.fail("nothing should run"))
    saved = []
    (row,) = bench.measure(args, lambda text: None, lambda rows: saved.append(len(rows[0]["contenders"])))
    assert all(cell["skipped"].startswith("needs about 1.1 GB, 0.0 GB free") for cell in row["contenders"].values())
    assert saved == [1, 2, 3]  # the results are saved after every contender
    assert bench.ratios(row) == {}
    assert "| skipped | needs about" in bench.markdown({"shape": bench.shape_of(args), "rows": [row]})


def _cell(seconds: float, processor: float, gigabytes: float) -> dict:
    return {
        "tokens": 7,
        "load_s": 1.0,
        "first_s": seconds,
        "warm_s": seconds,
        "first_cpu_s": processor,
        "warm_cpu_s": processor,
        "peak_bytes": int(gigabytes * 1e9),
        "threads": 2,
    }


def test_render_rebuilds_the_table_of_a_stopped_run_from_its_results(tmp_path):
    """A run stopped in its second row: --render tables what it measured, says what it did
    not, and compares bfloat16 with float32 by the plain forward's processor time."""
    rows = [
        {
            "dtype": "float32",
            "tokens": 7,
            "contenders": {
                "tutorial": _cell(1.3, 2.6, 4.6),
                "attnkit": _cell(1.2, 2.4, 4.7),
                "plain": _cell(1.25, 2.5, 4.6),
            },
        },
        {
            "dtype": "bfloat16",
            "tokens": 7,
            "contenders": {"tutorial": _cell(5.0, 8.0, 5.0), "plain": _cell(5.0, 10.0, 5.0)},
        },
    ]
    data = {
        "environment": {},
        "shape": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 100},
        "dtypes": ["float32", "bfloat16"],
        "tokens": [7, 50],
        "warm_runs": 5,
        "cpu_capability": "AVX2",
        "cores": 2,
        "complete": False,
        "load_average_1min": {"start": 3.0, "end": 4.5},
        "rows": rows,
    }
    (tmp_path / "tutorial_recipe.json").write_text(json.dumps(data))
    done = _run(["--render", "--out", str(tmp_path)])
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "tutorial_recipe.md").read_text()
    assert "| float32 | 7 | 1.300 | 4.60 | 1.200 | 4.70 | 1.250 | 4.60 | 0.96× | 0.96× | 1.02× |" in table
    assert "| bfloat16 | 7 | 5.000 | 5.00 | not run | not run | 5.000 | 5.00 | – | – | – |" in table
    assert "Not measured (the run was stopped before them): bfloat16 at 7 tokens (attnkit); " in table
    assert "float32 at 50 tokens; bfloat16 at 50 tokens." in table
    assert "1.0 at the start" not in table and "3.0 at the start of this run and 4.5 at its end" in table
    assert "tokens: the median of 5 more)" in table
    assert "the plain forward's processor time, bfloat16 ÷ float32: 4.0× at 7 tokens (rows measured" in table
    assert "`torch.backends.cpu.get_cpu_capability()`: AVX2)" in table
    assert "Targets: memory within 1.15× in every row measured; processor time within 1.1× in every row" in table


def test_render_without_results_is_refused(tmp_path):
    done = _run(["--render", "--out", str(tmp_path)])
    assert done.returncode == 2 and "--render needs the results file" in done.stderr


def _results(rows: list[dict], *, date: str, shape: dict | None = None) -> dict:
    return {
        "environment": {"date": date},
        "shape": shape or {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 100},
        "dtypes": ["float32", "bfloat16"],
        "tokens": [7, 50],
        "warm_runs": 5,
        "cpu_capability": "AVX2",
        "cores": 2,
        "complete": True,
        "load_average_1min": {"start": 1.0, "end": 2.0},
        "rows": rows,
    }


def _row(dtype_name: str, tokens: int, attnkit_seconds: float) -> dict:
    return {
        "dtype": dtype_name,
        "tokens": tokens,
        "contenders": {
            "tutorial": _cell(2.0, 2.0, 5.0),
            "attnkit": _cell(attnkit_seconds, attnkit_seconds, 4.0),
            "plain": _cell(1.0, 1.0, 4.0),
        },
    }


def test_render_joins_another_runs_rows_and_says_which(tmp_path):
    """--join adds the rows of another run (replacing the same dtype and length), keeps them
    in the results file, and the notes name that run."""
    mine = [_row("float32", 7, 1.0), _row("bfloat16", 7, 1.0), _row("float32", 50, 9.0)]
    (tmp_path / "tutorial_recipe.json").write_text(json.dumps(_results(mine, date="2026-01-01 10:00:00")))
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(_results([_row("bfloat16", 50, 1.1), _row("float32", 50, 1.05)], date="2026-01-02 11:00:00"))
    )
    done = _run(["--render", "--out", str(tmp_path), "--join", str(other)])
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "tutorial_recipe.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| float32") or line.startswith("| bfloat16")]
    assert [line.split(" | ")[:2] for line in lines] == [
        ["| float32", "7"],
        ["| float32", "50"],
        ["| bfloat16", "7"],
        ["| bfloat16", "50"],
    ]
    assert "| float32 | 50 | 2.000 | 5.00 | 1.050 |" in table
    assert (
        "Measured in another run (2026-01-02 11:00:00; load 1.0 at its start and 2.0 at its end): "
        "float32 at 50 tokens, bfloat16 at 50 tokens." in table
    )
    saved = json.loads((tmp_path / "tutorial_recipe.json").read_text())
    assert saved["environment"] == {"date": "2026-01-01 10:00:00"} and len(saved["rows"]) == 4
    assert saved["joined_runs"][0]["rows"] == [["float32", 50], ["bfloat16", 50]]


def test_join_refuses_another_shape_and_needs_render(tmp_path):
    (tmp_path / "tutorial_recipe.json").write_text(json.dumps(_results([_row("float32", 7, 1.0)], date="d")))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_results([_row("float32", 7, 1.0)], date="e", shape={"layers": 3})))
    done = _run(["--render", "--out", str(tmp_path), "--join", str(other)])
    assert done.returncode == 2 and "measured the shape {'layers': 3}" in done.stderr
    done = _run(["--out", str(tmp_path), "--join", str(other)])
    assert done.returncode == 2 and "--join adds the rows of another run" in done.stderr


@pytest.mark.slow
def test_a_dry_run_of_the_device_code_on_the_cpu_with_a_subset(tmp_path):
    """--quick --device cpu: the code a GPU run takes (the checkpoint written on the device,
    each contender loaded there, the memory beyond the weights), on a tiny shape; --only and
    --lengths pick a subset, --rows the rows of attnkit's map."""
    out, cache = tmp_path / "results", tmp_path / "cache"
    argv = ["--quick", "--device", "cpu", "--only", "attnkit,plain", "--lengths", "64", "--rows=-16:"]
    done = _run([*argv, "--cache", str(cache), "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads((out / "tutorial_recipe.json").read_text())["rows"]
    assert (row["dtype"], row["tokens"]) == ("float32", 64) and sorted(row["contenders"]) == ["attnkit", "plain"]
    ours = row["contenders"]["attnkit"]
    assert ours["rows"] == 16 and ours["beyond_weights_bytes"] >= 0 and ours["date"]
    assert row["contenders"]["plain"]["rows"] == 64
    (folder,) = cache.iterdir()
    assert json.loads((folder / "written.json").read_text()) == bench.SHAPES["tiny"]


def test_texts_longer_than_the_vocabulary_start_over():
    assert bench.text_of(5, 5) == "w1 w2 w3 w1 w2"


def _device_cell(seconds: float, gigabytes: float, rows: int, date: str = "2026-02-01") -> dict:
    return {
        "tokens": 8192,
        "rows": rows,
        "warm_s": seconds,
        "first_s": seconds,
        "beyond_weights_bytes": int(gigabytes * 1e9),
        "date": date,
    }


def _device_data(rows: list[dict]) -> dict:
    return {
        "device": "cuda",
        "card": "NVIDIA H200",
        "torch": "2.11.0",
        "shape": bench.SHAPES["tinyllama"],
        "warm_runs": bench.DEVICE_RUNS,
        "rows": rows,
    }


def test_the_gpu_table_gives_the_memory_beyond_the_floor_as_a_share_of_the_map():
    rows = [
        {
            "dtype": "bfloat16",
            "tokens": 8192,
            "contenders": {
                "tutorial": {"skipped": "needs about 125.0 GB (every layer's maps: 97.0 GB), 139.0 GB on the card"},
                "attnkit": _device_cell(0.066, 0.74 + 0.27, 8192),
                "plain": _device_cell(0.060, 0.74, 8192),
            },
        },
        {
            "dtype": "bfloat16",
            "tokens": 131072,
            "contenders": {
                "attnkit": _device_cell(3.0, 20.0, 4096, "2026-02-02"),
                "plain": _device_cell(2.0, 12.0, 131072),
            },
        },
    ]
    table = bench.markdown(_device_data(rows))
    assert table.startswith("## The tutorial's recipe on a GPU: NVIDIA H200 (bench_tutorial_recipe.py --device cuda)")
    assert "| bfloat16 | 8,192 | 0.27 | skipped | needs about 125.0 GB (every layer's maps: 97.0 GB)" in table
    assert "| 0.066 | 1.01 | 0.060 | 0.74 | 1.10× | 1.01× |" in table
    # 4,096 rows of 131,072 keys: 2.1 GB of map; 8 GB beyond the floor is 3.7 times that.
    assert "| bfloat16 | 131,072 | 2.15 | not run | not run | 3.000 | 20.00 | 2.000 | 12.00 | 1.50× | 3.73× |" in table
    assert "measured 2026-02-01 to 2026-02-02" in table
    assert "Targets: missed in bfloat16 at 131,072 tokens." in table
    assert "Rows of attnkit's map asked (--rows): 4,096 of 131,072 at 131,072 tokens." in table


def test_a_gpu_run_adds_its_cells_to_the_earlier_runs_rows():
    earlier = [{"dtype": "bfloat16", "tokens": 2048, "contenders": {"tutorial": {"x": 1}, "plain": {"x": 1}}}]
    new = [
        {"dtype": "bfloat16", "tokens": 2048, "contenders": {"plain": {"x": 2}, "attnkit": {"x": 2}}},
        {"dtype": "bfloat16", "tokens": 1024, "contenders": {"plain": {"x": 2}}},
    ]
    merged = bench.merged_rows(earlier, new)
    assert [row["tokens"] for row in merged] == [1024, 2048]
    assert merged[1]["contenders"] == {"tutorial": {"x": 1}, "plain": {"x": 2}, "attnkit": {"x": 2}}
    assert earlier[0]["contenders"] == {"tutorial": {"x": 1}, "plain": {"x": 1}}  # not changed in place


def test_the_cuda_memory_count_starts_after_the_weights(monkeypatch):
    from benchmarks.common import DeviceMemory

    allocated = {"now": 5 * 2**30, "peak": 9 * 2**30}
    monkeypatch.setattr("torch.cuda.synchronize", lambda device=None: None)
    monkeypatch.setattr(
        "torch.cuda.reset_peak_memory_stats", lambda device=None: allocated.update(peak=allocated["now"])
    )
    monkeypatch.setattr("torch.cuda.memory_allocated", lambda device=None: allocated["now"])
    monkeypatch.setattr("torch.cuda.max_memory_allocated", lambda device=None: allocated["peak"])
    memory = DeviceMemory("cuda")
    memory.begin()  # 5 GiB of weights
    allocated["peak"] = 7 * 2**30  # a pass took 2 GiB more at most
    assert memory.peak() == 2 * 2**30
