"""Attention between words rather than sub-word tokens.

People ask which *word* attends to which ("does 배가 attend to 고파서?"), while models
attend between tokens, and a word may be many tokens (SmolLM2 spells "고파서" with nine).
:func:`word_groups` groups a text's tokens into words — the whitespace and punctuation
units of the text; for Korean, an eojeol such as "고파서" — and :func:`aggregate` turns a
token map into a word map: for each query word, the attention to a key word is the sum
over the key word's tokens, averaged over the query word's tokens. Rows still sum to 1
(or 0 for a fully masked row), because every token belongs to exactly one word.

Any other grouping (phrases, sentences, one's own alignment) works the same way: pass
:func:`aggregate` lists of token indices.

Shape letters: ``s_q``/``s_k`` query/key tokens, ``w_q``/``w_k`` query/key groups.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.inspect.tokens import ReadableToken, readable_label

# Characters that join the letters on both sides into one word ("didn't", "well-known"),
# and those that join digits ("3.14", "1,000").
_JOIN_LETTERS = frozenset("'’-")
_JOIN_DIGITS = frozenset(".,")


@dataclass(frozen=True)
class Word:
    """A group of tokens shown as one unit.

    Attributes:
        text: what the group reads as in the text ("고파서"), or a special token's string.
        span: its ``(start, end)`` character span in the text, or ``None`` for a token the
            tokenizer added (``[CLS]``).
        token_indices: the positions of its tokens, in order.
    """

    text: str
    span: tuple[int, int] | None
    token_indices: tuple[int, ...]

    @property
    def label(self) -> str:
        """The word for tables and pictures (see :func:`attnkit.inspect.tokens.readable_label`)."""
        return readable_label(self.text)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict: ``text``, ``span`` (a list or ``None``), ``tokens`` (indices)."""
        return {
            "text": self.text,
            "span": None if self.span is None else list(self.span),
            "tokens": list(self.token_indices),
        }


def text_words(text: str) -> list[tuple[int, int]]:
    """The spans of the words of ``text``: runs of letters and digits (an inner apostrophe
    or hyphen kept), and runs of punctuation; white space separates them.

    Args:
        text: any text.

    Returns:
        ``(start, end)`` spans in order.
    """
    kinds = [_char_kind(ch) for ch in text]
    for i in range(1, len(text) - 1):
        # A joiner between two word characters belongs to the word.
        if kinds[i - 1] == kinds[i + 1] == "word" and (
            text[i] in _JOIN_LETTERS or (text[i] in _JOIN_DIGITS and text[i - 1].isdigit() and text[i + 1].isdigit())
        ):
            kinds[i] = "word"
    spans = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or kinds[i] != kinds[start]:
            if kinds[start] != "space":
                spans.append((start, i))
            start = i
    return spans


def _char_kind(ch: str) -> str:
    """``"word"`` for letters, digits, marks (the vowel signs of many scripts) and ``_``;
    ``"space"``; ``"punct"`` for the rest."""
    if ch.isspace():
        return "space"
    category = unicodedata.category(ch)
    return "word" if category[0] in "LNM" or category == "Pc" else "punct"


