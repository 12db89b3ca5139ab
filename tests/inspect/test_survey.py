"""`survey_heads` and `attention_map` on a model whose attention is known exactly."""

from __future__ import annotations

import pytest
import torch

from attnkit.inspect.maps import attention_map, resolve_heads, resolve_layer, token_labels
from attnkit.inspect.survey import (
    DESCRIPTIONS,
    induction_scores,
    random_token_ids,
    survey_heads,
    survey_heads_with,
)
from tests.fixtures.known_attention import FakeModel


def test_text_statistics_average_over_texts():
    survey = survey_heads(FakeModel(), ["a b c", "a b c d e f"], period=8)
    stats = survey.statistics
    assert list(stats) == list(DESCRIPTIONS)
    assert stats["entropy"].shape == (1, 2)
    # Head 0 attends to the previous token; on "<s> a b c" query 1's previous token is the first.
    assert stats["previous"][0, 0] == pytest.approx(1.0)
    assert stats["first"][0, 0] == pytest.approx((1 / 3 + 1 / 6) / 2)
    # Head 1 sees no repeated word and parks everything on the first token.
    assert stats["first"][0, 1] == pytest.approx(1.0)
    assert stats["self"].abs().max() == 0
    assert survey.texts == 2 and survey.tokens == 4 + 7


def test_a_survey_whose_parts_are_computed_elsewhere_and_out_of_order_equals_the_one_process_survey():
    texts = ["a b c a b c", "d e f d", "a c e"]
    asked = []

    def backwards(count, survey_one):
        asked.append(count)
        return [survey_one(index) for index in reversed(range(count))]

    single = survey_heads(FakeModel(), texts, source="a", target="c", period=8)
    survey = survey_heads_with(FakeModel(), texts, backwards, source="a", target="c", period=8)
    assert asked == [3]
    assert survey.texts == single.texts and survey.tokens == single.tokens
    for name, values in single.statistics.items():
        assert torch.equal(survey.statistics[name], values), name
    assert torch.equal(survey.pair.mass, single.pair.mass)


def test_the_arguments_are_checked_before_any_part_is_computed():
    def never(count, survey_one):
        raise AssertionError("no part should be computed")

    with pytest.raises(ValueError, match="level must be one of token, word, got 'sentence'"):
        survey_heads_with(FakeModel(), ["a b"], never, level="sentence")


def test_induction_score_runs_repeated_random_tokens_through_the_model():
    survey = survey_heads(FakeModel(), ["a b c"], period=8)
    torch.testing.assert_close(survey.statistics["induction"], torch.tensor([[0.0, 1.0]]))
    assert survey.induction_period == 8


def test_random_token_ids_are_distinct_not_excluded_and_seeded():
    ids = random_token_ids(20, 10, seed=3, exclude=[0, 1])
    assert len(set(ids.tolist())) == 10 and not set(ids.tolist()) & {0, 1}
    assert torch.equal(ids, random_token_ids(20, 10, seed=3, exclude=[0, 1]))
    assert not torch.equal(ids, random_token_ids(20, 10, seed=4, exclude=[0, 1]))
    with pytest.raises(ValueError, match="cannot draw 19 distinct tokens from a vocabulary of 18"):
        random_token_ids(20, 19, seed=0, exclude=[0, 1])


def test_pair_mass_and_its_uniform_baseline():
    survey = survey_heads(FakeModel(), ["The cat saw the dog"], source="dog", target="THE", period=4)
    pair = survey.pair
    # "dog" (position 5) attends to the previous token "the" in head 0, to "<s>" in head 1.
    torch.testing.assert_close(pair.mass, torch.tensor([[1.0, 0.0]]))
    # Spread over the 6 keys it can see, two of which are "the"/"The".
    assert pair.uniform == pytest.approx(2 / 6)
    assert pair.texts == 1
    data = survey.to_dict()
    assert data["pair"]["from"] == "dog" and data["pair"]["values"] == [[1.0, 0.0]]
    assert set(data["statistics"]) == set(DESCRIPTIONS)


