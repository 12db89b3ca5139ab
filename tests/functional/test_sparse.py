"""sparse_attention against dense float64 attention under the same pattern (natural and
permuted token orders): outputs and gradients; block tests are conservative; permuting a
strided pattern makes it block-dense."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import masks
from attnkit.functional import (
    bigbird_pattern,
    block_random,
    fixed_pattern,
    longformer_pattern,
    sparse_attention,
    strided_pattern,
)
from attnkit.functional.sparse import kept_fraction, residue_order
from tests.functional.dense_reference import causal_allowed, dense_attention, grads

PATTERNS = {
    "strided": lambda: strided_pattern(4),
    "strided_only": lambda: masks.strided(5),
    "fixed": lambda: fixed_pattern(6, 2),
    "longformer": lambda: longformer_pattern(3, [0, 7]),
    "bigbird": lambda: bigbird_pattern(2, [1], block=4, random_density=0.3, seed=5),
    "random_tokens": lambda: masks.random(0.3, seed=1) | masks.sliding_window(1),
}


@st.composite
def cases(draw):
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 2))
    h = h_kv * draw(st.integers(1, 2))
    d = draw(st.sampled_from([4, 8]))
    return dict(
        shape=(b, h, h_kv, draw(st.integers(1, 40)), draw(st.integers(1, 40)), d, draw(st.sampled_from([d, 5]))),
        pattern=draw(st.sampled_from(sorted(PATTERNS))),
        causal=draw(st.booleans()),
        block=draw(st.integers(1, 8)),
        permute=draw(st.sampled_from([None, 3, 4, 5])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_sparse_matches_dense_reference_outputs_and_gradients(case):
    b, h, h_kv, s_q, s_k, d, d_v = case["shape"]
    g = torch.Generator().manual_seed(case["seed"])
    q = torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h_kv, s_k, d_v, generator=g, dtype=torch.float64, requires_grad=True)
    pattern = PATTERNS[case["pattern"]]()
    result = sparse_attention(
        q, k, v, mask=pattern, causal=case["causal"], block_size=case["block"], permute=case["permute"], return_lse=True
    )
    allowed = pattern.to_dense(s_q, s_k)
    if case["causal"]:
        allowed = allowed & causal_allowed(s_q, s_k)
    want, _, want_lse = dense_attention(q, k, v, allowed=allowed)
    torch.testing.assert_close(result.output, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(result.lse, want_lse, atol=1e-10, rtol=0)
    for got_g, want_g in zip(grads(result.output, [q, k, v]), grads(want, [q, k, v])):
        assert torch.isfinite(got_g).all()
        torch.testing.assert_close(got_g, want_g, atol=1e-9, rtol=0)


BLOCK_TESTED = [
    masks.causal(),
    masks.full(),
    masks.sliding_window(3, 1),
    masks.strided(4),
    masks.fixed(5, 2),
    masks.global_tokens([2, 9]),
    masks.padding([11]),
    masks.document([0] * 5 + [1] * 9 + [2] * 10),
    block_random(4, 0.5, seed=2),
    masks.causal() & masks.strided(3),
    ~(masks.sliding_window(2) | masks.global_tokens([0])),
]


@settings(max_examples=200, deadline=None)
@given(
    which=st.integers(0, len(BLOCK_TESTED) - 1),
    q_rows=st.lists(st.integers(0, 23), min_size=1, max_size=6, unique=True),
    kv_rows=st.lists(st.integers(0, 23), min_size=1, max_size=6, unique=True),
    period=st.sampled_from([0, 4, 8]),
)
@pytest.mark.slow
def test_block_tests_are_conservative(which, q_rows, kv_rows, period):
    """For any set of positions: `some` False => nothing allowed; `every` True => all allowed."""
    mask = BLOCK_TESTED[which]

    def span(rows):
        t = torch.tensor(rows)
        residue = None
        if period:
            res = t % period
            residue = torch.tensor([int(res[0]) if bool((res == res[0]).all()) else -1])
        return masks.Span(t.min().view(1), t.max().view(1), period, residue)

    b, h = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    some, every = mask.blocks(b, h, span(q_rows), span(kv_rows))
    pairs = mask.fn(b.view(1, 1), h.view(1, 1), torch.tensor(q_rows).view(-1, 1), torch.tensor(kv_rows).view(1, -1))
    if not bool(some.all()):
        assert not pairs.any()
    if bool(every.all()):
        assert pairs.all()


def test_permuting_makes_a_strided_pattern_block_dense():
    s, stride, block = 4096, 64, 64
    natural = kept_fraction(masks.strided(stride), s, s, causal=True, block_size=block)
    permuted = kept_fraction(masks.strided(stride), s, s, causal=True, block_size=block, permute=stride)
    # Permuted, each residue class is one block-causal diagonal: about 1/stride of blocks.
    assert permuted <= 1.5 / stride < natural
    order, pos = residue_order(10, 4)
    assert pos.tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 3, 7] and order.tolist() == pos.tolist()


def test_block_random_keeps_whole_blocks_at_the_asked_density():
    s, block = 2048, 64
    fraction = kept_fraction(block_random(block, 0.1, seed=3), s, s, block_size=block)
    assert 0.05 < fraction < 0.15
    tiles = block_random(block, 0.1, seed=3).to_dense(s, s)[0, 0].view(s // block, block, s // block, block)
    assert bool((tiles.all(3).all(1) == tiles.any(3).any(1)).all())  # every tile all or nothing


def test_pattern_and_argument_errors():
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(TypeError, match=r"mask must be an attnkit.masks.Mask, got str"):
        sparse_attention(q, q, q, mask="strided")
    with pytest.raises(ValueError, match=r"permute must be an int >= 1 or None, got 0"):
        sparse_attention(q, q, q, mask=masks.causal(), permute=0)
