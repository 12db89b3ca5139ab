"""The fused Triton kernel of the long-context summaries: which engine runs a call, the tiles
of chosen rows, the torch engine's block sizes per device, and the kernel itself through
Triton's interpreter in a separate process (``tests/inspect/long_context_interpreted.py``: the
interpreter is chosen when Triton is first imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnkit.inspect import long_context
from attnkit.inspect.long_context import (
    DEFAULT_BLOCK_BUDGET,
    GPU_BLOCK_BUDGET,
    GPU_MAX_BLOCK_ROWS,
    MAX_BLOCK_ROWS,
    LayerScoring,
    block_limits,
    summarize_layer,
    summary_engine,
)

ROOT = Path(__file__).resolve().parents[2]
INTERPRETED = "tests/inspect/long_context_interpreted.py"
# The slow interpreted tests: tiny models (transformers writes them first) and the GPU
# benchmark's own check of the kernel.
SLOW_TESTS = "whole_models or local_statistics or gpu_benchmark"


def test_auto_runs_the_torch_engine_on_the_cpu_and_triton_is_refused_there(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(2, 8, 16)
    assert summary_engine("auto", q) == "torch"
    assert summary_engine("torch", q) == "torch"
    with pytest.raises(ValueError, match=r"engine='triton' runs on CUDA tensors .* got tensors on cpu"):
        summarize_layer(q, q, LayerScoring(scale=0.25), engine="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(
        ValueError, match="engine='triton' takes float32, float16 or bfloat16 tensors, got torch.float64"
    ):
        summary_engine("triton", q.double())
    with pytest.raises(ValueError, match="engine must be one of auto, torch, triton, got 'cuda'"):
        summary_engine("cuda", q)


def test_auto_picks_the_kernel_for_cuda_tensors_it_can_take():
    pytest.importorskip("triton")

    def on_cuda(dtype):  # what summary_engine reads of a tensor
        return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype)

    assert summary_engine("auto", on_cuda(torch.bfloat16)) == "triton"
    assert summary_engine("auto", on_cuda(torch.float32)) == "triton"
    assert summary_engine("auto", on_cuda(torch.float64)) == "torch"  # float64 stays on the torch engine


def test_block_sizes_fit_the_device(monkeypatch):
    assert block_limits(torch.device("cpu"), torch.float32) == (DEFAULT_BLOCK_BUDGET, MAX_BLOCK_ROWS)
    from attnkit.models.checkpoints import memory

    monkeypatch.setattr(memory, "available_memory", lambda device: (80 * 2**30, "free memory on cuda:0"))
    assert block_limits(torch.device("cuda", 0), torch.bfloat16) == (GPU_BLOCK_BUDGET, GPU_MAX_BLOCK_ROWS)
    # A card with little free memory gets smaller blocks: a quarter of it, in the dtype's bytes.
    monkeypatch.setattr(memory, "available_memory", lambda device: (2**30, "free memory on cuda:0"))
    assert block_limits(torch.device("cuda", 0), torch.float32)[0] == 2**30 // 16
    monkeypatch.setattr(memory, "available_memory", lambda device: (2**20, "free memory on cuda:0"))
    assert block_limits(torch.device("cuda", 0), torch.float32)[0] == DEFAULT_BLOCK_BUDGET


def test_row_tiles_cut_runs_of_consecutive_rows():
    pytest.importorskip("triton")
    from attnkit.inspect.long_context_triton import row_tiles

    rows = torch.tensor([0, 1, 2, 3, 4, 9, 10, 20, 21, 22, 23, 24, 25])
    tiles = row_tiles(rows, block_rows=4)
    # (index among the rows, first position, rows), the last tiles first.
    assert tiles.tolist()[::-1] == [[0, 0, 4], [4, 4, 1], [5, 9, 2], [7, 20, 4], [11, 24, 2]]
    assert tiles.dtype == torch.int32
    assert row_tiles(torch.arange(130), 64).tolist()[::-1] == [[0, 0, 64], [64, 64, 64], [128, 128, 2]]


def test_summarize_layer_keeps_the_cpu_block_sizes(monkeypatch):
    seen = []
    original = long_context._summarize_in_blocks

    def spy(*args, block_rows, **kwargs):
        seen.append(block_rows)
        return original(*args, block_rows=block_rows, **kwargs)

    monkeypatch.setattr(long_context, "_summarize_in_blocks", spy)
    s, h = 2048, 4
    q = torch.randn(h, s, 16)
    summarize_layer(q, q[:1], LayerScoring(scale=0.25), statistics=("distance",), rows=range(s - 2, s))
    assert seen == [MAX_BLOCK_ROWS]  # 16 Mi scores over 4 heads and 2,048 keys: capped at 128 rows


def _interpreted(selection: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-x", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "-k", selection, INTERPRETED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_the_kernel_through_the_interpreter_on_random_queries_and_keys():
    pytest.importorskip("triton")
    done = _interpreted(f"not ({SLOW_TESTS})")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


@pytest.mark.slow
def test_the_kernel_through_the_interpreter_on_tiny_models_and_the_gpu_benchmarks_check():
    pytest.importorskip("triton")
    done = _interpreted(SLOW_TESTS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "\n4 passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


def _compile_for_sm90(dtype: str, **constants: object):
    """The kernel compiled ahead of time for an H100 (sm_90) by Triton's own compiler and
    ptxas, which run without a GPU: what a CUDA launch would compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnkit.inspect.long_context_triton import DEFAULT_LAUNCH, _statistics_kernel

    pointers = {"Q": f"*{dtype}", "K": f"*{dtype}", "HEADS": "*i32", "TILES": "*i32", "TOPI": "*i64"}
    block_rows, block_keys = DEFAULT_LAUNCH.block_rows, DEFAULT_LAUNCH.block_keys
    constexprs = {
        **constants,
        "TK": triton.next_power_of_2(max(constants["TOP_K"], 1)),
        "BM": block_rows,
        "BN": block_keys,
        "BD": 128,
        "W": triton.next_power_of_2(block_rows + block_keys - 1),
        "PREC": "tf32x3" if dtype == "fp32" else "tf32",
    }
    scalars = {"factor": "fp32", "softcap": "fp32"}
    signature = {
        name: "constexpr"
        if name in constexprs
        else pointers.get(name, "*fp32" if name.isupper() else scalars.get(name, "i32"))
        for name in _statistics_kernel.arg_names
    }
    options = {"num_warps": DEFAULT_LAUNCH.num_warps, "num_stages": DEFAULT_LAUNCH.num_stages}
    return triton.compile(
        ASTSource(_statistics_kernel, signature, constexprs=constexprs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "constants"),
    [
        ("bf16", dict(CAUSAL=True, SOFTCAP=False, TOP_K=8, SECOND=True, HISTOGRAM=True, MAP=False)),
        ("fp32", dict(CAUSAL=False, SOFTCAP=True, TOP_K=5, SECOND=True, HISTOGRAM=True, MAP=True)),
        ("fp16", dict(CAUSAL=True, SOFTCAP=False, TOP_K=1, SECOND=False, HISTOGRAM=False, MAP=False)),
    ],
)
def test_the_kernel_compiles_for_an_h100_without_one(dtype, constants, monkeypatch):
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter does not compile")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    compiled = _compile_for_sm90(dtype, **constants)
    assert compiled.asm["cubin"]  # ptxas assembled it
