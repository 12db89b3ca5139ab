"""Readable tokens and word maps on the real models, in English and Korean."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect.maps import attention_map, readable_run

TEXTS = {
    "en": "The animal didn't cross the road because it was too tired.",
    "ko": "어제 밤에 배가 고파서 피자를 먹었다",
}
WORDS = {
    "en": ["The", "animal", "didn't", "cross", "the", "road", "because", "it", "was", "too", "tired", "."],
    "ko": ["어제", "밤에", "배가", "고파서", "피자를", "먹었다"],
}


@pytest.fixture(scope="module")
def loaded(smollm2_path, minilm_path):
    return {"smollm2": models.load("smollm2"), "minilm": models.load("minilm")}


def joined(text: str, spans) -> str:
    """The text the spans cover, in order, each character once (pieces of one character
    share its span)."""
    out, pos = [], 0
    for start, end in spans:
        out.append(text[max(start, pos) : end])
        pos = max(pos, end)
    return "".join(out)


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("name", ["smollm2", "minilm"])
def test_spans_join_back_to_the_text_and_word_maps_aggregate_tokens(loaded, name, lang):
    model, text = loaded[name], TEXTS[lang]
    amap = attention_map(model, text, layer=-1, head="all")
    tokens = amap.readable
    assert len(tokens) == len(amap.tokens) == amap.weights.shape[-1]
    spans = [t.span for t in tokens if not t.special]
    # Every token but the special ones stands for text; BERT's offsets leave out spaces.
    assert all(t.span is not None for t in tokens if not t.special)
    expected = text if name == "smollm2" else "".join(text.split())
    assert joined(text, spans) == expected
    assert all(t.text == text[t.span[0] : t.span[1]] for t in tokens if t.span is not None)
    assert not any("\ufffd" in t.label or "\ufffd" in t.text for t in tokens)
    if name == "minilm":
        assert tokens[0].label == "[CLS]" and tokens[-1].label == "[SEP]"

    words = amap.by_words()
    assert [w.label for w in words.words if w.span is not None] == WORDS[lang]
    assert words.labels == [w.label for w in words.words]
    n = len(words.words)
    assert words.weights.shape == (model.num_heads, n, n)
    torch.testing.assert_close(words.weights.sum(-1), torch.ones(model.num_heads, n), atol=1e-5, rtol=0)
    # By hand: the sum over the key word's tokens, averaged over the query word's tokens.
    hand = torch.zeros(model.num_heads, n, n)
    for a, query_word in enumerate(words.words):
        for b, key_word in enumerate(words.words):
            for i in query_word.token_indices:
                for j in key_word.token_indices:
                    hand[:, a, b] += amap.weights[:, i, j]
            hand[:, a, b] /= len(query_word.token_indices)
    torch.testing.assert_close(words.weights, hand, atol=1e-6, rtol=0)


def test_smollm2_spells_korean_in_44_byte_pieces(loaded):
    amap = attention_map(loaded["smollm2"], TEXTS["ko"], level="word")
    assert len(amap.tokens) == 44 and all(t.partial for t in amap.readable)
    assert [t.label for t in amap.readable[12:15]] == ["배(1/3)", "배(2/3)", "배(3/3)"]
    assert [len(w.token_indices) for w in amap.words] == [6, 6, 6, 9, 9, 8]
    # The same labels when the run had only ids: the text is rebuilt from the bytes.
    model = loaded["smollm2"]
    from_ids = readable_run(model, model.run(model.tokenize(TEXTS["ko"]).ids, return_weights=[0], heads=[0]))
    assert from_ids.text == TEXTS["ko"] and from_ids.labels == [t.label for t in amap.readable]


def test_minilm_shows_the_text_behind_jamo_and_unk(loaded):
    amap = attention_map(loaded["minilm"], TEXTS["ko"])
    assert amap.tokens[1:3] == ["ᄋ", "##ᅥ"] and amap.labels[1:3] == ["어(1/2)", "어(2/2)"]
    assert amap.tokens[-2] == "[UNK]" and amap.labels[-2] == "먹었다" and not amap.readable[-2].special
    words = readable_run(
        loaded["minilm"], loaded["minilm"].run(TEXTS["ko"], return_weights=[0]), TEXTS["ko"], level="word"
    )
    assert words.labels == ["[CLS]", *WORDS["ko"], "[SEP]"] and words.attentions[0].shape == (1, 12, 8, 8)


def test_sequence_labels_read_as_the_text_and_by_words():
    from attnkit.inspect.maps import sequence_labels

    tokens = ["The", " ani", "mal", " sat", "."]
    assert sequence_labels(object(), tokens, None, None, None) == ["The", "ani", "mal", "sat", "."]
    assert sequence_labels(object(), tokens, None, None, None, level="word") == ["The", "animal", "animal", "sat", "."]
    with pytest.raises(ValueError, match="level must be one of token, word, got 'line'"):
        sequence_labels(object(), tokens, None, None, None, level="line")
