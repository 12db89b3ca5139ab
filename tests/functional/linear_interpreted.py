"""The Triton kernels of ``linear_attention(engine="triton")`` on CPU tensors, through Triton's
interpreter, against the float64 eager engine: outputs, gradients and the final state.

Run by ``test_linear_fused.py`` in a process of its own with ``TRITON_INTERPRET=1`` (Triton
reads it when it is first imported); its name keeps the main test run from collecting it.
Float32 only: Triton's interpreter multiplies bfloat16 operands of ``tl.dot`` as their raw
16-bit patterns, so the half-precision path is checked by the PyTorch twin and on a GPU.
Tolerance: 1e-5 relative to the largest reference value, as ``bench_gpu.py --check``.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnkit.functional import favor_projection, linear_attention, linear_attention_step

TOLERANCE = 1e-5
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="runs in its own process under TRITON_INTERPRET=1"
)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _inputs(b, h, h_kv, s_q, s_k, d, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64),
        torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64),
        torch.randn(b, h_kv, s_k, d_v, generator=g, dtype=torch.float64),
    )


def _check(inputs, **kw):
    """The triton engine in float32 against the eager engine in float64: outputs, final state
    (``kv`` and ``z``, in the same scale) and the gradients of q, k, v through both."""
    ref_in = [x.clone().requires_grad_() for x in inputs]
    got_in = [x.float().requires_grad_() for x in inputs]
    ref, ref_state = linear_attention(*ref_in, engine="eager", return_state=True, **kw)
    got, got_state = linear_attention(*got_in, engine="triton", return_state=True, **kw)
    assert got.dtype == torch.float32 and got_state.length == ref_state.length
    errors = {
        "log_shift": (got_state.log_shift.double() - ref_state.log_shift).abs().max().item(),
        "out": _relative(got, ref),
        "kv": _relative(got_state.kv, ref_state.kv),
        "z": _relative(got_state.z, ref_state.z),
    }
    g = torch.Generator().manual_seed(9)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (ref, ref_state.kv, ref_state.z)]

    def loss(out, state):
        return sum((t.double() * w).sum() for t, w in zip((out, state.kv, state.z), weights))

    ref_g = torch.autograd.grad(loss(ref, ref_state), ref_in)
    got_g = torch.autograd.grad(loss(got, got_state), got_in)
    errors.update({f"d{n}": _relative(a, r) for n, a, r in zip("qkv", got_g, ref_g)})
    assert max(errors.values()) <= TOLERANCE, errors
    return got, got_state


def test_elu_grouped_heads_ragged_length():
    _check(_inputs(2, 4, 2, 50, 50, 8, 8, seed=0), feature_map="elu", causal=True, chunk_size=16)


def test_favor_with_eps_from_a_state_with_fewer_queries_than_keys():
    q, k, v = _inputs(1, 2, 1, 20, 45, 8, 16, seed=1)
    omega = favor_projection(8, 16, seed=3, dtype=torch.float64)
    prompt = linear_attention(
        q[:, :, :5], 2 * k[:, :, :5], v[:, :, :5], feature_map="favor", projection=omega, causal=True, return_state=True
    )[1]
    kw = dict(feature_map="favor", projection=omega, causal=True, eps=1e-3, chunk_size=16)
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    got_in = [x.float().requires_grad_() for x in (q, k, v)]
    ref = linear_attention(*ref_in, engine="eager", state=prompt, **kw)
    got = linear_attention(*got_in, engine="triton", state=prompt, **kw)
    assert _relative(got, ref) <= TOLERANCE
    r = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for a, b in zip(torch.autograd.grad((got * r).sum(), got_in), torch.autograd.grad((ref * r).sum(), ref_in)):
        assert _relative(a, b) <= TOLERANCE
    _check((q, k, v), feature_map="favor", projection=omega, causal=True, eps=1e-3, chunk_size=16)


def test_relu_and_a_callable_with_more_queries_than_keys():
    inputs = _inputs(1, 3, 3, 40, 23, 16, 5, seed=2)
    _check(inputs, feature_map="relu", causal=True, chunk_size=16)
    _check(inputs, feature_map=lambda x: x.square(), causal=True, chunk_size=32)


def test_the_kernels_final_state_continues_in_single_steps():
    q, k, v = _inputs(1, 2, 2, 33, 33, 8, 8, seed=3)
    full = linear_attention(q, k, v, causal=True, engine="eager")
    _, state = linear_attention(
        q[:, :, :30].float(),
        k[:, :, :30].float(),
        v[:, :, :30].float(),
        causal=True,
        engine="triton",
        return_state=True,
    )
    for t in range(30, 33):
        row, state = linear_attention_step(
            q[:, :, t : t + 1].float(), k[:, :, t : t + 1].float(), v[:, :, t : t + 1].float(), state
        )
        assert _relative(row, full[:, :, t : t + 1]) <= TOLERANCE


def test_no_query_gives_an_empty_output_and_the_keys_state():
    q, k, v = _inputs(1, 2, 2, 0, 7, 8, 8, seed=4)
    want = linear_attention(q, k, v, causal=True, engine="eager", return_state=True)[1]
    out, state = linear_attention(q.float(), k.float(), v.float(), causal=True, engine="triton", return_state=True)
    assert out.shape == (1, 2, 0, 8) and state.length == 7
    assert _relative(state.kv, want.kv) <= TOLERANCE and _relative(state.z, want.z) <= TOLERANCE


def test_the_launch_settings_sweep_dry_run(tmp_path):
    from benchmarks import tune_linear_kernel

    data = tune_linear_kernel.main(["--quick", "--device", "cpu", "--dtypes", "fp32", "--out", str(tmp_path)])
    first, second = data["sweep"]["fp32"]
    assert first["default"] and not second["default"]
    assert {k: first[k] for k in ("chunk", "num_warps", "num_stages", "programs")} == (
        tune_linear_kernel.default_setting(torch.float32)
    )
    assert all(row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0 and "error" not in row for row in (first, second))
    assert second["diff"] <= TOLERANCE  # another launch setting computes the same output
    report = (tmp_path / "linear_tune.md").read_text()
    assert "fp32, s=64, h=1, d=16:" in report and report.count("| yes |") == 1
