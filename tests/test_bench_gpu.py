"""benchmarks/bench_gpu.py without a GPU: what it does where there is no CUDA, its arguments,
and a small dry run of the linear-attention rows and checks on the CPU (the same code a GPU
run takes, on tiny shapes)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_gpu


def test_without_cuda_it_measures_nothing_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu.main(["--out", str(tmp_path)]) == {}
    assert "no CUDA device here; nothing measured" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtypes", "fp16"], "--dtypes takes bf16, fp32, got fp16"),
        (["--lengths", "64k"], "--lengths takes comma-separated integers, got '64k'"),
        (["--only", "flex"], "invalid choice: 'flex'"),
        (["--linear-engine", "fla"], "invalid choice: 'fla'"),
    ],
)
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_gpu.main(["--device", "cpu", *argv])
    assert message in capsys.readouterr().err


def test_least_traffic_of_a_call():
    # b=1, h=8, s=65536, d=64 in bfloat16: q, k, v and the output are 268 MB.
    assert bench_gpu.linear_io_bytes(1, 8, 65536, 64, 2, backward=False) == 268_435_456
    assert bench_gpu.linear_io_bytes(1, 8, 65536, 64, 2, backward=True) == 3 * 268_435_456
    assert bench_gpu.nominal_bandwidth("NVIDIA H200") == 4.8e12
    assert bench_gpu.nominal_bandwidth("cpu") is None


def test_linear_rows_and_checks_dry_run_on_the_cpu(tmp_path):
    result = bench_gpu.main(
        ["--only", "linear", "--quick", "--device", "cpu", "--check", "--dtypes", "fp32", "--lengths", "256"]
        + ["--out", str(tmp_path)]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_linear.json", "gpu_linear.md"]
    linear = result["linear"]
    checks = linear["check"]["fp32"]
    assert len(checks) == 5 and all(row["ok"] for row in checks), checks
    assert all(max(row[key] for key in bench_gpu.LINEAR_CHECKED) <= 1e-5 for row in checks)
    (row,) = linear["linear"]
    assert row["s"] == 256 and row["pass"] == "fwd"
    assert row["attnkit_ms"] > 0 and row["sdpa_is_causal_ms"] > 0 and 0 < row["fraction_of_copy"]
    assert ("fla_chunk_ms" in row) != ("fla_missing" in row)
    saved = json.loads((tmp_path / "gpu_linear.json").read_text())
    assert saved["linear"][0]["s"] == 256
    report = (tmp_path / "gpu_linear.md").read_text()
    assert "| 256 | fp32 | fwd |" in report and "| elu, grouped heads | fp32 |" in report


def test_an_unmeasured_report_says_so():
    report = bench_gpu.linear_markdown({"device": None, "linear": [], "check": {}})
    assert "Not measured yet: no GPU has run it" in report and "Device:" not in report


def test_alternating_times_run_the_contenders_in_turn():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = bench_gpu.alternating_gpu_times(fns, torch.device("cpu"), rounds=4, min_batch_s=0.0)
    assert set(times) == {"a", "b", "c"} and all(t > 0 for t in times.values())
    # One warm-up call each, then one batch of one call per contender per round, the order
    # reversed every other round.
    assert calls == ["a", "b", "c"] + ["a", "b", "c", "c", "b", "a"] * 2


def test_the_local_report_gives_the_ratio_to_the_hand_written_call():
    row = {"dtype": "bf16", "pass": "fwd+bwd", "s": 16384, "attnkit_ms": 0.5, "flex_hand_ms": 0.55}
    report = bench_gpu.local_markdown({"device": "GPU", "shape": {"h": 16, "s": 16384, "d": 64}, "rows": [row]})
    assert "| bf16 | fwd+bwd | 0.500 | 0.550 | – | – | 1.10× |" in report
    assert "Not measured yet" in bench_gpu.local_markdown({"shape": {"h": 16, "s": 16384, "d": 64}, "rows": []})
