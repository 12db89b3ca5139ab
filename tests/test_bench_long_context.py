"""benchmarks/bench_long_context.py without a GPU: a dry run of the code a ``--device cuda``
run takes (a random checkpoint written on the device, each cell in its own process, the
memory beyond the loaded weights), on a tiny shape on the CPU, in two parts that join one
table; and the table of a GPU run names its card."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_long_context as bench


@pytest.mark.slow
def test_a_dry_run_in_two_parts_joins_one_table(tmp_path):
    out, cache = tmp_path / "results", tmp_path / "cache"
    common = ["--quick", "--device", "cpu", "--cache", str(cache), "--out", str(out)]
    bench.main([*common, "--only", "forward,recipe"])
    bench.main([*common, "--only", "summaries", "--lengths", "64"])
    data = json.loads((out / "bench_long_context_cpu_tiny.json").read_text())
    assert data["model"] == "tiny" and [row["tokens"] for row in data["rows"]] == [64, 128]
    short, longer = data["rows"]
    assert all(short[mode]["peak_growth_mib"] >= 0 for mode in bench.MODES)
    assert longer["summaries"] is None and longer["forward"] is not None and longer["recipe"] is not None
    table = (out / "bench_long_context_cpu_tiny.md").read_text()
    assert "| 128 | " in table and "| not run | – | – |" in table


def test_bad_modes_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--only", "maps"])
    assert "--only takes modes of forward, summaries, recipe, got 'maps'" in capsys.readouterr().err


def test_a_gpu_table_names_its_card():
    cell = {"seconds": 0.5, "peak_growth_mib": 300.0}
    row = {"tokens": 131072, "forward": cell, "summaries": None, "recipe": None, "recipe_weights_gib": 1408.0}
    text = bench.report("tinyllama", [{**row, "all_logits_gib": 15.6}], card="NVIDIA H100 80GB HBM3")
    assert text.startswith("## Long-context summaries on a GPU: NVIDIA H100 80GB HBM3 (tinyllama)")
    assert "`torch.cuda.max_memory_allocated`" in text
    assert "| 131,072 | 0.5 s, 300 MiB | not run | – | – | not run: its weights alone are 1,408.0 GiB |" in text
