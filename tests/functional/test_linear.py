"""linear_attention against its dense float64 definition ``(φ(Q)φ(K)ᵀ ∘ M) V / rowsum``:
outputs and gradients, causal chunking, the one-token recurrent step, FAVOR+ ≈ softmax."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.functional import (
    LinearAttentionState,
    favor_projection,
    linear_attention,
    linear_attention_state,
    linear_attention_step,
)
from tests.functional.dense_reference import causal_allowed, dense_attention, grads


def dense_linear(q, k, v, phi, causal):
    """The definition, quadratic and plain, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    a = phi(q) @ phi(k).transpose(-1, -2)  # [b, h, s_q, s_k]
    if causal:
        a = a * causal_allowed(q.shape[2], k.shape[2])
    den = a.sum(-1, keepdim=True)
    return (a @ v) / torch.where(den > 0, den, torch.ones_like(den))


def favor_phi(omega):
    def phi(x):
        x = x * x.shape[-1] ** -0.25
        return torch.exp(x @ omega.T - 0.5 * x.square().sum(-1, keepdim=True)) / math.sqrt(omega.shape[0])

    return phi


@st.composite
def cases(draw):
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 2))
    h = h_kv * draw(st.integers(1, 3))
    d = draw(st.sampled_from([4, 8]))
    return dict(
        shape=(b, h, h_kv, draw(st.integers(1, 40)), draw(st.integers(1, 40)), d, draw(st.sampled_from([d, 5]))),
        feature_map=draw(st.sampled_from(["elu", "relu", "favor", "callable"])),
        causal=draw(st.booleans()),
        chunk=draw(st.integers(1, 9)),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_linear_matches_its_dense_definition_outputs_and_gradients(case):
    b, h, h_kv, s_q, s_k, d, d_v = case["shape"]
    g = torch.Generator().manual_seed(case["seed"])
    q = torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h_kv, s_k, d_v, generator=g, dtype=torch.float64, requires_grad=True)
    omega = favor_projection(d, 12, seed=case["seed"], dtype=torch.float64)
    fm = case["feature_map"]
    phi = {"elu": lambda x: F.elu(x) + 1, "relu": F.relu, "favor": favor_phi(omega), "callable": lambda x: x.square()}[
        fm
    ]
    out = linear_attention(
        q,
        k,
        v,
        feature_map=phi if fm == "callable" else fm,
        causal=case["causal"],
        projection=omega,
        chunk_size=case["chunk"],
    )
    want = dense_linear(q, k, v, phi, case["causal"])
    torch.testing.assert_close(out, want, atol=1e-9, rtol=1e-9)
    for got_g, want_g in zip(grads(out, [q, k, v]), grads(want, [q, k, v])):
        assert torch.isfinite(got_g).all()
        torch.testing.assert_close(got_g, want_g, atol=1e-8, rtol=1e-8)


def test_long_causal_sequence_crosses_segments():
    g = torch.Generator().manual_seed(0)
    s = 9000  # more than one segment of the causal scan
    q, k, v = (torch.randn(1, 1, s, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = linear_attention(q, k, v, causal=True, chunk_size=50)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    rows = [0, 1, 4999, 8191, 8192, 8999]
    for i in rows:
        a = phi_q[0, 0, i] @ phi_k[0, 0, : i + 1].T
        want = (a @ v[0, 0, : i + 1]) / a.sum()
        torch.testing.assert_close(out[0, 0, i], want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "favor"])
def test_recurrent_step_equals_the_causal_rows_with_a_constant_size_state(feature_map):
    g = torch.Generator().manual_seed(2)
    b, h, h_kv, s, d = 2, 4, 2, 24, 8
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
    k = 3 * torch.randn(b, h_kv, s, d, generator=g, dtype=torch.float64)  # large: FAVOR+ must rescale
    v = torch.randn(b, h_kv, s, 6, generator=g, dtype=torch.float64)
    full = linear_attention(q, k, v, feature_map=feature_map, causal=True)
    state = linear_attention_state(k[:, :, :5], v[:, :, :5], feature_map=feature_map)  # a prompt
    sizes = set()
    for t in range(5, s):
        out, state = linear_attention_step(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state, feature_map=feature_map
        )
        torch.testing.assert_close(out[:, :, 0], full[:, :, t], atol=1e-10, rtol=1e-8)
        sizes.add((tuple(state.kv.shape), tuple(state.z.shape)))
    assert len(sizes) == 1 and state.length == s
    first, _ = linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, feature_map=feature_map)
    torch.testing.assert_close(first[:, :, 0], full[:, :, 0], atol=1e-10, rtol=1e-8)


