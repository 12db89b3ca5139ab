"""Additive (Bahdanau) and Luong attention, on their own and as the score of
MultiHeadAttention."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import AdditiveAttention, AttentionConfig, AttentionContext, LuongAttention, MultiHeadAttention
from tests.nn.helpers import assert_close


def _loop_context(score_fn, query, keys, values, mask=None):
    """One decoder state at a time: e_j = score(s, h_j), α = softmax(e), c = Σ α_j v_j."""
    contexts, weights = [], []
    for b in range(query.shape[0]):
        e = torch.stack([score_fn(query[b], keys[b, j]) for j in range(keys.shape[1])])
        if mask is not None:
            e = e.masked_fill(~mask[b], float("-inf"))
        alpha = torch.softmax(e, dim=0)
        weights.append(alpha)
        contexts.append(alpha @ values[b])
    return torch.stack(contexts), torch.stack(weights)


def test_additive_attention_matches_bahdanau_formula() -> None:
    torch.manual_seed(0)
    attn = AdditiveAttention(6, key_dim=5, hidden_dim=7)
    query, keys, values = torch.randn(3, 6), torch.randn(3, 4, 5), torch.randn(3, 4, 2)
    mask = torch.tensor([[True] * 4, [True, True, False, False], [True, False, False, False]])

    def score(s, h):
        return attn.v.weight[0] @ torch.tanh(attn.query_proj.weight @ s + attn.key_proj.weight @ h)

    result = attn(query, keys, values, mask=mask)
    assert isinstance(result, AttentionContext)
    expected_context, expected_weights = _loop_context(score, query, keys, values, mask)
    assert result.context.shape == (3, 2) and result.weights.shape == (3, 4)
    assert_close(result.context, expected_context)
    assert_close(result.weights, expected_weights)


@pytest.mark.parametrize("kind", ["dot", "general", "concat"])
def test_luong_scores_match_the_paper(kind: str) -> None:
    torch.manual_seed(1)
    key_dim = 6 if kind == "dot" else 5
    attn = LuongAttention(6, key_dim, kind=kind, **({"hidden_dim": 4} if kind == "concat" else {}))

    def score(s, h):
        if kind == "dot":
            return s @ h
        if kind == "general":
            return s @ attn.w.weight @ h
        return attn.v.weight[0] @ torch.tanh(attn.w.weight @ torch.cat((s, h)))

    query, keys = torch.randn(2, 6), torch.randn(2, 5, key_dim)
    result = attn(query, keys)  # values default to the keys
    expected_context, expected_weights = _loop_context(score, query, keys, keys)
    assert_close(result.context, expected_context)
    assert_close(result.weights, expected_weights)


def test_several_queries_at_once_equal_one_at_a_time() -> None:
    torch.manual_seed(2)
    attn = LuongAttention(4, kind="general")
    queries, keys = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    together = attn(queries, keys)
    assert together.context.shape == (2, 3, 4) and together.weights.shape == (2, 3, 5)
    for i in range(3):
        alone = attn(queries[:, i], keys)
        assert_close(together.context[:, i], alone.context)
        assert_close(together.weights[:, i], alone.weights)


@pytest.mark.parametrize("make_score", [lambda d: AdditiveAttention(d), lambda d: LuongAttention(d, kind="general")])
def test_as_the_score_of_multi_head_attention(make_score) -> None:
    torch.manual_seed(3)
    e, h = 12, 3
    score = make_score(e // h)
    m = MultiHeadAttention(AttentionConfig(e, h, num_kv_heads=1), score_module=score)
    assert any(p is next(score.parameters()) for p in m.parameters())  # the score's weights are trained too
    x = torch.randn(2, 4, e)
    result = m(x, causal=True, return_weights=True)
    q = m.q_proj(x).view(2, 4, h, -1).transpose(1, 2)
    k = m.k_proj(x).view(2, 4, 1, -1).transpose(1, 2)
    scores = score.scores(q, k.expand(2, h, 4, -1))  # every query head against the one key head
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    expected = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)  # unscaled
    assert_close(result.weights, expected)


def test_errors() -> None:
    attn = AdditiveAttention(4, key_dim=3)
    with pytest.raises(ValueError, match=r"query must be \[b, d_q\] or \[b, s_q, d_q\] with d_q = 4"):
        attn(torch.randn(2, 5), torch.randn(2, 6, 3))
    with pytest.raises(ValueError, match=r"keys must be \[b, s_k, d_k\] with d_k = 3"):
        attn(torch.randn(2, 4), torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match="same batch size"):
        attn(torch.randn(2, 4), torch.randn(3, 6, 3))
    with pytest.raises(TypeError, match="bool"):
        attn(torch.randn(2, 4), torch.randn(2, 6, 3), mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match=r"mask must be \[b, s_k\]"):
        attn(torch.randn(2, 4), torch.randn(2, 6, 3), mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match='kind="dot" needs query_dim == key_dim'):
        LuongAttention(4, 3, kind="dot")
    with pytest.raises(ValueError, match="kind must be"):
        LuongAttention(4, kind="bilinear")
    with pytest.raises(ValueError, match="hidden_dim is only used"):
        LuongAttention(4, kind="general", hidden_dim=3)
    with pytest.raises(ValueError, match="query_dim = key_dim = 4"):
        MultiHeadAttention(AttentionConfig(8, 2), score_module=AdditiveAttention(8))
