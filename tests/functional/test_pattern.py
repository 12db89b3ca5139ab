"""attnkit.functional.pattern: the pattern alone equals the reference engine's weights, bit
for bit, and the mask's additive bias is built once and shared."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.functional import reference_attention
from attnkit.functional._validate import dense_allowed
from attnkit.functional.pattern import additive_mask, attention_pattern

B, H, H_KV, D = 2, 6, 2, 8


def _qkv(s_q: int, s_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(s_q * 100 + s_k)
    q = torch.randn(B, H, s_q, D, generator=gen)
    k = torch.randn(B, H_KV, s_k, D, generator=gen)
    v = torch.randn(B, H_KV, s_k, D, generator=gen)
    return q, k, v


def _empty_row_mask(s_q: int, s_k: int) -> torch.Tensor:
    allowed = torch.rand(B, 1, s_q, s_k, generator=torch.Generator().manual_seed(7)) > 0.4
    allowed[1, 0, 2] = False  # a query with nothing to attend to
    return allowed


CASES = {
    "no mask": (None, False, 5, 7),
    "causal": (None, True, 7, 7),
    "causal, cached keys": (None, True, 3, 9),
    "sliding window": (masks.sliding_window(2), True, 6, 6),
    "bool mask with an empty row": ("empty", False, 5, 6),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("scale", [0.125, 1.0])
def test_pattern_equals_the_reference_engines_weights(case, scale):
    mask, causal, s_q, s_k = CASES[case]
    mask = _empty_row_mask(s_q, s_k) if mask == "empty" else mask
    q, k, v = _qkv(s_q, s_k)
    allowed = dense_allowed(mask, causal=causal, b=B, h=H, s_q=s_q, s_k=s_k, device=q.device)
    expected = reference_attention(q, k, v, allowed=allowed, bias=None, scale=scale, score="scaled_dot").weights
    seen = []
    weights, replaced = attention_pattern(
        q, k, mask=mask, causal=causal, scale=scale, edit_scores=lambda s: seen.append(s.clone()) or s
    )
    assert torch.equal(weights, expected) and not replaced
    assert not weights.isnan().any()
    # The scores shown to the edit are scaled, -inf where the mask forbids.
    scores = (q.view(B, H_KV, -1, s_q, D) @ k[:, :, None].transpose(-1, -2)).view(B, H, s_q, s_k) * scale
    if allowed is not None:
        scores = torch.where(allowed, scores, float("-inf"))
    torch.testing.assert_close(seen[0], scores, rtol=0, atol=1e-6)


def test_replaced_scores_go_through_the_softmax_as_they_are():
    q, k, _ = _qkv(4, 4)
    uniform = torch.zeros(B, H, 4, 4)
    weights, replaced = attention_pattern(q, k, mask=None, causal=True, scale=0.5, edit_scores=lambda s: uniform)
    assert replaced and torch.equal(weights, torch.full((B, H, 4, 4), 0.25))


def test_the_additive_bias_is_built_once_per_mask():
    sizes = {"b": 1, "h": 3, "s_q": 5, "s_k": 5, "device": torch.device("cpu"), "dtype": torch.float32}
    first, empty = additive_mask(None, causal=True, **sizes)
    assert first is not None and not empty
    assert torch.equal(first[0, 0], torch.zeros(5, 5).masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf")))
    assert additive_mask(None, causal=True, **sizes)[0] is first  # every layer shares it
    assert additive_mask(None, causal=False, **sizes) == (None, False)
    padding = torch.tensor([[True, True, True, False, False]])[:, None, None]  # [1, 1, 1, 5]
    padded, _ = additive_mask(padding, causal=True, **sizes)
    assert padded is not None and additive_mask(padding, causal=True, **sizes)[0] is padded
    assert padded[..., 3:].isinf().all()
    padding[..., 3] = True  # changed in place: built again
    rebuilt, _ = additive_mask(padding, causal=True, **sizes)
    assert rebuilt is not padded and not rebuilt[..., 4, 3].isinf()


@pytest.mark.parametrize("write", ["data", "numpy"])
def test_a_mask_changed_behind_its_version_counter_is_built_again(write):
    sizes = {"b": 1, "h": 3, "s_q": 5, "s_k": 5, "device": torch.device("cpu"), "dtype": torch.float32}
    padding = torch.tensor([[True, True, True, False, False]])[:, None, None]  # [1, 1, 1, 5]
    padded, _ = additive_mask(padding, causal=False, **sizes)
    if write == "data":
        padding.data[..., 3] = True
    else:
        padding.numpy()[..., 3] = True
    rebuilt, _ = additive_mask(padding, causal=False, **sizes)
    assert padded is not None and padded[..., 3].isinf().all()
    assert rebuilt is not None and not rebuilt[..., 3].isinf().any() and rebuilt[..., 4].isinf().all()


def test_a_mask_reading_a_tensor_its_caller_holds_follows_the_tensor():
    sizes = {"b": 1, "h": 3, "s_q": 5, "s_k": 5, "device": torch.device("cpu"), "dtype": torch.float32}
    keep = torch.tensor([[True, True, True, False, False]])
    mask = masks.from_dense(keep[:, None, None, :].expand(1, 1, 5, 5))
    before, _ = additive_mask(mask, causal=False, **sizes)
    keep[0, 3] = True
    after, _ = additive_mask(mask, causal=False, **sizes)
    assert before is not None and before[..., 3].isinf().all()
    assert after is not None and torch.equal(
        after, torch.zeros(1, 1, 5, 5).masked_fill(~mask.to_dense(5, 5), float("-inf"))
    )
    assert not after[..., 3].isinf().any()


def test_a_bias_and_a_score_callable_as_in_the_reference_engine():
    q, k, v = _qkv(5, 5)
    bias = torch.randn(1, H, 5, 5, generator=torch.Generator().manual_seed(3))

    def capped(q, k):
        return torch.tanh(q @ k.repeat_interleave(H // H_KV, 1).transpose(-1, -2) / 4) * 4

    allowed = dense_allowed(None, causal=True, b=B, h=H, s_q=5, s_k=5, device=q.device)
    for score, scale in (("scaled_dot", 0.3), (capped, 1.0)):
        expected = reference_attention(q, k, v, allowed=allowed, bias=bias, scale=scale, score=score).weights
        weights, _ = attention_pattern(q, k, mask=None, causal=True, scale=scale, bias=bias, score=score)
        assert torch.equal(weights, expected)


def test_a_large_bias_is_not_kept_after_the_pass(monkeypatch):
    from attnkit.functional import pattern

    monkeypatch.setattr(pattern, "_KEPT_BYTES", 16 * 4)
    sizes = {"b": 1, "h": 1, "s_q": 5, "s_k": 5, "device": torch.device("cpu"), "dtype": torch.float32}
    first, _ = additive_mask(None, causal=True, **sizes)  # 25 floats: over the limit
    again, _ = additive_mask(None, causal=True, **sizes)
    assert first is not again and torch.equal(first, again)
