"""Per-head statistics on hand-made attention maps whose answers are known."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.inspect import heads


def stack(*maps: torch.Tensor) -> torch.Tensor:
    """Maps ``[s, s]`` as one layer of heads ``[1, len(maps), s, s]``."""
    return torch.stack(maps)[None]


def previous_map(s: int) -> torch.Tensor:
    """Every query attends to the token before it (query 0 to itself)."""
    w = torch.zeros(s, s)
    w[0, 0] = 1
    w[torch.arange(1, s), torch.arange(s - 1)] = 1
    return w


def sink_map(s: int) -> torch.Tensor:
    w = torch.zeros(s, s)
    w[:, 0] = 1
    return w


def causal_uniform(s: int) -> torch.Tensor:
    return torch.ones(s, s).tril() / torch.arange(1, s + 1)[:, None]


def test_one_hot_patterns_are_recognised():
    s = 6
    w = stack(previous_map(s), sink_map(s), torch.eye(s))
    stats = heads.head_statistics(w)
    assert set(stats) == set(heads.STATISTICS)
    torch.testing.assert_close(stats["previous"], torch.tensor([[1.0, 1 / 5, 0.0]]))
    torch.testing.assert_close(stats["first"], torch.tensor([[1 / 5, 1.0, 0.0]]))
    torch.testing.assert_close(stats["self"], torch.tensor([[0.0, 0.0, 1.0]]))
    torch.testing.assert_close(stats["entropy"], torch.zeros(1, 3))
    # Sink: query i is i tokens from key 0, mean over queries 1..5 is 3.
    torch.testing.assert_close(stats["distance"], torch.tensor([[1.0, 3.0, 0.0]]))


def test_entropy_in_bits_of_causal_uniform_attention():
    s = 5
    got = heads.entropy(stack(causal_uniform(s)))
    # Query i spreads evenly over i + 1 keys: log2(i + 1) bits, averaged over queries 1..4.
    expected = sum(math.log2(i + 1) for i in range(1, s)) / (s - 1)
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_entropy_of_a_half_half_split_is_one_bit():
    w = torch.zeros(4, 4)
    w[:, :2] = 0.5
    assert heads.entropy(stack(w)).item() == pytest.approx(1.0)


def test_mean_distance_of_bidirectional_uniform_attention():
    s = 4
    w = torch.full((s, s), 1 / s)
    # Query i: mean of |i - j| over j; queries 1, 2, 3 give 1, 1, 1.5.
    assert heads.mean_distance(stack(w)).item() == pytest.approx((1 + 1 + 1.5) / 3)


def test_statistics_keep_layers_and_heads_apart():
    s = 5
    w = torch.stack([stack(previous_map(s), torch.eye(s))[0], stack(torch.eye(s), previous_map(s))[0]])
    prev = heads.previous_token_mass(w)  # [2 layers, 2 heads]
    torch.testing.assert_close(prev, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


def induction_map(start: int, period: int) -> torch.Tensor:
    """A perfect induction head on [prefix, r, r]: the second half attends to the token after
    the earlier occurrence; everything else to the first token."""
    s = start + 2 * period
    w = sink_map(s)
    for i in range(period):
        q = start + period + i
        w[q] = 0
        w[q, start + i + 1] = 1
    return w


def test_induction_score_of_a_perfect_induction_head_and_of_others():
    start, period = 1, 4
    s = start + 2 * period
    w = stack(induction_map(start, period), previous_map(s), sink_map(s))
    got = heads.induction_score(w, start=start, period=period)
    torch.testing.assert_close(got, torch.tensor([[1.0, 0.0, 0.0]]))


def test_induction_score_at_half_strength():
    start, period = 0, 3
    w = 0.5 * induction_map(start, period) + 0.5 * sink_map(2 * period)
    assert heads.induction_score(stack(w), start=start, period=period).item() == pytest.approx(0.5)


def test_induction_score_rejects_segments_that_do_not_fit():
    with pytest.raises(ValueError, match="needs 9 tokens, got 8"):
        heads.induction_score(stack(sink_map(8)), start=1, period=4)


def test_token_mass_sums_keys_and_averages_queries():
    w = torch.zeros(5, 5)
    w[3, 1], w[3, 2], w[3, 3] = 0.5, 0.25, 0.25
    w[4, 1], w[4, 4] = 0.1, 0.9
    got = heads.token_mass(stack(w), queries=[3, 4], keys=[1, 2])
    assert got.item() == pytest.approx(((0.5 + 0.25) + 0.1) / 2)
    with pytest.raises(ValueError, match="keys"):
        heads.token_mass(stack(w), queries=[3], keys=[5])


def test_find_token_ignores_markers_and_case():
    tokens = ["The", "Ġanimal", "Ġdidn", "'t", "Ġcross", "Ġthe", "Ġroad", "Ġbecause", "Ġit", "Ġwas"]
    assert heads.find_token(tokens, "it") == [8]
    assert heads.find_token(tokens, "THE") == [0, 5]
    assert heads.find_token(["[CLS]", "the", "##ir", "▁Animal"], "animal") == [3]
    assert heads.find_token(["[CLS]", "the", "##ir"], "ir") == [2]


def test_find_token_lists_the_tokens_when_missing():
    with pytest.raises(ValueError, match=r"no token 'dog'.*0:the 1:cat"):
        heads.find_token(["Ġthe", "Ġcat"], "dog")


def test_rank_heads_orders_by_score():
    scores = torch.tensor([[0.1, 0.9], [0.5, 0.9]])
    assert heads.rank_heads(scores, top=3) == [(0, 1, pytest.approx(0.9)), (1, 1, pytest.approx(0.9)), (1, 0, 0.5)]
    assert heads.rank_heads(scores, descending=False)[0][:2] == (0, 0)


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 3, 4), (1, 1, 1, 1)])
def test_bad_shapes_are_rejected(shape):
    with pytest.raises(ValueError, match="weights|tokens"):
        heads.entropy(torch.ones(shape))
