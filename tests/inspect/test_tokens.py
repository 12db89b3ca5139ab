"""Readable tokens: the text each token stands for, partial characters marked, never `�`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tokenizers import decoders

from attnkit.inspect.tokens import (
    ReadableToken,
    decode_tokens,
    readable_label,
    readable_tokens,
    special_token_ids,
    token_scheme,
)

# SmolLM2's byte-level tokens of "어제 밤에": three tokens per syllable, one per UTF-8 byte;
# "Ġë" is the space and the first byte of "밤". Offsets as the tokenizer gives them.
KO_TEXT = "어제 밤에"
KO_TOKENS = ["ì", "ĸ", "´", "ì", "ł", "ľ", "Ġë", "°", "¤", "ì", "Ĺ", "Ĳ"]
KO_OFFSETS = [(0, 1)] * 3 + [(1, 2)] * 3 + [(2, 4), (3, 4), (3, 4)] + [(4, 5)] * 3


def test_byte_level_pieces_show_the_character_they_belong_to():
    tokens = readable_tokens(KO_TEXT, KO_TOKENS, KO_OFFSETS)
    assert [t.label for t in tokens] == [
        "어(1/3)",
        "어(2/3)",
        "어(3/3)",
        "제(1/3)",
        "제(2/3)",
        "제(3/3)",
        "밤(1/3)",
        "밤(2/3)",
        "밤(3/3)",
        "에(1/3)",
        "에(2/3)",
        "에(3/3)",
    ]
    assert all(t.partial and not t.special for t in tokens)
    # The token with the space keeps it in its text and span; the label drops it.
    assert tokens[6] == ReadableToken("Ġë", " 밤", (2, 4), partial=True, part=(1, 3))


def test_special_tokens_show_as_themselves_and_unk_as_the_text():
    text = "Hi  there\n먹었다"
    tokens = ["[CLS]", "hi", "Ġ", "Ġthere", "Ċ", "[UNK]", "[SEP]"]
    offsets = [(0, 0), (0, 2), (2, 3), (3, 9), (9, 10), (10, 13), (0, 0)]
    special = [True, False, False, False, False, True, True]
    readable = readable_tokens(text, tokens, offsets, special=special)
    assert [t.label for t in readable] == ["[CLS]", "Hi", "␣", "there", "\\n", "먹었다", "[SEP]"]
    assert [t.special for t in readable] == [True, False, False, False, False, False, True]
    assert readable[0].span is None and readable[5].text == "먹었다" and not readable[5].partial
    assert json.loads(json.dumps(readable[0].to_dict())) == {
        "token": "[CLS]",
        "text": "[CLS]",
        "span": None,
        "partial": False,
        "part": None,
        "special": True,
        "label": "[CLS]",
    }


def test_readable_label():
    assert readable_label(" cat ") == "cat"
    assert readable_label("  ") == "␣␣" and readable_label("\n\t") == "\\n\\t"
    assert readable_label("배", partial=True, part=(2, 3)) == "배(2/3)"
    assert readable_label("밤에", partial=True) == "밤에(part)"


def test_bad_offsets_are_errors():
    with pytest.raises(ValueError, match="need one offset and one special flag per token, got 2 tokens, 1 offsets"):
        readable_tokens("ab", ["a", "b"], [(0, 1)])
    with pytest.raises(ValueError, match=r"token 0 \('a'\) has span \(0, 9\) outside the text of 2 characters"):
        readable_tokens("ab", ["a"], [(0, 9)])


def test_byte_level_ids_decode_to_the_text_and_its_spans():
    text, spans = decode_tokens(KO_TOKENS, scheme="byte-level")
    assert text == KO_TEXT and spans == KO_OFFSETS
    # Newlines, tabs and spaces are Ċ, ĉ, Ġ; special tokens stand for no text.
    text, spans = decode_tokens(
        ["<|im_start|>", "user", "Ċ", "Hi", "Ġthere", "ĉ"],
        scheme="byte-level",
        special=[True, False, False, False, False, False],
    )
    assert text == "user\nHi there\t" and spans == [None, (0, 4), (4, 5), (5, 7), (7, 13), (13, 14)]


def test_ids_cut_inside_a_character_never_show_the_replacement_character():
    text, spans = decode_tokens(["a", "ì", "ĸ"], scheme="byte-level")  # "a" and 2 of the 3 bytes of "어"
    assert text == "a\\xec\\x96" and spans == [(0, 1), (1, 5), (5, 9)]
    assert "\ufffd" not in "".join(t.label for t in readable_tokens(text, ["a", "ì", "ĸ"], spans))


def test_wordpiece_and_metaspace_ids_decode():
    text, spans = decode_tokens(
        ["[CLS]", "the", "ani", "##mal", "[SEP]"], scheme="wordpiece", special=[True, False, False, False, True]
    )
    assert text == "the animal" and spans == [None, (0, 3), (3, 7), (7, 10), None]
    # SentencePiece: ▁ is a space; <0xNN> tokens are bytes ("배" is EB B0 B0).
    text, spans = decode_tokens(["▁The", "▁", "<0xEB>", "<0xB0>", "<0xB0>"], scheme="metaspace")
    assert text == " The 배" and spans == [(0, 4), (4, 5), (5, 6), (5, 6), (5, 6)]


def test_scheme_and_special_ids_from_the_real_tokenizers(smollm2_path, minilm_path):
    from attnkit.models import Tokenizer

    smollm2 = Tokenizer.from_file(smollm2_path / "tokenizer.json").backend
    minilm = Tokenizer.from_file(minilm_path / "tokenizer.json").backend
    assert token_scheme(smollm2) == "byte-level" and token_scheme(minilm) == "wordpiece"
    assert token_scheme(object()) == "plain"
    assert {0, 1, 2} <= special_token_ids(smollm2)  # <|endoftext|>, <|im_start|>, <|im_end|>
    assert {100, 101, 102} <= special_token_ids(minilm)  # [UNK], [CLS], [SEP]


def test_scheme_of_sentencepiece_style_decoders():
    llama2 = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    assert token_scheme(SimpleNamespace(decoder=llama2)) == "metaspace"
    assert token_scheme(SimpleNamespace(decoder=decoders.Metaspace())) == "metaspace"
    assert token_scheme(SimpleNamespace(decoder=None)) == "plain"
