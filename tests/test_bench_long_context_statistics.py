"""``bench_long_context.py --only statistics`` without a GPU: a dry run on the CPU with a tiny
checkpoint (the same code a CUDA run takes, on the torch engine), what it does where there is
no CUDA, and the lengths it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_long_context


def _main(tmp_path, *argv: str) -> None:
    common = ["--only", "statistics", "--shape", "tiny", "--checkpoint", str(tmp_path / "checkpoint")]
    bench_long_context.main([*common, "--out", str(tmp_path / "out"), *argv])


def test_a_dry_run_on_the_cpu_times_the_forward_and_the_inspection(tmp_path, capsys):
    _main(tmp_path, "--device", "cpu", "--lengths", "48,64")
    data = json.loads((tmp_path / "out" / "long_context_statistics.json").read_text())
    assert data["engine"] == "torch" and data["device"] == "cpu" and data["shape"] == "tiny"
    assert [row["tokens"] for row in data["rows"]] == [48, 64]
    for row in data["rows"]:
        assert row["forward_seconds"] > 0 and row["inspection_seconds"] > 0 and row["torch_engine_seconds"] > 0
        assert row["statistics_ratio"] == pytest.approx(row["statistics_seconds"] / row["forward_seconds"])
    report = (tmp_path / "out" / "long_context_statistics.md").read_text()
    assert report.startswith("## Long-context statistics on cpu (tiny, bfloat16, torch engine)")
    assert "| 64 | " in report
    # The checkpoint is written once and reused; its tokenizer reads the retrieval probe's texts.
    from attnkit import models
    from attnkit.inspect.retrieval_heads import needle_probe

    model = models.load(tmp_path / "checkpoint")
    probe = needle_probe(model, length=200)
    assert 0 not in probe.ids.tolist()  # no unknown word
    assert '{"tokens": 64' in capsys.readouterr().out


def test_without_cuda_it_measures_nothing_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _main(tmp_path, "--device", "cuda")
    assert "no CUDA device here; nothing measured" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_lengths_past_the_checkpoints_positions_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="--lengths: 8192 tokens are more than the 4096 positions of --shape tiny"):
        _main(tmp_path, "--device", "cpu", "--lengths", "8192")
    assert not list(tmp_path.iterdir())
