"""SentencePiece's word-start mark alone (T5's token "▁") reads as a space wherever it is,
from a real Metaspace tokenizer's offsets: at the start of the text its span is the first
word's first character, between words the space."""

from __future__ import annotations

from attnkit.inspect.tokens import readable_tokens
from attnkit.inspect.words import word_groups


def encoded(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Tokens and offsets of a Unigram tokenizer with a Metaspace pre-tokenizer, as T5's."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = [("<unk>", 0.0), ("▁", -2.0), ("a", -3.0), ("▁cat", -1.0), ("배", -3.0), ("▁the", -1.0)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=0))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    encoding = tokenizer.encode(text)
    return encoding.tokens, encoding.offsets


def test_the_word_start_mark_alone_reads_as_a_space_at_the_start_and_between_words() -> None:
    tokens, offsets = encoded("a cat a")
    assert tokens == ["▁", "a", "▁cat", "▁", "a"]
    assert offsets[0] == offsets[1] == (0, 1)  # the first mark spans "a", which it does not hold
    readable = readable_tokens("a cat a", tokens, offsets)
    assert [t.label for t in readable] == ["␣", "a", "cat", "␣", "a"]
    assert not any(t.partial for t in readable)
    # Each mark belongs to the word it starts.
    assert [w.token_indices for w in word_groups("a cat a", readable)] == [(0, 1), (2,), (3, 4)]


def test_two_korean_words_keep_their_marks() -> None:
    tokens, offsets = encoded("배 배")
    readable = readable_tokens("배 배", tokens, offsets)
    assert [t.label for t in readable] == ["␣", "배", "␣", "배"]
