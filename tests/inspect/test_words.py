"""Words: grouping tokens into the words of the text, and word-level attention."""

from __future__ import annotations

import pytest
import torch

from attnkit.inspect.tokens import readable_tokens
from attnkit.inspect.words import Word, aggregate, group_matrix, text_words, word_groups


def words_of(text: str) -> list[str]:
    return [text[start:end] for start, end in text_words(text)]


def test_words_are_whitespace_and_punctuation_units():
    assert words_of("어제 밤에 배가 고파서 피자를 먹었다") == ["어제", "밤에", "배가", "고파서", "피자를", "먹었다"]
    assert words_of("The animal didn't cross, it was tired...") == [
        "The",
        "animal",
        "didn't",
        "cross",
        ",",
        "it",
        "was",
        "tired",
        "...",
    ]
    assert words_of("pi is 3.14, a well-known attention_map (café)") == [
        "pi",
        "is",
        "3.14",
        ",",
        "a",
        "well-known",
        "attention_map",
        "(",
        "café",
        ")",
    ]


def test_word_groups_of_tokens():
    # Byte-level tokens of "Hi  there.\n배가\n": a lone space token, newlines, and "배가" as
    # six one-byte tokens, between special tokens.
    text = "Hi  there.\n배가\n"
    tokens = ["<s>", "Hi", "Ġ", "Ġthere", ".", "Ċ", "ë", "°", "°", "ê", "°", "Ģ", "Ċ", "</s>"]
    offsets = [(0, 0), (0, 2), (2, 3), (3, 9), (9, 10), (10, 11), *[(11, 12)] * 3, *[(12, 13)] * 3, (13, 14), (0, 0)]
    words = word_groups(text, readable_tokens(text, tokens, offsets))
    assert words == [
        Word("<s>", None, (0,)),
        Word("Hi", (0, 2), (1,)),
        Word("there", (4, 9), (2, 3)),  # white space joins the next word...
        Word(".", (9, 10), (4,)),
        Word("배가", (11, 13), (5, 6, 7, 8, 9, 10, 11, 12)),  # ... or the previous one at the end
        Word("</s>", None, (13,)),
    ]
    assert [w.label for w in words] == ["<s>", "Hi", "there", ".", "배가", "</s>"]
    assert words[4].to_dict() == {"text": "배가", "span": [11, 13], "tokens": [5, 6, 7, 8, 9, 10, 11, 12]}
    # Only white space: a word of its own.
    assert word_groups(" ", readable_tokens(" ", ["Ġ"], [(0, 1)])) == [Word(" ", (0, 1), (0,))]


def test_aggregate_matches_a_hand_computed_word_map():
    # Four tokens, three words: [0], [1, 2], [3].
    weights = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.5, 0.5, 0.0, 0.0],
            [0.2, 0.3, 0.5, 0.0],
            [0.1, 0.2, 0.3, 0.4],
        ]
    )
    groups = [[0], [1, 2], [3]]
    # Word 1 as query: mean of token rows 1 and 2 -> on word 0: (0.5 + 0.2) / 2 = 0.35;
    # on word 1: ((0.5 + 0.0) + (0.3 + 0.5)) / 2 = 0.65; on word 2: 0.
    # Word 2 as query (token 3): 0.1, 0.2 + 0.3 = 0.5, 0.4.
    expected = torch.tensor(
        [
            [1.0, 0.0, 0.0],
            [0.35, 0.65, 0.0],
            [0.1, 0.5, 0.4],
        ]
    )
    word_map = aggregate(weights, groups)
    torch.testing.assert_close(word_map, expected)
    torch.testing.assert_close(word_map.sum(-1), torch.ones(3))
    # Words work as groups; leading dimensions are kept.
    as_words = [Word(str(i), None, tuple(g)) for i, g in enumerate(groups)]
    batched = aggregate(torch.stack([weights, weights.flip(-1)])[None], as_words)  # [1, 2, 3, 3]
    assert batched.shape == (1, 2, 3, 3)
    torch.testing.assert_close(batched[0, 0], expected)
    torch.testing.assert_close(batched.sum(-1), torch.ones(1, 2, 3))


def test_aggregate_random_maps_keep_rows_summing_to_one_and_fully_masked_rows_at_zero():
    weights = torch.softmax(torch.randn(2, 3, 7, 7, dtype=torch.float64), dim=-1)
    weights[0, 0, 4] = 0  # a query that may attend to nothing
    word_map = aggregate(weights, [[0, 1], [2], [3, 4, 5], [6]])
    assert word_map.dtype == torch.float64
    sums = word_map.sum(-1)
    sums[0, 0, 2] += 1 / 3  # the masked token is one of three in word 2
    torch.testing.assert_close(sums, torch.ones(2, 3, 4, dtype=torch.float64))


def test_aggregate_cross_attention_with_key_groups():
    weights = torch.tensor([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]])  # 2 queries, 3 keys
    torch.testing.assert_close(aggregate(weights, [[0, 1]], key_groups=[[0, 2], [1]]), torch.tensor([[0.75, 0.25]]))


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[0, 1], [1, 2]], r"each of the 3 tokens exactly once; missing \[\], in several groups \[1\]"),
        ([[0], [2]], r"missing \[1\]"),
        ([[0, 1, 2], []], "group 1 has no tokens"),
        ([[0, 1, 5]], r"token indices \[0, 1, 5\], outside 0\.\.2"),
    ],
)
def test_groups_must_partition_the_tokens(groups, message):
    with pytest.raises(ValueError, match=message):
        group_matrix(groups, 3)
    with pytest.raises(ValueError, match=r"weights must be \[\.\.\., s_q, s_k\]"):
        aggregate(torch.ones(3), [[0, 1, 2]])
