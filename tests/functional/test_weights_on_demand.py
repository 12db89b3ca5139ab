"""weights_on_demand: exact weights for chosen heads, rows and keys, from q, k and the
log-sum-exp of a memory-efficient kernel, against dense float64 weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import masks
from attnkit.functional import iter_weights_on_demand, local_attention, tiled_attention, weights_on_demand
from tests.functional.dense_reference import causal_allowed, dense_attention


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 2),
    h_kv=st.integers(1, 2),
    group=st.integers(1, 3),
    s_q=st.integers(1, 30),
    s_k=st.integers(1, 30),
    use_lse=st.booleans(),
    causal=st.booleans(),
    with_mask=st.booleans(),
    with_bias=st.booleans(),
    chunk=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_chosen_weights_match_dense_reference(
    b, h_kv, group, s_q, s_k, use_lse, causal, with_mask, with_bias, chunk, seed
):
    h = h_kv * group
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, 8, generator=g, dtype=torch.float64)
    k = torch.randn(b, h_kv, s_k, 8, generator=g, dtype=torch.float64)
    v = torch.randn(b, h_kv, s_k, 8, generator=g, dtype=torch.float64)
    mask = masks.sliding_window(4, 3) | masks.global_tokens([0]) if with_mask else None
    bias = torch.randn(h, 1, s_k, generator=g, dtype=torch.float64) if with_bias else None
    allowed = mask.to_dense(s_q, s_k) if with_mask else None
    if causal:
        allowed = causal_allowed(s_q, s_k) if allowed is None else allowed & causal_allowed(s_q, s_k)
    _, want, _ = dense_attention(q, k, v, allowed=allowed, bias=bias)
    lse = (
        tiled_attention(q, k, v, mask=mask, bias=bias, causal=causal, block_size=4, return_lse=True).lse
        if use_lse
        else None
    )
    heads = [h - 1, 0]
    rows = torch.randperm(s_q, generator=g)[: max(1, s_q // 2)]
    keys = slice(s_k // 3, None)
    got = weights_on_demand(
        q, k, lse, heads=heads, rows=rows, keys=keys, mask=mask, bias=bias, causal=causal, chunk_size=chunk
    )
    torch.testing.assert_close(got, want[:, heads][:, :, rows][:, :, :, keys], atol=1e-10, rtol=0)


def test_weights_of_a_long_sequence_without_the_full_matrix():
    g = torch.Generator().manual_seed(0)
    s = 4096
    q, k, v = (torch.randn(1, 2, s, 16, generator=g) for _ in range(3))
    result = local_attention(q, k, v, window=64, causal=True, return_lse=True)
    rows = torch.tensor([0, 100, 4095])
    w = weights_on_demand(q, k, result.lse, heads=[1], rows=rows, mask=masks.sliding_window(64), causal=True)
    assert w.shape == (1, 1, 3, s)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 1, 3), atol=1e-5, rtol=0)
    assert (w[0, 0, 2, : 4095 - 64] == 0).all()
    out_row = w[0, 0] @ v[0, 1]  # the weights reproduce the kernel's output
    torch.testing.assert_close(out_row, result.output[0, 1, rows], atol=1e-5, rtol=0)
    chunks = list(
        iter_weights_on_demand(
            q, k, result.lse, heads=[0], rows=slice(0, 10), causal=True, mask=masks.sliding_window(64), chunk_size=4
        )
    )
    assert [c[0].tolist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_errors():
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"lse must be \[b, h, s_q\] = \[1, 2, 5\], got \[1, 2\]"):
        weights_on_demand(q, q, torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"head 3 is out of range: there are 2 heads, 0\.\.1"):
        weights_on_demand(q, q, heads=[3])
    with pytest.raises(ValueError, match=r"q and k must be \[b, h, s, d\]"):
        weights_on_demand(q[0, 0], q[0, 0])


def test_soft_capped_scores_in_float32_from_bfloat16_inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 12, 8, generator=g).bfloat16()
    k = torch.randn(1, 2, 12, 8, generator=g).bfloat16()
    # The product in bfloat16 as the soft-capped attention forms it (the queries scaled by
    # scale / softcap first); the rest in float32.
    scores = ((q * (8**-0.5 / 3.0)) @ k.repeat_interleave(2, dim=1).transpose(-1, -2)).double()
    scores = 3.0 * torch.tanh(scores)
    scores = scores.masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), float("-inf"))
    want = torch.softmax(scores, dim=-1)
    got = weights_on_demand(q, k, heads=[3], rows=slice(4, 9), causal=True, softcap=3.0, dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want[:, [3], 4:9], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="softcap must be a positive number"):
        weights_on_demand(q, k, softcap=0.0)


def test_scores_that_overflow_give_weights_that_are_not_finite_not_zeros():
    q = torch.full((1, 1, 3, 4), 1e20)
    k = torch.full((1, 1, 3, 4), 1e20)
    got = weights_on_demand(q, k, causal=True)
    assert got.isnan().any()  # as softmax over infinite scores; only a row that sees nothing is zeros
    empty = weights_on_demand(q, k, mask=torch.zeros(3, 3, dtype=torch.bool))
    assert torch.equal(empty, torch.zeros(1, 1, 3, 3))
