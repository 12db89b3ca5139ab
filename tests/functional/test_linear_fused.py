"""The fused causal linear attention (the ``"triton"`` engine) and the state a call starts from
and returns.

Without a GPU: the fused algorithm with its hand-written backward pass, run by a PyTorch twin
of the kernels (``linear_twin.py``) against the float64 definition; the Triton kernels
themselves through Triton's interpreter, in a separate process (``linear_interpreted.py``:
the interpreter is chosen when Triton is first imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.functional import linear_attention, linear_attention_state, linear_attention_step
from attnkit.functional.linear_fused import fused_causal, segment_length
from tests.functional import linear_twin

ROOT = Path(__file__).resolve().parents[2]


def dense_fused(fq, fk, v, kv0, z0, eps, eps_rows):
    """The definition on features, quadratic, in float64: output and final state."""
    g = fq.shape[1] // fk.shape[1]
    fk_h, v_h, kv0_h, z0_h = (x.repeat_interleave(g, 1) for x in (fk, v, kv0, z0))
    s = fq.shape[2]
    a = (fq @ fk_h.transpose(-1, -2)) * torch.ones(s, s, dtype=torch.bool).tril()  # [b, h, s, s]
    num = a @ v_h + fq @ kv0_h
    den = a.sum(-1) + (fq * z0_h.unsqueeze(-2)).sum(-1)
    if eps_rows is not None:
        den = den + eps_rows
    elif eps is not None:
        den = den + eps
    else:
        den = torch.where(den > 0, den, torch.ones_like(den))
    return num / den.unsqueeze(-1), kv0 + fk.transpose(-1, -2) @ v, z0 + fk.sum(-2)


def _weighted_sum(tensors, seed=0):
    """``Σ t · r`` with fixed random ``r`` (the same whatever the tensors' dtype)."""
    g = torch.Generator().manual_seed(seed)
    return sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)).sum() for t in tensors)


@st.composite
def fused_cases(draw):
    h_kv = draw(st.integers(1, 2))
    chunk = draw(st.sampled_from([16, 32]))
    return dict(
        b=draw(st.integers(1, 2)),
        h_kv=h_kv,
        h=h_kv * draw(st.integers(1, 3)),
        s=draw(st.integers(1, 100)),
        m=draw(st.sampled_from([3, 8, 17])),
        d_v=draw(st.sampled_from([1, 5, 16])),
        chunk=chunk,
        seg_len=draw(st.sampled_from([None, chunk, 2 * chunk, 3 * chunk])),
        eps=draw(st.sampled_from(["none", "scalar", "rows"])),
        blind_rows=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40, deadline=None)
@given(case=fused_cases())
def test_fused_algorithm_matches_the_definition_outputs_state_and_gradients(case):
    g = torch.Generator().manual_seed(case["seed"])
    b, h, h_kv, s, m, d_v = (case[k] for k in ("b", "h", "h_kv", "s", "m", "d_v"))

    def rand(*shape, positive=False):
        x = torch.rand(*shape, generator=g, dtype=torch.float64)
        return x if positive else 2 * x - 1

    fq, fk = rand(b, h, s, m, positive=True), rand(b, h_kv, s, m, positive=True)
    if case["blind_rows"]:  # queries whose features meet nothing: zero outputs without eps
        fq[:, :, ::3] = 0
    v = rand(b, h_kv, s, d_v)
    kv0, z0 = rand(b, h_kv, m, d_v), rand(b, h_kv, m, positive=True)
    if case["blind_rows"]:
        z0.zero_(), kv0.zero_()
    eps = 0.25 if case["eps"] == "scalar" else None
    eps_rows = rand(b, h, s, positive=True) if case["eps"] == "rows" else None
    inputs = [x.requires_grad_() for x in (fq, fk, v, kv0, z0)]
    got = fused_causal(
        *inputs,
        eps=eps,
        eps_rows=eps_rows,
        chunk=case["chunk"],
        out_dtype=torch.float64,
        seg_len=case["seg_len"],
        backend=linear_twin,
    )
    want = dense_fused(*inputs, eps, eps_rows)
    for got_t, want_t in zip(got, want):
        torch.testing.assert_close(got_t, want_t, atol=1e-10, rtol=1e-10)
    got_g = torch.autograd.grad(_weighted_sum(got), inputs)
    want_g = torch.autograd.grad(_weighted_sum(want), inputs)
    for got_t, want_t in zip(got_g, want_g):
        torch.testing.assert_close(got_t, want_t, atol=1e-9, rtol=1e-9)


def test_fused_algorithm_in_bfloat16_products_stays_within_the_half_precision_tolerance():
    # The kernels' precision: bfloat16 features and values, float32 sums and states.
    g = torch.Generator().manual_seed(3)
    b, h, h_kv, s, m, d_v = 1, 4, 2, 600, 32, 32
    fq = F.elu(torch.randn(b, h, s, m, generator=g, dtype=torch.float64)) + 1
    fk = F.elu(torch.randn(b, h_kv, s, m, generator=g, dtype=torch.float64)) + 1
    v = torch.randn(b, h_kv, s, d_v, generator=g, dtype=torch.float64)
    kv0, z0 = torch.zeros(b, h_kv, m, d_v, dtype=torch.float64), torch.zeros(b, h_kv, m, dtype=torch.float64)
    low = [x.bfloat16().requires_grad_() for x in (fq, fk, v)]
    out, kv, z = fused_causal(
        *low, kv0.float(), z0.float(), eps=None, eps_rows=None, chunk=64, out_dtype=torch.bfloat16, backend=linear_twin
    )
    exact = [x.clone().requires_grad_() for x in (fq, fk, v)]
    want = dense_fused(*exact, kv0, z0, None, None)
    for got_t, want_t in zip((out, kv, z), want):
        assert (got_t.double() - want_t).abs().max() <= 2e-2 * want_t.abs().max()
    got_g = torch.autograd.grad(_weighted_sum([out]), low)
    want_g = torch.autograd.grad(_weighted_sum([want[0]]), exact)
    for got_t, want_t in zip(got_g, want_g):
        assert (got_t.double() - want_t).abs().max() <= 2e-2 * want_t.abs().max()


