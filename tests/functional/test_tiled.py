"""tiled_attention (and attention()'s masked path) against dense float64 attention:
outputs, log-sum-exp and gradients, on random shapes, masks, biases and block sizes."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from attnkit.functional import tiled_attention
from attnkit.functional.block_status import EMPTY, FULL, PARTIAL, classify_blocks
from attnkit.functional.tiled import make_plan, tiled_core
from tests.functional.dense_reference import LargestStorage, causal_allowed, dense_attention, grads

MASKS = {
    "none": lambda b, h, s_q, s_k, g: None,
    "window": lambda b, h, s_q, s_k, g: masks.sliding_window(3, 2),
    "document": lambda b, h, s_q, s_k, g: masks.document(torch.sort(torch.randint(0, 4, (s_k,), generator=g)).values),
    "document_per_batch": lambda b, h, s_q, s_k, g: masks.document(
        torch.sort(torch.randint(0, 3, (b, s_k), generator=g)).values
    ),
    "random": lambda b, h, s_q, s_k, g: masks.random(0.4, seed=3),  # no block test: evaluated densely
    "padding": lambda b, h, s_q, s_k, g: masks.padding([(i * 5) % (s_k + 1) for i in range(b)]),
    "strided_or_global": lambda b, h, s_q, s_k, g: masks.strided(3) | masks.global_tokens([1]),
    "fixed": lambda b, h, s_q, s_k, g: masks.fixed(4, 1),
    "per_head_dense": lambda b, h, s_q, s_k, g: masks.from_dense(torch.rand(1, h, s_q, s_k, generator=g) > 0.5),
    "bool_tensor": lambda b, h, s_q, s_k, g: torch.rand(b, 1, s_q, s_k, generator=g) > 0.4,
    "empty": lambda b, h, s_q, s_k, g: ~masks.full(),
}


def _allowed(mask, b, h, s_q, s_k, causal):
    allowed = None
    if isinstance(mask, masks.Mask):
        allowed = mask.to_dense(
            s_q, s_k, batch_size=b if mask.batch_size else None, num_heads=h if mask.num_heads else None
        )
    elif mask is not None:
        allowed = mask
    if causal:
        allowed = causal_allowed(s_q, s_k) if allowed is None else allowed & causal_allowed(s_q, s_k)
    return allowed


@st.composite
def cases(draw):
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 2))
    h = h_kv * draw(st.integers(1, 3))
    s_q, s_k = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    d = draw(st.sampled_from([4, 8]))
    d_v = draw(st.sampled_from([d, 5]))
    return dict(
        shape=(b, h, h_kv, s_q, s_k, d, d_v),
        mask=draw(st.sampled_from(sorted(MASKS))),
        causal=draw(st.booleans()),
        bias=draw(st.sampled_from([None, "full", "per_key"])),
        block=(draw(st.integers(1, 9)), draw(st.integers(1, 9))),
        engine=draw(st.sampled_from(["auto", "eager"])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=70, deadline=None)
@given(case=cases())
def test_tiled_matches_dense_reference_outputs_lse_and_gradients(case):
    b, h, h_kv, s_q, s_k, d, d_v = case["shape"]
    g = torch.Generator().manual_seed(case["seed"])
    q = torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h_kv, s_k, d_v, generator=g, dtype=torch.float64, requires_grad=True)
    inputs = [q, k, v]
    bias = None
    if case["bias"] == "full":
        bias = torch.randn(1, h, s_q, s_k, generator=g, dtype=torch.float64).requires_grad_()
    elif case["bias"] == "per_key":
        bias = torch.randn(s_k, generator=g, dtype=torch.float64).masked_fill(
            torch.rand(s_k, generator=g) < 0.2, float("-inf")
        )
        bias.requires_grad_()
    if bias is not None:
        inputs.append(bias)
    mask = MASKS[case["mask"]](b, h, s_q, s_k, g)
    out, lse = tiled_core(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=case["causal"],
        scale=d**-0.5,
        block_size=case["block"],
        block_op=case["engine"],
    )
    allowed = _allowed(mask, b, h, s_q, s_k, case["causal"])
    want, _, want_lse = dense_attention(q, k, v, allowed=allowed, bias=bias)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-10, rtol=0)
    for got_g, want_g in zip(grads(out, inputs), grads(want, inputs)):
        assert torch.isfinite(got_g).all()
        torch.testing.assert_close(got_g, want_g, atol=1e-9, rtol=0)


def test_float32_public_entry_point_and_two_dimensional_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(37, 8, generator=g) for _ in range(3))
    result = tiled_attention(q, k, v, mask=masks.sliding_window(4), block_size=8, return_lse=True)
    want, _, want_lse = dense_attention(
        q[None, None], k[None, None], v[None, None], allowed=masks.sliding_window(4).to_dense(37, 37)
    )
    assert result.weights is None and result.output.shape == (37, 8) and result.lse.shape == (37,)
    torch.testing.assert_close(result.output.double(), want[0, 0], atol=2e-6, rtol=0)
    torch.testing.assert_close(result.lse.double(), want_lse[0, 0], atol=2e-6, rtol=0)


def test_fully_masked_rows_give_zeros_lse_minus_inf_and_finite_gradients():
    q = torch.randn(1, 2, 6, 4, requires_grad=True)
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    v = torch.randn(1, 2, 3, 4, requires_grad=True)
    # Six queries, three keys, bottom-right causal: the first three see nothing.
    result = tiled_attention(q, k, v, causal=True, block_size=2, return_lse=True)
    assert (result.output[:, :, :3] == 0).all() and torch.isinf(result.lse[:, :, :3]).all()
    assert not result.output.isnan().any()
    result.output.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_block_status_is_exact_for_masks_with_block_tests():
    ids = torch.tensor([0] * 13 + [1] * 30 + [2] * 7 + [3] * 50)
    cases = [
        masks.document(ids) & masks.causal(),
        masks.sliding_window(9, 3),
        masks.causal() | masks.global_tokens([5, 60]),
        masks.fixed(16, 4) & masks.causal(),
        ~masks.sliding_window(20, 20),
        masks.padding([70]),
    ]
    s, bq, bk = 100, 8, 16
    pos = torch.arange(s)
    for mask in cases:
        status = classify_blocks(mask, None, pos, pos, bq, bk)
        dense = mask.to_dense(s, s)[0, 0]
        for i in range(status.shape[0]):
            for j in range(status.shape[1]):
                tile = dense[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
                want = EMPTY if not tile.any() else FULL if tile.all() else PARTIAL
                assert int(status[i, j]) == want, (mask, i, j)


def test_empty_blocks_are_never_computed(monkeypatch):
    tiled = importlib.import_module("attnkit.functional.tiled")
    seen = []
    real = tiled.block_forward

    def spy(q, k, v, bias, scale, op="auto", alive=None):
        seen.append((q.shape[2], k.shape[2]))
        return real(q, k, v, bias, scale, op, alive)

    monkeypatch.setattr(tiled, "block_forward", spy)
    s, block = 512, 64
    ids = torch.arange(s) // 128  # four documents of two blocks each
    q, k, v = (torch.randn(1, 2, s, 8) for _ in range(3))
    mask = masks.document(ids) & masks.causal()
    plan = make_plan(q, k, v, mask=mask, bias=None, causal=False, scale=1.0, block_size=block)
    # Per document: 3 of its 2x2 blocks kept (2 diagonal partial, 1 full); 12 of 64 in all.
    assert plan.kept_fraction == pytest.approx(12 / 64)
    out = tiled_attention(q, k, v, mask=mask, block_size=block)
    assert sum(n_keys for _, n_keys in seen) == 12 * block  # keys visited: only kept blocks
    want, _, _ = dense_attention(q, k, v, allowed=mask.to_dense(s, s))
    torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=0)


def test_no_square_tensor_forward_or_backward():
    s = 1024
    q, k, v = (torch.randn(1, 2, s, 16, requires_grad=True) for _ in range(3))
    mask = masks.document(torch.arange(s) // 200) & masks.causal()
    with LargestStorage() as watch:
        out = tiled_attention(q, k, v, mask=mask, block_size=(64, 64))
        out.sum().backward()
    assert watch.nbytes < s * s * 4 / 4, (watch.nbytes, watch.op)


def test_attention_takes_the_tiled_path_for_masks_without_building_them(monkeypatch):
    attention_module = importlib.import_module("attnkit.functional.attention")
    calls = []
    real = attention_module.tiled_core
    monkeypatch.setattr(attention_module, "tiled_core", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(
        masks.Mask, "to_dense", lambda *a, **kw: pytest.fail("the tiled path must not densify the mask")
    )
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    attnkit.attention(q, k, v, mask=masks.sliding_window(5))
    attnkit.attention(q[:, :, :7], k, v, causal=True)
    assert len(calls) == 2
    monkeypatch.undo()
    attnkit.attention(q, k, v, causal=True)  # the fused SDPA path stays as it was
    assert len(calls) == 2


def test_bad_block_size_and_mask_errors():
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    with pytest.raises(ValueError, match=r"block_q must be an int >= 1, got 0"):
        tiled_attention(q, k, v, causal=True, block_size=0)
    with pytest.raises(TypeError, match=r"mask must be an attnkit.masks.Mask or a bool tensor, got str"):
        tiled_attention(q, k, v, mask="causal")
    with pytest.raises(ValueError, match=r"is defined for \(s_q, s_k\) = \(3, 3\), got \(4, 4\)"):
        tiled_attention(q, k, v, mask=masks.from_dense(torch.ones(3, 3, dtype=torch.bool)))


def test_private_cpu_flash_ops_keep_the_signature_attnkit_calls():
    from attnkit.functional import blockwise

    assert blockwise.private_op("_scaled_dot_product_flash_attention_for_cpu", blockwise.FUSED_FORWARD_ARGS) is not None
    assert (
        blockwise.private_op("_scaled_dot_product_flash_attention_for_cpu_backward", blockwise.FUSED_BACKWARD_ARGS)
        is not None
    )
    assert blockwise.private_op("_scaled_dot_product_flash_attention_for_cpu", ("query", "key")) is None
    assert blockwise.private_op("no_such_op_in_any_torch", blockwise.FUSED_FORWARD_ARGS) is None


def test_without_the_private_ops_the_eager_engine_gives_the_same_result(monkeypatch):
    from attnkit.functional import blockwise

    q, k, v = (torch.randn(1, 2, 300, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = masks.causal() & masks.sliding_window(40)
    fused = tiled_attention(q, k, v, mask=mask)
    fused_grads = torch.autograd.grad(fused.sum(), (q, k, v))
    monkeypatch.setattr(blockwise, "_FUSED_FORWARD", None)
    monkeypatch.setattr(blockwise, "_FUSED_BACKWARD", None)
    assert not blockwise.use_fused(q, v)
    eager = tiled_attention(q, k, v, mask=mask)
    eager_grads = torch.autograd.grad(eager.sum(), (q, k, v))
    assert torch.allclose(fused, eager, atol=1e-12)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(fused_grads, eager_grads))


@pytest.mark.parametrize("engine", ["fused", "eager"])
@pytest.mark.parametrize("causal", [False, True])
def test_nan_in_a_query_or_key_reaches_exactly_the_rows_that_may_attend_to_it(engine, causal):
    # The fused CPU kernel reported a row whose every score is NaN as a finite zero (lse 0),
    # and the eager one a NaN total as lse -inf: merged with other key blocks, the NaN vanished.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    q[0, 1, 2, 0] = float("nan")
    k[0, 0, 7, 3] = float("nan")
    out, lse = tiled_core(q, k, v, mask=None, bias=None, causal=causal, scale=0.5, block_size=(4, 3), block_op=engine)
    expected = torch.zeros(1, 2, 12, dtype=torch.bool)
    expected[0, 1, 2] = True
    expected[0, 0, 7:] = True
    if not causal:
        expected[0, 0, :] = True
    assert torch.equal(out.isnan().all(-1), expected)
    assert torch.equal(lse.isnan(), expected)
    allowed = causal_allowed(12, 12) if causal else None
    want, _, want_lse = dense_attention(q.nan_to_num(), k.nan_to_num(), v, allowed=allowed, scale=0.5)
    assert torch.allclose(out[~expected], want[~expected], atol=1e-10)
    assert torch.allclose(lse[~expected], want_lse[~expected], atol=1e-10)
