"""Each mask against a hand-written dense definition, composition, and the adapters."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks


def dense(fn, s_q, s_k):
    """The definition: loop over absolute positions, query row i at i + s_k - s_q."""
    out = torch.zeros(s_q, s_k, dtype=torch.bool)
    for row in range(s_q):
        for j in range(s_k):
            out[row, j] = fn(row + s_k - s_q, j)
    return out


DEFINITIONS = [
    (masks.full(), lambda i, j: True),
    (masks.causal(), lambda i, j: j <= i),
    (masks.sliding_window(2), lambda i, j: i - 2 <= j <= i),
    (masks.sliding_window(1, 3), lambda i, j: i - 1 <= j <= i + 3),
    (masks.strided(3), lambda i, j: (i - j) % 3 == 0),
    (masks.fixed(4, 1), lambda i, j: i // 4 == j // 4 or j % 4 == 3),
    (masks.global_tokens([0, 5]), lambda i, j: i in (0, 5) or j in (0, 5)),
    (masks.causal() & masks.sliding_window(1, 1), lambda i, j: i - 1 <= j <= i),
    (masks.strided(4) | masks.sliding_window(1), lambda i, j: (i - j) % 4 == 0 or i - 1 <= j <= i),
    (~masks.causal(), lambda i, j: j > i),
]


@pytest.mark.parametrize(("mask", "definition"), DEFINITIONS, ids=[repr(m) for m, _ in DEFINITIONS])
@pytest.mark.parametrize(("s_q", "s_k"), [(9, 9), (3, 9), (9, 4), (1, 7)])
def test_mask_matches_its_definition(mask, definition, s_q, s_k):
    got = mask.to_dense(s_q, s_k)
    assert got.shape == (1, 1, s_q, s_k) and got.dtype == torch.bool
    assert torch.equal(got[0, 0], dense(definition, s_q, s_k))


def test_padding_varies_over_the_batch():
    got = masks.padding([2, 0, 4]).to_dense(3, 4)
    assert got.shape == (3, 1, 3, 4)
    assert torch.equal(got[:, 0, 0], torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool))
    combined = masks.padding([2, 0, 4]) & masks.causal()
    assert combined.batch_size == 3 and combined.to_dense(4, 4).shape == (3, 1, 4, 4)


def test_random_mask_is_deterministic_has_the_asked_density_and_is_blockwise_consistent():
    mask = masks.random(0.25, seed=3)
    a = mask.to_dense(256, 256)
    assert torch.equal(a, masks.random(0.25, seed=3).to_dense(256, 256))
    assert not torch.equal(a, masks.random(0.25, seed=4).to_dense(256, 256))
    assert abs(a.float().mean().item() - 0.25) < 0.02
    # A block evaluated alone equals the same block of the whole mask.
    q = torch.arange(64, 96).view(1, 1, -1, 1)
    kv = torch.arange(128, 160).view(1, 1, 1, -1)
    block = mask(torch.zeros(1), torch.zeros(1), q, kv)
    assert torch.equal(block[0, 0], a[0, 0, 64:96, 128:160])


def test_from_dense_roundtrips_and_aligns_rows():
    allowed = torch.rand(2, 3, 4, 6) > 0.5
    mask = masks.from_dense(allowed)
    assert torch.equal(mask.to_dense(4, 6), allowed)
    two_d = torch.rand(4, 6) > 0.5
    assert torch.equal(masks.from_dense(two_d).to_dense(4, 6)[0, 0], two_d)
    assert torch.equal(
        (masks.from_dense(two_d) & masks.causal()).to_dense(4, 6)[0, 0], two_d & dense(lambda i, j: j <= i, 4, 6)
    )


def test_torch_mha_adapters_invert_the_convention():
    blocked = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # nn.Transformer's causal mask
    mask = masks.from_torch_mha(blocked)
    assert torch.equal(mask.to_dense(5, 5)[0, 0], dense(lambda i, j: j <= i, 5, 5))
    assert torch.equal(masks.to_torch_mha(masks.causal(), 5, 5), blocked)
    with pytest.raises(ValueError, match="varies over batch or heads"):
        masks.to_torch_mha(masks.padding([1, 2]), 2, 2)


def test_hf_padding_adapter_keeps_ones():
    am = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = masks.from_hf_padding(am).to_dense(3, 3)
    assert got.shape == (2, 1, 3, 3)
    assert torch.equal(got[:, 0, 0], am.bool())


def test_sdpa_adapter_agrees_with_sdpa_on_a_pattern():
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    mask = masks.sliding_window(2, 1) | masks.global_tokens([0])
    ours = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masks.to_sdpa(mask, 6, 6))
    import attnkit

    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask), ours, atol=1e-6, rtol=0)


def test_block_mask_adapter_matches_dense():
    from torch.nn.attention.flex_attention import create_mask

    mask = masks.causal() & masks.sliding_window(3)
    block_mask = masks.to_block_mask(mask, 40, 40, block_size=8)
    assert block_mask.shape[-2:] == (40, 40)
    dense_from_flex = create_mask(block_mask.mask_mod, 1, 1, 40, 40, device="cpu")
    assert torch.equal(dense_from_flex, mask.to_dense(40, 40))
    # Fewer queries than keys: the adapter shifts FlexAttention's row indices.
    tail = masks.to_block_mask(masks.causal(), 8, 40, block_size=8)
    assert torch.equal(create_mask(tail.mask_mod, 1, 1, 8, 40, device="cpu"), masks.causal().to_dense(8, 40))


def test_names_are_readable():
    mask = masks.causal() & masks.sliding_window(4)
    assert repr(mask) == "Mask((causal & sliding_window(left=4, right=0)))"
    assert "~(causal)" in repr(~masks.causal())


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: masks.sliding_window(-1), ValueError, r"left must be >= 0, got -1"),
        (lambda: masks.sliding_window(2, -3), ValueError, r"right must be >= 0, got -3"),
        (lambda: masks.sliding_window(2.5), TypeError, r"left must be an int, got float 2.5"),
        (lambda: masks.strided(0), ValueError, r"stride must be >= 1, got 0"),
        (lambda: masks.fixed(4, 5), ValueError, r"summary must be <= block, got summary=5, block=4"),
        (lambda: masks.random(1.5), ValueError, r"density must be in \[0, 1\], got 1.5"),
        (lambda: masks.padding([]), ValueError, r"non-empty 1-D"),
        (lambda: masks.padding([2, -1]), ValueError, r"lengths must be >= 0, got \[2, -1\]"),
        (lambda: masks.padding([1.5]), TypeError, r"lengths must be integers"),
        (lambda: masks.global_tokens([[1]]), ValueError, r"indices must be 1-D"),
        (lambda: masks.from_dense(torch.ones(3, 3)), TypeError, r"bool tensor .* got torch.float32"),
        (lambda: masks.from_dense(torch.ones(3, dtype=torch.bool)), ValueError, r"2 to 4 dimensions, got shape \[3\]"),
        (
            lambda: masks.causal() & torch.ones(2, 2, dtype=torch.bool),
            TypeError,
            r"can only combine a Mask with a Mask",
        ),
        (lambda: masks.padding([1, 2]) & masks.padding([1, 2, 3]), ValueError, r"different batch_size: 2 and 3"),
        (lambda: masks.causal().to_dense(-1, 3), ValueError, r"s_q and s_k must be >= 0"),
        (
            lambda: masks.padding([1, 2]).to_dense(2, 2, batch_size=3),
            ValueError,
            r"varies over 2 entries of batch_size",
        ),
    ],
)
def test_bad_arguments_get_clear_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("shape", [(), (5, 7), (3, 5, 7), (2, 3, 5, 7)])
def test_unsqueeze_to_4d_puts_size_one_dimensions_in_front(shape):
    from attnkit.functional.masks import unsqueeze_to_4d

    x = torch.randn(shape)
    four = unsqueeze_to_4d(x)
    assert four.shape == (1,) * (4 - len(shape)) + shape
    assert four.data_ptr() == x.data_ptr()  # a view, not a copy
    torch.testing.assert_close(four.expand(2, 3, 5, 7), x.expand(2, 3, 5, 7))
    if len(shape) == 4:
        assert four is x