def test_pair_skips_texts_without_both_tokens():
    survey = survey_heads(FakeModel(), ["a dog", "the dog", "the cat"], source="dog", target="the", period=4)
    assert survey.pair.texts == 1 and survey.texts == 3


def test_pair_errors_list_the_tokens():
    with pytest.raises(ValueError, match=r"no token 'it'.*0:<s> 1:The 2:cat"):
        survey_heads(FakeModel(), ["The cat"], source="it", target="cat")
    with pytest.raises(ValueError, match="no text contains both 'it' and 'cat'; text 1"):
        survey_heads(FakeModel(), ["The cat", "a cat"], source="it", target="cat")
    with pytest.raises(ValueError, match="both"):
        survey_heads(FakeModel(), ["The cat"], source="it")


@pytest.mark.parametrize("texts, message", [([], "at least one"), (["  "], "text 1 is empty"), (["x", ""], "text 2")])
def test_survey_rejects_empty_input(texts, message):
    with pytest.raises(ValueError, match=message):
        survey_heads(FakeModel(), texts)


def test_survey_leaves_out_an_induction_probe_the_model_cannot_read_with_a_note():
    model = FakeModel()
    model.max_length = 20
    survey = survey_heads(model, ["a b"], period=12)
    assert "induction" not in survey.statistics and "entropy" in survey.statistics
    assert survey.notes == (
        "no induction score: its probe is 12 distinct random tokens repeated twice, 25 tokens, "
        "and fake reads at most 20",
    )
    survey = survey_heads(FakeModel(), ["a b"], period=19)
    assert "induction" not in survey.statistics and "ordinary tokens" in survey.notes[0]
    with pytest.raises(ValueError, match="needs 25 tokens; fake takes 20"):
        induction_scores(model, period=12)


def test_attention_map_of_the_last_layer_and_one_head():
    amap = attention_map(FakeModel(), "The cat sat", layer=-1, head=1)
    assert amap.layer == 0 and amap.heads == [1] and amap.num_layers == 1
    assert amap.tokens == ["<s>", "The", "Ġcat", "Ġsat"]
    assert amap.labels == ["<s>", "The", "cat", "sat"]
    assert amap.weights.shape == (1, 4, 4) and amap.weights.dtype == torch.float32
    data = amap.to_dict()
    assert data["weights"][0][3] == [1.0, 0.0, 0.0, 0.0] and data["model"] == "fake"


def test_attention_map_of_all_heads_and_errors():
    assert attention_map(FakeModel(), "a b", head="all").heads == [0, 1]
    with pytest.raises(ValueError, match="empty"):
        attention_map(FakeModel(), " ")
    with pytest.raises(ValueError, match="more than 64"):
        attention_map(FakeModel(), "a " * 70)


def test_resolve_layer_and_heads_give_the_valid_range():
    assert resolve_layer(-1, 30) == 29 and resolve_layer(0, 30) == 0 and resolve_layer(-30, 30) == 0
    with pytest.raises(ValueError, match=r"30 layers, 0\.\.29 \(or -30\.\.-1"):
        resolve_layer(30, 30)
    assert resolve_heads("all", 3) == [0, 1, 2] and resolve_heads("-1", 3) == [2] and resolve_heads(1, 3) == [1]
    with pytest.raises(ValueError, match=r"9 heads per layer, 0\.\.8"):
        resolve_heads("9", 9)
    with pytest.raises(ValueError, match='number or "all"'):
        resolve_heads("first", 9)


def test_token_labels_read_like_the_text():
    text = "Hi  there\n."
    tokens = ["[CLS]", "hi", "Ġ", "Ġthere", "Ċ", ".", "[SEP]"]
    offsets = [(0, 0), (0, 2), (2, 3), (3, 9), (9, 10), (10, 11), (0, 0)]
    assert token_labels(text, tokens, offsets) == ["[CLS]", "Hi", "␣", "there", "\\n", ".", "[SEP]"]
