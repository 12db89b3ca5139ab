"""attnkit.attention against the float64 reference, on every path it can take."""

from __future__ import annotations

import importlib
import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from attnkit.functional.scores import additive_scores, general_scores
from tests.reference import causal_allowed, naive_attention

ATOL = 2e-5


@st.composite
def qkv_shapes(draw):
    b = draw(st.integers(1, 3))
    h_kv = draw(st.integers(1, 3))
    h = h_kv * draw(st.integers(1, 3))
    s_q = draw(st.integers(1, 13))
    s_k = draw(st.integers(1, 13))
    d = draw(st.sampled_from([1, 3, 4, 8, 16]))
    d_v = draw(st.sampled_from([d, 5]))
    return b, h, h_kv, s_q, s_k, d, d_v


def make_qkv(shape, seed=0, dtype=torch.float32, requires_grad=False):
    b, h, h_kv, s_q, s_k, d, d_v = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=g, dtype=dtype)
    k = torch.randn(b, h_kv, s_k, d, generator=g, dtype=dtype)
    v = torch.randn(b, h_kv, s_k, d_v, generator=g, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


MASK_FACTORIES = {
    "causal": lambda b: masks.causal(),
    "window": lambda b: masks.sliding_window(2, 1),
    "strided": lambda b: masks.strided(3),
    "fixed": lambda b: masks.fixed(4, 1),
    "random": lambda b: masks.random(0.4, seed=7),
    "global": lambda b: masks.global_tokens([0, 2]) & masks.causal(),
    "padding": lambda b: masks.padding([(i * 5) % 7 for i in range(b)]),
    "empty": lambda b: ~masks.full(),
    "window_or_global": lambda b: masks.sliding_window(1) | masks.global_tokens([1]),
}


@settings(max_examples=60, deadline=None)
@given(shape=qkv_shapes(), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_unmasked_and_causal_match_reference(shape, causal, seed):
    q, k, v = make_qkv(shape, seed)
    s_q, s_k = shape[3], shape[4]
    expected, expected_w = naive_attention(q, k, v, allowed=causal_allowed(s_q, s_k) if causal else None)
    fast = attnkit.attention(q, k, v, causal=causal)
    full = attnkit.attention(q, k, v, causal=causal, return_weights=True)
    torch.testing.assert_close(fast.double(), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(full.output.double(), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(full.weights.double(), expected_w, atol=ATOL, rtol=0)


@settings(max_examples=80, deadline=None)
@given(
    shape=qkv_shapes(), kind=st.sampled_from(sorted(MASK_FACTORIES)), causal=st.booleans(), seed=st.integers(0, 2**16)
)
def test_every_mask_kind_matches_reference(shape, kind, causal, seed):
    q, k, v = make_qkv(shape, seed)
    b, h, _, s_q, s_k, _, _ = shape
    mask = MASK_FACTORIES[kind](b)
    allowed = mask.to_dense(s_q, s_k, batch_size=mask.batch_size and b)
    if causal:
        allowed = allowed & causal_allowed(s_q, s_k)
    expected, expected_w = naive_attention(q, k, v, allowed=allowed)
    result = attnkit.attention(q, k, v, mask=mask, causal=causal, return_weights=True)
    torch.testing.assert_close(result.output.double(), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(result.weights.double(), expected_w, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        attnkit.attention(q, k, v, mask=mask, causal=causal).double(), expected, atol=ATOL, rtol=0
    )


@settings(max_examples=40, deadline=None)
@given(shape=qkv_shapes(), seed=st.integers(0, 2**16))
def test_bias_and_bool_tensor_mask_match_reference(shape, seed):
    q, k, v = make_qkv(shape, seed)
    b, h, _, s_q, s_k, _, _ = shape
    g = torch.Generator().manual_seed(seed + 1)
    bias = torch.randn(1, h, s_q, s_k, generator=g)
    allowed = torch.rand(b, 1, s_q, s_k, generator=g) > 0.3
    expected, expected_w = naive_attention(q, k, v, allowed=allowed, bias=bias)
    result = attnkit.attention(q, k, v, mask=allowed, bias=bias, return_weights=True)
    torch.testing.assert_close(result.output.double(), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(result.weights.double(), expected_w, atol=ATOL, rtol=0)


def test_negative_infinite_bias_acts_as_a_mask():
    q, k, v = make_qkv((1, 2, 2, 3, 4, 8, 8))
    bias = torch.zeros(3, 4)
    bias[:, 0] = float("-inf")
    bias[1] = float("-inf")
    result = attnkit.attention(q, k, v, bias=bias, return_weights=True)
    assert torch.isfinite(result.output).all()
    assert (result.weights[..., 0] == 0).all()
    assert (result.weights[:, :, 1] == 0).all() and (result.output[:, :, 1] == 0).all()


@pytest.mark.parametrize("s_q", [1, 3])
def test_a_bias_alone_on_the_fused_path_gives_zeros_to_rows_it_masks_whole(s_q):
    # No mask: SDPA reads the bias as it is (several queries and a decoding step alike).
    q, k, v = make_qkv((1, 2, 2, s_q, 4, 8, 8), requires_grad=True)
    bias = torch.randn(2, s_q, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    blocked = torch.zeros(2, s_q, 4)
    blocked[1, -1] = float("-inf")  # head 1's last query may attend to nothing
    out = attnkit.attention(q, k, v, bias=bias + blocked)
    assert (out[:, 1, -1] == 0).all()
    expected, _ = naive_attention(*(t.detach().double() for t in (q, k, v)), bias=(bias + blocked).detach().double())
    torch.testing.assert_close(out.detach().double(), expected, atol=ATOL, rtol=0)
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, bias))


@pytest.mark.parametrize("s_q", [1, 3])
def test_a_bias_of_another_dtype_takes_the_scores_dtype(s_q):
    q, k, v = make_qkv((1, 2, 2, s_q, 5, 8, 8))
    bias = torch.randn(2, s_q, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected, _ = naive_attention(q.double(), k.double(), v.double(), bias=bias)
    for mask in (None, torch.ones(s_q, 5, dtype=torch.bool)):
        out = attnkit.attention(q, k, v, bias=bias, mask=mask)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_match_reference(dtype):
    shape = (2, 4, 2, 5, 7, 8, 6)
    q, k, v = make_qkv(shape, seed=3, dtype=dtype, requires_grad=True)
    allowed = masks.sliding_window(2, 2).to_dense(5, 7)
    out = attnkit.attention(q, k, v, mask=masks.sliding_window(2, 2))
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = naive_attention(qd, kd, vd, allowed=allowed)
    ref_grads = torch.autograd.grad(ref.square().sum(), (qd, kd, vd))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=0)


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = make_qkv((1, 2, 1, 4, 3, 4, 4), requires_grad=True)
    # Four queries, three keys, causal aligned bottom-right: the first query sees nothing.
    result = attnkit.attention(q, k, v, causal=True, return_weights=True)
    assert (result.output[:, :, 0] == 0).all() and (result.weights[:, :, 0] == 0).all()
    assert not result.output.isnan().any() and not result.weights.isnan().any()
    result.output.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("return_weights", [False, True])
def test_everything_masked_gives_zeros(return_weights):
    q, k, v = make_qkv((2, 2, 2, 3, 5, 4, 4))
    out = attnkit.attention(q, k, v, mask=~masks.full(), return_weights=return_weights)
    out = out.output if return_weights else out
    assert (out == 0).all()


def test_weight_rows_sum_to_one_or_zero():
    q, k, v = make_qkv((2, 3, 3, 9, 9, 8, 8))
    weights = attnkit.attention(q, k, v, mask=masks.padding([0, 4]) & masks.causal(), return_weights=True).weights
    sums = weights.sum(-1)
    torch.testing.assert_close(sums[0], torch.zeros_like(sums[0]))
    torch.testing.assert_close(sums[1], torch.ones_like(sums[1]))


def test_causal_output_does_not_see_the_future():
    q, k, v = make_qkv((1, 2, 2, 10, 10, 8, 8))
    before = attnkit.attention(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:] = torch.randn_like(k2[:, :, 6:])
    v2[:, :, 6:] = torch.randn_like(v2[:, :, 6:])
    after = attnkit.attention(q, k2, v2, causal=True)
    torch.testing.assert_close(after[:, :, :6], before[:, :, :6])
    assert not torch.allclose(after[:, :, 6:], before[:, :, 6:])


def test_causal_decoding_with_fewer_queries_matches_the_full_causal_rows():
    q, k, v = make_qkv((1, 4, 2, 9, 9, 8, 8))
    full = attnkit.attention(q, k, v, causal=True)
    for s_q in (1, 3):
        tail = attnkit.attention(q[:, :, -s_q:], k, v, causal=True)
        torch.testing.assert_close(tail, full[:, :, -s_q:], atol=1e-6, rtol=0)


def test_permutation_equivariance_without_masks():
    q, k, v = make_qkv((1, 2, 2, 7, 7, 8, 8))
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(1))
    out = attnkit.attention(q, k, v)
    permuted = attnkit.attention(q[:, :, perm], k[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(permuted, out[:, :, perm], atol=1e-6, rtol=0)


def test_two_dimensional_inputs_reproduce_the_notes_example():
    qk = torch.tensor(
        [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 1], [1, 1, 0, 0]], dtype=torch.float32
    )
    v = torch.tensor(
        [[0.1, 0, 0.1, 0], [0, 0.2, 0, 0.2], [0.3] * 4, [0, 0, 0.1, 0.1], [0.1, 0, 0, 0.1], [0.2, 0.2, 0, 0]]
    )
    result = attnkit.attention(qk, qk, v, return_weights=True)
    assert result.weights.shape == (6, 6) and result.output.shape == (6, 4)
    expected_w = torch.full((6,), math.e / (5 * math.e + math.e**2))
    expected_w[2] = math.e**2 / (5 * math.e + math.e**2)
    torch.testing.assert_close(result.weights[2], expected_w)
    torch.testing.assert_close(result.output[2], torch.tensor([0.1575, 0.1575, 0.1316, 0.1575]), atol=5e-5, rtol=0)
    assert attnkit.attention(qk, qk, v).shape == (6, 4)


def test_dot_score_is_unscaled_and_scale_overrides():
    q, k, v = make_qkv((1, 1, 1, 4, 5, 8, 8))
    expected, _ = naive_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(attnkit.attention(q, k, v, score="dot").double(), expected, atol=ATOL, rtol=0)
    expected, _ = naive_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(attnkit.attention(q, k, v, scale=0.3).double(), expected, atol=ATOL, rtol=0)


def test_general_and_additive_scores_as_callables():
    q, k, v = make_qkv((2, 4, 2, 3, 5, 6, 6))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 6, generator=g)
    result = attnkit.attention(q, k, v, score=partial(general_scores, weight=w), return_weights=True)
    expected, _ = naive_attention(q @ w, k, v, scale=1.0)
    torch.testing.assert_close(result.output.double(), expected, atol=1e-4, rtol=0)

    w_q, w_k, a_v = torch.randn(10, 6, generator=g), torch.randn(10, 6, generator=g), torch.randn(10, generator=g)
    scores = additive_scores(q, k, w_q, w_k, a_v)
    for hi in range(4):
        for i in range(3):
            for j in range(5):
                want = a_v @ torch.tanh(w_q @ q[1, hi, i] + w_k @ k[1, hi // 2, j])
                torch.testing.assert_close(scores[1, hi, i, j], want, atol=1e-5, rtol=0)


def test_dropout_zero_is_deterministic_and_dropout_changes_output():
    q, k, v = make_qkv((1, 2, 2, 16, 16, 8, 8))
    torch.manual_seed(0)
    a = attnkit.attention(q, k, v, dropout_p=0.5)
    assert not torch.allclose(a, attnkit.attention(q, k, v))
    torch.manual_seed(0)
    b = attnkit.attention(q, k, v, dropout_p=0.5, return_weights=True)
    torch.testing.assert_close(b.weights.sum(-1), torch.ones(1, 2, 16))


def test_empty_key_sequence_gives_zeros():
    q = torch.randn(1, 1, 3, 4)
    k = torch.randn(1, 1, 0, 4)
    out = attnkit.attention(q, k, k)
    assert out.shape == (1, 1, 3, 4) and (out == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            dict(q=torch.randn(2, 8, 16, 64), k=torch.randn(2, 8, 16, 32), v=torch.randn(2, 8, 16, 32)),
            ValueError,
            r"q and k must have the same head dim, got q \[2, 8, 16, 64\] and k \[2, 8, 16, 32\]",
        ),
        (
            dict(q=torch.randn(1, 6, 4, 8), k=torch.randn(1, 4, 4, 8), v=torch.randn(1, 4, 4, 8)),
            ValueError,
            r"query heads must be a multiple of key/value heads, got h=6",
        ),
        (
            dict(q=torch.randn(1, 2, 4, 8), k=torch.randn(1, 2, 5, 8), v=torch.randn(1, 2, 4, 8)),
            ValueError,
            r"k and v must agree on every dim but the last",
        ),
        (
            dict(q=torch.randn(2, 2, 4, 8), k=torch.randn(1, 2, 4, 8), v=torch.randn(1, 2, 4, 8)),
            ValueError,
            r"same batch size",
        ),
        (
            dict(q=torch.ones(4, 8, dtype=torch.long), k=torch.ones(4, 8), v=torch.ones(4, 8)),
            TypeError,
            r"q must be a floating-point tensor, got dtype torch.int64",
        ),
        (
            dict(q=torch.randn(4, 8), k=torch.randn(4, 8, dtype=torch.float64), v=torch.randn(4, 8)),
            TypeError,
            r"same dtype",
        ),
        (
            dict(q=torch.randn(4, 8), k=torch.randn(1, 1, 4, 8), v=torch.randn(1, 1, 4, 8)),
            ValueError,
            r"must all be \[b, h, s, d\] or all be \[s, d\]",
        ),
        (
            dict(
                q=torch.randn(4, 8), k=torch.randn(4, 8), v=torch.randn(4, 8), mask=torch.ones(4, 5, dtype=torch.bool)
            ),
            ValueError,
            r"mask of shape \[4, 5\] does not broadcast to \[b, h, s_q, s_k\] = \[1, 1, 4, 4\]",
        ),
        (
            dict(q=torch.randn(4, 8), k=torch.randn(4, 8), v=torch.randn(4, 8), mask=torch.ones(4, 4)),
            TypeError,
            r"mask must be a bool tensor .* pass additive float scores as bias=",
        ),
        (
            dict(q=torch.randn(4, 8), k=torch.randn(4, 8), v=torch.randn(4, 8), bias=torch.ones(3, 4)),
            ValueError,
            r"bias of shape \[3, 4\] does not broadcast",
        ),
        (
            dict(q=torch.randn(4, 8), k=torch.randn(4, 8), v=torch.randn(4, 8), score="cosine"),
            TypeError,
            r'score must be "scaled_dot", "dot" or a callable',
        ),
        (
            dict(q=torch.randn(4, 8), k=torch.randn(4, 8), v=torch.randn(4, 8), dropout_p=1.0),
            ValueError,
            r"dropout_p must be in \[0, 1\), got 1.0",
        ),
        (
            dict(
                q=torch.randn(1, 1, 4, 8),
                k=torch.randn(1, 1, 4, 8),
                v=torch.randn(1, 1, 4, 8),
                mask=masks.padding([1, 2, 3]),
            ),
            ValueError,
            r"mask padding\(\[1, 2, 3\]\) is for batch size 3, got batch size 1",
        ),
        (
            dict(
                q=torch.randn(4, 8),
                k=torch.randn(4, 8),
                v=torch.randn(4, 8),
                mask=masks.from_dense(torch.ones(3, 3, dtype=torch.bool)),
            ),
            ValueError,
            r"is defined for \(s_q, s_k\) = \(3, 3\), got \(4, 4\)",
        ),
    ],
)
def test_bad_input_errors_say_what_was_expected_and_got(kwargs, error, message):
    q, k, v = kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v")
    with pytest.raises(error, match=message):
        attnkit.attention(q, k, v, **kwargs)


def test_fast_path_is_taken_when_sdpa_can_serve(monkeypatch):
    attention_mod = importlib.import_module("attnkit.functional.attention")
    calls = []
    real = attention_mod.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_mod.F, "scaled_dot_product_attention", spy)
    q, k, v = make_qkv((1, 4, 2, 6, 6, 8, 8))
    attnkit.attention(q, k, v)
    attnkit.attention(q, k, v, causal=True)
    attnkit.attention(q[:, :, -1:], k, v, causal=True)
    assert calls == [False, True, False]
    attnkit.attention(q, k, v, return_weights=True)
    attnkit.attention(q[:, :, :3], k, v, causal=True)
    assert len(calls) == 3


@pytest.mark.slow
def test_degenerate_shapes_are_clear_errors_not_crashes():
    import subprocess
    import sys

    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(ValueError, match=r"head dim must be at least 1"):
        attnkit.tiled_attention(torch.randn(1, 4, 8, 0), torch.randn(1, 4, 8, 0), q)
    with pytest.raises(ValueError, match=r"q must have at least one head"):
        attnkit.attention(torch.randn(1, 0, 8, 16), q, q)
    # Zero query heads once killed the interpreter (SIGFPE) in the tiled kernel.
    code = "import torch, attnkit\ntry:\n attnkit.tiled_attention(torch.randn(1,0,8,16), torch.randn(1,2,8,16), torch.randn(1,2,8,16))\nexcept ValueError as e:\n print('ValueError', e)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ValueError q must have at least one head" in done.stdout


def test_a_float64_bias_with_float32_inputs_takes_their_dtype():
    q = torch.randn(1, 2, 8, 16)
    bias = torch.randn(8, 8, dtype=torch.float64)
    res = attnkit.attention(q, q, q, bias=bias, return_weights=True)
    fast = attnkit.attention(q, q, q, bias=bias)
    assert res.output.dtype == torch.float32 and (res.output - fast).abs().max() < 1e-5


def test_block_sizes_beyond_the_sequence_allocate_nothing_more():
    q = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    want = attnkit.local_attention(q, q, q, window=2, engine="blockwise")
    assert torch.allclose(attnkit.local_attention(q, q, q, window=2, block_size=10**9), want)
    assert torch.allclose(
        attnkit.tiled_attention(q, q, q, causal=True, block_size=10**9), attnkit.attention(q, q, q, causal=True)
    )


@pytest.mark.parametrize(
    "kernel",
    [
        attnkit.attention,
        attnkit.functional.tiled_attention,
        partial(attnkit.functional.local_attention, window=3),
        partial(attnkit.functional.sparse_attention, mask=masks.sliding_window(2)),
        attnkit.functional.linear_attention,
    ],
    ids=["attention", "tiled", "local", "sparse", "linear"],
)
def test_every_kernel_takes_one_head_as_s_d_by_position_or_by_name(kernel):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    batched = kernel(q[None, None], k[None, None], v[None, None], causal=True)  # [1, 1, 7, 4]
    assert torch.equal(kernel(q, k, v, causal=True), batched[0, 0])
    assert torch.equal(kernel(q, k=k, v=v, causal=True), batched[0, 0])
    assert torch.equal(kernel(q=q, k=k, v=v, causal=True), batched[0, 0])
    with pytest.raises(ValueError, match=r"must all be \[b, h, s, d\] or all be \[s, d\]"):
        kernel(q, k[None, None], v, causal=True)