def test_favor_approximates_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k = (0.5 * torch.randn(1, 1, 64, 16, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 64, 16, generator=g, dtype=torch.float64)
    exact, _, _ = dense_attention(q, k, v)
    errors = []
    for m in (16, 1024):
        approx = linear_attention(
            q, k, v, feature_map="favor", projection=favor_projection(16, m, seed=1, dtype=torch.float64)
        )
        errors.append((approx - exact).abs().mean().item())
    assert errors[1] < 0.03 and errors[1] < errors[0]


def test_empty_state_and_errors():
    state = LinearAttentionState.empty(1, 2, 8, 4)
    assert state.kv.shape == (1, 2, 8, 4) and state.length == 0
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"takes one token"):
        linear_attention_step(q, q, q, state)
    with pytest.raises(TypeError, match=r'feature_map must be "elu", "relu", "favor" or a callable'):
        linear_attention(q, q, q, feature_map="softmax")
    with pytest.raises(ValueError, match=r"projection must be \[num_features, d\] = \[m, 8\], got \[4, 3\]"):
        linear_attention(q, q, q, feature_map="favor", projection=torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"chunk_size must be an int >= 1"):
        linear_attention(q, q, q, causal=True, chunk_size=0)


def _favor_keys_with_a_loud_last_key(s=16, d=8):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 1, s, d, dtype=torch.float64)
    omega = favor_projection(d, dtype=torch.float64)
    loud = k.clone()
    loud[:, :, -1] = omega[omega.norm(dim=1).argmax()] * d**0.25  # raises the keys' stabiliser
    return q, k, loud, v, omega


def test_causal_favor_with_eps_does_not_see_future_keys():
    q, k, loud, v, omega = _favor_keys_with_a_loud_last_key()

    def run(keys):
        return linear_attention(q, keys, v, feature_map="favor", projection=omega, causal=True, eps=1e-3)

    assert (run(k)[:, :, :-1] - run(loud)[:, :, :-1]).abs().max().item() < 1e-12


def test_eps_is_added_to_the_true_normaliser():
    q, k, _, v, omega = _favor_keys_with_a_loud_last_key()
    phi = favor_phi(omega)
    a = (phi(q) @ phi(k).transpose(-1, -2)) * causal_allowed(16, 16)
    want = (a @ v) / (a.sum(-1, keepdim=True) + 1e-3)
    got = linear_attention(q, k, v, feature_map="favor", projection=omega, causal=True, eps=1e-3)
    assert (got - want).abs().max().item() < 1e-12


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_step_with_eps_equals_the_causal_rows(feature_map):
    q, _, k, v, omega = _favor_keys_with_a_loud_last_key()
    full = linear_attention(q, k, v, feature_map=feature_map, projection=omega, causal=True, eps=1e-3)
    state = None
    for i in range(16):
        row, state = linear_attention_step(
            q[:, :, i : i + 1],
            k[:, :, i : i + 1],
            v[:, :, i : i + 1],
            state,
            feature_map=feature_map,
            projection=omega,
            eps=1e-3,
        )
        assert (row - full[:, :, i : i + 1]).abs().max().item() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("feature_map", ["elu", "relu", "favor"])
def test_half_precision_is_accumulated_in_float32(dtype, feature_map):
    # Inputs of std 8 over 4096 tokens overflowed float16 sums (NaN, elu and relu), and
    # FAVOR+ features of inputs of std 4 underflowed to rows of exact zeros.
    torch.manual_seed(1)
    std = 4 if feature_map == "favor" else 8
    q, k, v = (torch.randn(1, 2, 4096, 16).mul(std).to(dtype) for _ in range(3))
    omega = favor_projection(16)
    want = linear_attention(
        q.double(), k.double(), v.double(), feature_map=feature_map, projection=omega.double(), causal=True
    )
    got = linear_attention(q, k, v, feature_map=feature_map, projection=omega, causal=True)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert not (got == 0).all(-1).any(), "rows of exact zeros"
    scale = want.abs().max().item()
    assert (got.double() - want).abs().max().item() < 2e-2 * scale


@pytest.mark.slow
def test_compiled_engine_equals_eager():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 1, 2, 150, 16).unbind(0)
    for feature_map in ("elu", "favor"):
        eager = linear_attention(q, k, v, feature_map=feature_map, causal=True, eps=1e-3, engine="eager")
        compiled = linear_attention(q, k, v, feature_map=feature_map, causal=True, eps=1e-3, engine="compiled")
        assert (eager - compiled).abs().max().item() < 1e-5
    with pytest.raises(
        ValueError,
        match=r"linear_attention runs on the engines \['auto', 'eager', 'compiled', 'triton'\], got engine='flex'",
    ):
        linear_attention(q, k, v, engine="flex")
