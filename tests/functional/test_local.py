"""local_attention against dense float64 attention under a sliding-window mask: outputs,
log-sum-exp and gradients; no [s_q, s_k] tensor anywhere; the notes' counting claim."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from attnkit.functional import local_attention
from attnkit.functional.local import local_core, scores_computed
from tests.functional.dense_reference import LargestStorage, dense_attention, grads


@st.composite
def cases(draw):
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 2))
    h = h_kv * draw(st.integers(1, 3))
    s_q, s_k = draw(st.integers(1, 45)), draw(st.integers(1, 45))
    d = draw(st.sampled_from([4, 8]))
    causal = draw(st.booleans())
    left = draw(st.integers(0, 12))
    right = 0 if causal else draw(st.integers(0, 12))
    return dict(
        shape=(b, h, h_kv, s_q, s_k, d, draw(st.sampled_from([d, 5]))),
        window=(left, right),
        causal=causal,
        block=draw(st.sampled_from([None, 1, 2, 3, 4, 8])),
        engine=draw(st.sampled_from(["auto", "eager"])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=70, deadline=None)
@given(case=cases())
def test_local_matches_dense_reference_outputs_lse_and_gradients(case):
    b, h, h_kv, s_q, s_k, d, d_v = case["shape"]
    left, right = case["window"]
    g = torch.Generator().manual_seed(case["seed"])
    q = torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h_kv, s_k, d_v, generator=g, dtype=torch.float64, requires_grad=True)
    out, lse = local_core(
        q, k, v, left=left, right=right, scale=d**-0.5, block_size=case["block"], block_op=case["engine"]
    )
    allowed = masks.sliding_window(left, right).to_dense(s_q, s_k)
    want, _, want_lse = dense_attention(q, k, v, allowed=allowed)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-10, rtol=0)
    for got_g, want_g in zip(grads(out, [q, k, v]), grads(want, [q, k, v])):
        assert torch.isfinite(got_g).all()
        torch.testing.assert_close(got_g, want_g, atol=1e-9, rtol=0)


def test_public_function_equals_attention_with_the_window_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 300, 16, generator=g) for _ in range(3))
    for window, causal, mask in [
        (32, True, masks.sliding_window(32) & masks.causal()),
        (20, False, masks.sliding_window(20, 20)),
        ((7, 50), False, masks.sliding_window(7, 50)),
    ]:
        got = local_attention(q, k, v, window=window, causal=causal)
        want = attnkit.attention(q, k, v, mask=mask, return_weights=True).output
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    result = local_attention(q[0, 0], k[0, 0], v[0, 0], window=5, return_lse=True)
    assert result.output.shape == (300, 16) and result.lse.shape == (300,) and result.weights is None


def test_rows_with_an_empty_window_are_zeros():
    # Ten queries, four keys, bottom-right: query rows 0..5 sit at negative positions.
    q, k, v = (torch.randn(1, 1, n, 4, requires_grad=True) for n in (10, 4, 4))
    out = local_attention(q, k, v, window=1, causal=True)
    assert (out[0, 0, :5] == 0).all() and not out.isnan().any()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_no_square_tensor_forward_or_backward_and_linear_memory():
    sizes = {}
    for s in (1024, 2048):
        q, k, v = (torch.randn(1, 2, s, 16, requires_grad=True) for _ in range(3))
        with LargestStorage() as watch:
            out = local_attention(q, k, v, window=32, causal=True)
            out.sum().backward()
        sizes[s] = watch.nbytes
        assert watch.nbytes < s * s, (watch.nbytes, watch.op)
    assert sizes[2048] <= 2.2 * sizes[1024]  # grows with s, not s²


def test_counting_claim_of_the_notes():
    # 1000 tokens, a window of ±10: about 20 thousand scores instead of a million.
    counts = scores_computed(1000, 1000, window=10)
    assert counts["full"] == 1_000_000
    assert counts["allowed"] == 21 * 1000 - 2 * sum(range(1, 11))  # 20,890
    assert counts["allowed"] <= counts["computed"] < 0.1 * counts["full"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(window=(3, 2), causal=True), ValueError, r"causal local attention sees no keys to the right"),
        (dict(window=-1), ValueError, r"window must be >= 0 on both sides"),
        (dict(window=2.5), TypeError, r"window must be an int or a \(left, right\) pair"),
        (dict(window=2, block_size=0), ValueError, r"block_size must be an int >= 1 or None, got 0"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    q = torch.randn(1, 1, 5, 4)
    with pytest.raises(error, match=message):
        local_attention(q, q, q, **kwargs)