def word_groups(text: str, tokens: Sequence[ReadableToken]) -> list[Word]:
    """Group tokens into the words of the text they came from.

    A token belongs to the word its span starts in (its first character that is not white
    space); special tokens and tokens the tokenizer added are words of their own; a token
    that is only white space (``Ġ``, ``Ċ``) joins the next word, or the previous one at the
    end of the text.

    Args:
        text: the tokenized text.
        tokens: its :class:`~attnkit.inspect.tokens.ReadableToken` s, in order.

    Returns:
        The words in the order of their first tokens; together they hold every token
        exactly once.
    """
    spans = text_words(text)
    word_at = {pos: w for w, (start, end) in enumerate(spans) for pos in range(start, end)}
    # Each token's key: ("word", index into spans), ("own", token index), or None for
    # white space, resolved below.
    keys: list[tuple[str, int] | None] = []
    for i, tok in enumerate(tokens):
        if tok.span is None or tok.special:
            keys.append(("own", i))
            continue
        inside = [word_at[pos] for pos in range(*tok.span) if pos in word_at]
        keys.append(("word", inside[0]) if inside else None)
    resolved: list[tuple[str, int]] = []
    for i, key in enumerate(keys):
        if key is None:
            later = next((k for k in keys[i + 1 :] if k is not None), None)
            earlier = resolved[-1] if resolved else None
            if later is not None and later[0] == "word":
                key = later
            elif earlier is not None and earlier[0] == "word":
                key = earlier
            else:  # nothing but white space and special tokens around it
                key = ("own", i)
        resolved.append(key)
    members: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(resolved):
        members.setdefault(key, []).append(i)
    words = []
    for (kind, index), indices in members.items():
        if kind == "own":
            tok = tokens[index]
            words.append(Word(tok.text, tok.span, tuple(indices)))
            continue
        # The word's text as far as its tokens cover it (a punctuation run may start
        # inside a special token such as "<|im_end|>.").
        start, end = spans[index]
        covered = [span for span in (tokens[i].span for i in indices) if span is not None]
        start = max(start, min(s for s, _ in covered))
        end = min(end, max(e for _, e in covered))
        words.append(Word(text[start:end], (start, end), tuple(indices)))
    return words


def group_matrix(groups: Sequence[Word] | Sequence[Sequence[int]], s: int, *, what: str = "groups") -> Tensor:
    """The ``[w, s]`` 0/1 matrix of which token belongs to which group.

    Args:
        groups: :class:`Word` s or lists of token indices.
        s: the number of tokens.
        what: how to name the groups in errors.

    Returns:
        ``[w, s]`` float32 with one 1 per column.

    Raises:
        ValueError: an empty group, an index outside ``0 .. s-1``, or groups that do not
            hold every token exactly once.
    """
    indices = [list(g.token_indices) if isinstance(g, Word) else [int(i) for i in g] for g in groups]
    matrix = torch.zeros(len(indices), s)
    for w, members in enumerate(indices):
        if not members:
            raise ValueError(f"{what}: group {w} has no tokens")
        if any(not 0 <= i < s for i in members):
            raise ValueError(f"{what}: group {w} has token indices {members}, outside 0..{s - 1}")
        matrix[w, members] += 1
    counts = matrix.sum(0)
    if not torch.equal(counts, torch.ones(s)):
        missing = [i for i in range(s) if counts[i] == 0]
        repeated = [i for i in range(s) if counts[i] > 1]
        raise ValueError(
            f"{what} must hold each of the {s} tokens exactly once; missing {missing}, in several groups {repeated}"
        )
    return matrix


def aggregate(
    weights: Tensor,
    groups: Sequence[Word] | Sequence[Sequence[int]],
    key_groups: Sequence[Word] | Sequence[Sequence[int]] | None = None,
) -> Tensor:
    """Token attention as group (word) attention: for query group ``a`` and key group
    ``b``, the sum over ``b``'s tokens of the weights, averaged over ``a``'s tokens.

    Args:
        weights: ``[..., s_q, s_k]`` attention weights, rows summing to 1 (or 0).
        groups: the query groups (:class:`Word` s or lists of token indices); they must
            hold every query token exactly once.
        key_groups: the key groups, when keys are other tokens than the queries
            (cross-attention); default ``groups``.

    Returns:
        ``[..., w_q, w_k]`` in the dtype and on the device of ``weights``; each row sums to
        what the rows of its tokens sum to, 1 for ordinary attention.

    Raises:
        ValueError: ``weights`` is not at least 2-D, or the groups do not partition the
            tokens.
    """
    if weights.ndim < 2:
        raise ValueError(f"weights must be [..., s_q, s_k], got shape {list(weights.shape)}")
    s_q, s_k = weights.shape[-2:]
    members_q = group_matrix(groups, s_q, what="query groups").to(weights)  # [w_q, s_q]
    members_k = (
        members_q
        if key_groups is None and s_k == s_q
        else group_matrix(groups if key_groups is None else key_groups, s_k, what="key groups").to(weights)
    )  # [w_k, s_k]
    average_q = members_q / members_q.sum(-1, keepdim=True)  # [w_q, s_q]
    return average_q @ weights @ members_k.T  # [..., w_q, w_k]