def test_segments_are_whole_chunks_and_fill_the_gpu():
    assert segment_length(65536, 8, 64) == 512  # 128 segments × 8 heads = 1024 programs
    assert segment_length(100, 1, 16) == 16
    assert segment_length(1, 64, 64) == 64
    with pytest.raises(ValueError, match=r"chunk_size a power of two >= 16, got 24"):
        zeros = torch.zeros(1, 1, 4, 2)
        fused_causal(zeros, zeros, zeros, zeros, zeros, eps=None, eps_rows=None, chunk=24, out_dtype=torch.float32)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "favor"])
def test_a_call_continues_from_the_state_of_the_previous_one(feature_map):
    g = torch.Generator().manual_seed(4)
    b, h, h_kv, s, d = 2, 4, 2, 40, 8
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = (3 * torch.randn(b, h_kv, s, d, generator=g, dtype=torch.float64)).requires_grad_()  # FAVOR+ rescales
    v = torch.randn(b, h_kv, s, 6, generator=g, dtype=torch.float64, requires_grad=True)
    kw = dict(feature_map=feature_map, causal=True, eps=1e-3, chunk_size=8)
    full, full_state = linear_attention(q, k, v, return_state=True, **kw)
    first, state = linear_attention(q[:, :, :15], k[:, :, :15], v[:, :, :15], return_state=True, **kw)
    assert state.length == 15
    rest, end = linear_attention(q[:, :, 15:], k[:, :, 15:], v[:, :, 15:], state=state, return_state=True, **kw)
    torch.testing.assert_close(torch.cat([first, rest], 2), full, atol=1e-12, rtol=1e-10)
    assert end.length == s
    for got_t, want_t in ((end.kv, full_state.kv), (end.z, full_state.z)):
        scale = torch.exp(end.log_shift - full_state.log_shift)
        torch.testing.assert_close(got_t * scale.view(*scale.shape, *[1] * (got_t.ndim - 2)), want_t)
    grads_split = torch.autograd.grad(_weighted_sum([torch.cat([first, rest], 2)]), [q, k, v])
    grads_full = torch.autograd.grad(_weighted_sum([full]), [q, k, v])
    for got_t, want_t in zip(grads_split, grads_full):
        torch.testing.assert_close(got_t, want_t, atol=1e-10, rtol=1e-8)
    # A prompt's state, then one token at a time: the steps continue the call.
    step, _ = linear_attention_step(
        q[:, :, 15:16], k[:, :, 15:16], v[:, :, 15:16], state, feature_map=feature_map, eps=1e-3
    )
    torch.testing.assert_close(step, full[:, :, 15:16], atol=1e-12, rtol=1e-10)


def test_a_state_with_fewer_queries_than_keys_and_bidirectional():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 12, 4, generator=g, dtype=torch.float64)
    prompt = linear_attention_state(k[:, :, :4], v[:, :, :4])
    for causal in (True, False):
        want = linear_attention(q, k, v, causal=causal)
        got, state = linear_attention(q, k[:, :, 4:], v[:, :, 4:], causal=causal, state=prompt, return_state=True)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(state.kv, linear_attention_state(k, v).kv)
    # More queries than keys: the first queries see only the earlier keys.
    blind = linear_attention(q, k[:, :, 4:6], v[:, :, 4:6], causal=True, state=prompt)
    want = linear_attention(q, k[:, :, :6], v[:, :, :6], causal=True)
    torch.testing.assert_close(blind[:, :, 2:], want[:, :, 2:], atol=1e-12, rtol=1e-10)
    only_prompt = linear_attention(q[:, :, :2], k[:, :, :4], v[:, :, :4])
    torch.testing.assert_close(blind[:, :, :2], only_prompt, atol=1e-12, rtol=1e-10)


def test_state_and_engine_errors():
    q = torch.randn(1, 2, 3, 8)
    state = linear_attention_state(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8))
    with pytest.raises(ValueError, match=r"state must hold kv \[b, h_kv, m, d_v\] = \[1, 2, 8, 8\]"):
        linear_attention(q, q, q, causal=True, state=state)
    with pytest.raises(ValueError, match=r"engine='triton' computes causal linear attention"):
        linear_attention(q, q, q, engine="triton")
    with pytest.raises(
        ValueError, match=r"engine='triton' takes float32, float16 or bfloat16 tensors, got torch.float64"
    ):
        linear_attention(q.double(), q.double(), q.double(), causal=True, engine="triton")
    if os.environ.get("TRITON_INTERPRET", "") not in ("1", "true", "on"):
        with pytest.raises(ValueError, match=r"engine='triton' runs on CUDA tensors .* got tensors on cpu"):
            linear_attention(q, q, q, causal=True, engine="triton")


@pytest.mark.slow
def test_triton_kernels_through_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/functional/linear_interpreted.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
