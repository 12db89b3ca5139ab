"""Tokens as people read them: the text each token stands for, never a byte-level fragment.

Tokenizers write their tokens in their own alphabets: byte-level BPE (GPT-2, LLaMA 3,
SmolLM2) spells bytes as printable characters (``Ġcat`` is " cat", ``ìĸ´`` is the three
bytes of "어"), SentencePiece writes spaces as ``▁``, WordPiece (BERT) marks continuations
with ``##`` and may rewrite the text on the way (lower case, Hangul syllables split into
jamo, ``[UNK]`` for what it cannot spell). A :class:`ReadableToken` gives each token the
characters of the original text it stands for, from the tokenizer's character offsets.

A character that the tokenizer split over several tokens (one Hangul syllable is three
UTF-8 bytes, and SmolLM2 often gives each byte its own token; MiniLM gives each jamo its
own) is shown in each of those tokens, marked partial, with the token's place among them:
``배(1/3)``, ``배(2/3)``, ``배(3/3)`` — never as the replacement character ``�``.

SentencePiece's word-start mark alone (the token ``▁``) stands for a space wherever it is:
before the first word its span is the word's first character, which it does not hold, so
it reads ``␣`` there as it does between words, and that character is not marked split.

Without the original text (a run from token ids), :func:`decode_tokens` rebuilds it from
the token strings: bytes reassembled into UTF-8, ``Ġ``/``Ċ``/``▁`` turned into spaces and
newlines, ``##`` joined to the previous token.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Scheme = Literal["byte-level", "metaspace", "wordpiece", "plain"]
# SentencePiece's mark of a word's start (and of a space).
_WORD_START = "\u2581"

# SentencePiece's byte-fallback tokens, one byte each: "<0xE1>".
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# How white space reads in a label: visible, and one line.
_WHITESPACE_LABELS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclass(frozen=True)
class ReadableToken:
    """One token as it reads in the text.

    Attributes:
        token: the tokenizer's own string (``"Ġcat"``, ``"##ing"``, ``"ë"``, ``"[CLS]"``).
        text: the characters of the original text the token stands for (``" cat"``, its
            span); a token holding part of a character has that whole character; a token
            the tokenizer added (``[CLS]``) has its own string.
        span: the ``(start, end)`` character span of ``text`` in the original text, or
            ``None`` for a token the tokenizer added, which stands for no text.
        partial: the token holds only part of a character (some of its UTF-8 bytes, or
            some of the jamo of a Hangul syllable), which other tokens hold the rest of.
        part: ``(k, n)`` when ``partial`` and the token shares exactly one character: it
            is the ``k``-th of the ``n`` tokens that hold pieces of it.
        special: a special token (``[CLS]``, ``[SEP]``, ``<|im_start|>``), shown as itself.
    """

    token: str
    text: str
    span: tuple[int, int] | None
    partial: bool = False
    part: tuple[int, int] | None = None
    special: bool = False

    @property
    def label(self) -> str:
        """The token for tables and pictures: its text without surrounding white space,
        white space made visible (``␣``, ``\\n``), a partial token marked ``(k/n)``."""
        return readable_label(self.text, partial=self.partial, part=self.part)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``token``, ``text``, ``span`` (a list or ``None``),
        ``partial``, ``part``, ``special``, ``label``."""
        return {
            "token": self.token,
            "text": self.text,
            "span": None if self.span is None else list(self.span),
            "partial": self.partial,
            "part": None if self.part is None else list(self.part),
            "special": self.special,
            "label": self.label,
        }


def readable_label(text: str, *, partial: bool = False, part: tuple[int, int] | None = None) -> str:
    """A token's or a word's text as a one-line label.

    Args:
        text: what it stands for.
        partial: mark it as holding only part of a character.
        part: ``(k, n)``: which of the ``n`` pieces of the character it is.

    Returns:
        ``text`` stripped of surrounding white space; text that is only white space shown
        as ``␣`` per space and ``\\n``/``\\t`` per newline or tab; ``(k/n)`` (or
        ``(part)`` without ``part``) appended when ``partial``.
    """
    stripped = text.strip()
    label = stripped if stripped else "".join(_WHITESPACE_LABELS.get(ch, "␣") for ch in text)
    if partial:
        label += f"({part[0]}/{part[1]})" if part is not None else "(part)"
    return label


def readable_tokens(
    text: str,
    tokens: Sequence[str],
    offsets: Sequence[tuple[int, int] | None],
    *,
    special: Sequence[bool] | None = None,
) -> list[ReadableToken]:
    """The text each token stands for, from the tokenizer's character offsets.

    Args:
        text: the text that was tokenized.
        tokens: the ``s`` token strings.
        offsets: each token's ``(start, end)`` character span in ``text``; an empty span
            (``(0, 0)``) or ``None`` for a token the tokenizer added.
        special: which tokens are special (default: those with an empty span). A special
            token whose span reads differently from it (BERT's ``[UNK]`` standing for
            "먹었다") is shown as the text it stands for, not as special.

    Returns:
        One :class:`ReadableToken` per token.

    Raises:
        ValueError: lengths differ, or a span lies outside the text.
    """
    if len(offsets) != len(tokens) or (special is not None and len(special) != len(tokens)):
        raise ValueError(
            f"need one offset and one special flag per token, got {len(tokens)} tokens, {len(offsets)} offsets"
            + ("" if special is None else f" and {len(special)} special flags")
        )
    spans: list[tuple[int, int] | None] = []
    for i, offset in enumerate(offsets):
        if offset is None or offset[0] >= offset[1]:
            spans.append(None)
            continue
        start, end = int(offset[0]), int(offset[1])
        if start < 0 or end > len(text):
            raise ValueError(
                f"token {i} ({tokens[i]!r}) has span {(start, end)} outside the text of {len(text)} characters"
            )
        spans.append((start, end))
    # Which tokens hold a piece of each character: a character held by more than one
    # token was split by the tokenizer (bytes of one syllable, jamo of one syllable).
    # SentencePiece's word-start mark alone spans the next word's first character at the
    # start of a text: a space, not a piece of that character.
    marks = {i for i, (token, span) in enumerate(zip(tokens, spans)) if token == _WORD_START and span is not None}
    holders: dict[int, list[int]] = {}
    for i, span in enumerate(spans):
        if span is not None and i not in marks:
            for pos in range(*span):
                holders.setdefault(pos, []).append(i)
    out = []
    for i, (token, span) in enumerate(zip(tokens, spans, strict=True)):
        if span is None:
            out.append(ReadableToken(token, token, None, special=True if special is None else bool(special[i])))
            continue
        if i in marks:
            out.append(ReadableToken(token, " ", span))
            continue
        piece = text[span[0] : span[1]]
        shared = [pos for pos in range(*span) if len(holders[pos]) > 1]
        part = None
        if len(shared) == 1:
            sharing = holders[shared[0]]
            part = (sharing.index(i) + 1, len(sharing))
        # A special token is itself only where it spells itself in the text.
        is_special = special is not None and bool(special[i]) and piece == token
        out.append(ReadableToken(token, piece, span, partial=bool(shared), part=part, special=is_special))
    return out


def token_scheme(backend: Any) -> Scheme:
    """How a ``tokenizers.Tokenizer`` spells text in its tokens, read from its decoder.

    Args:
        backend: a ``tokenizers.Tokenizer`` (anything without a recognised decoder gives
            ``"plain"``).

    Returns:
        ``"byte-level"`` (bytes as printable characters, ``Ġ`` = space), ``"metaspace"``
        (``▁`` = space, ``<0xNN>`` byte tokens), ``"wordpiece"`` (``##`` joins), or
        ``"plain"`` (tokens are text, joined as they are).
    """
    decoder = getattr(backend, "decoder", None)
    try:
        state = json.loads(decoder.__getstate__()) if decoder is not None else {}
    except (AttributeError, TypeError, ValueError):
        return "plain"
    decoders = [d for d in state.get("decoders", [state]) if isinstance(d, dict)]
    kinds = {d.get("type") for d in decoders}
    # Tokenizers converted from SentencePiece (LLaMA 2) decode "▁" with Replace("▁", " ").
    kinds |= {d["pattern"].get("String") for d in decoders if isinstance(d.get("pattern"), dict)}
    if "ByteLevel" in kinds:
        return "byte-level"
    if "WordPiece" in kinds:
        return "wordpiece"
    if "Metaspace" in kinds or "▁" in kinds:
        return "metaspace"
    return "plain"


def special_token_ids(backend: Any) -> frozenset[int]:
    """The ids of a tokenizer's special added tokens (``[CLS]``, ``<|im_start|>``, ...).

    Args:
        backend: a ``tokenizers.Tokenizer``, or anything with
            ``get_added_tokens_decoder()`` (an added token without a ``special`` flag
            counts as special).

    Returns:
        The ids; empty when the tokenizer has no added tokens.
    """
    getter = getattr(backend, "get_added_tokens_decoder", None)
    if getter is None:
        return frozenset()
    return frozenset(int(i) for i, tok in getter().items() if getattr(tok, "special", True))


def decode_tokens(
    tokens: Sequence[str], *, scheme: Scheme, special: Sequence[bool] | None = None
) -> tuple[str, list[tuple[int, int] | None]]:
    """Rebuild the text of token strings, and each token's span in it, for runs that have
    token ids but not the text they came from.

    Args:
        tokens: the token strings.
        scheme: how the tokenizer spells text (:func:`token_scheme`).
        special: which tokens are special; they stand for no text (span ``None``).

    Returns:
        ``(text, spans)``. Bytes are reassembled into UTF-8: a character whose bytes are
        spread over several tokens lies in each of their spans. A byte sequence that is not
        UTF-8 (ids cut in the middle of a character) reads as ``\\xNN`` escapes, never as
        ``�``.
    """
    special = [False] * len(tokens) if special is None else list(special)
    pieces: list[bytes | None] = []
    previous_word = False  # WordPiece: a new word after another one gets a space
    for token, is_special in zip(tokens, special, strict=True):
        if is_special:
            pieces.append(None)
            previous_word = False
            continue
        if scheme == "byte-level":
            table = _unicode_to_byte()
            piece = b"".join(bytes([table[ch]]) if ch in table else ch.encode("utf-8") for ch in token)
        elif scheme == "metaspace":
            match = _BYTE_TOKEN.fullmatch(token)
            piece = bytes([int(match.group(1), 16)]) if match else token.replace("▁", " ").encode("utf-8")
        elif scheme == "wordpiece":
            if token.startswith("##"):
                piece = token[2:].encode("utf-8")
            else:
                piece = (b" " if previous_word else b"") + token.encode("utf-8")
            previous_word = True
        else:
            piece = token.encode("utf-8")
        pieces.append(piece)
    return _spans_of_pieces(pieces)


def _spans_of_pieces(pieces: Sequence[bytes | None]) -> tuple[str, list[tuple[int, int] | None]]:
    """Join byte pieces into text and give each piece the span of the characters its bytes
    belong to."""
    data = b"".join(p for p in pieces if p is not None)
    # Each byte's character index, decoding one character (or one bad byte) at a time.
    chars: list[str] = []
    char_of_byte: list[int] = []
    pos = 0
    while pos < len(data):
        length = _utf8_length(data, pos)
        if length:
            chars.append(data[pos : pos + length].decode("utf-8"))
        else:
            length = 1
            chars.append(f"\\x{data[pos]:02x}")
        char_of_byte += [len(chars) - 1] * length
        pos += length
    starts = [0]
    for ch in chars:
        starts.append(starts[-1] + len(ch))
    spans: list[tuple[int, int] | None] = []
    offset = 0
    for piece in pieces:
        if not piece:
            spans.append(None)
            continue
        first, last = char_of_byte[offset], char_of_byte[offset + len(piece) - 1]
        spans.append((starts[first], starts[last + 1]))
        offset += len(piece)
    return "".join(chars), spans


def _utf8_length(data: bytes, pos: int) -> int:
    """The length of the UTF-8 character starting at ``data[pos]``, or 0 when the bytes
    there are not a complete, valid one."""
    lead = data[pos]
    length = (
        1
        if lead < 0x80
        else 2
        if 0xC2 <= lead < 0xE0
        else 3
        if 0xE0 <= lead < 0xF0
        else 4
        if 0xF0 <= lead < 0xF5
        else 0
    )
    if not length or pos + length > len(data):
        return 0
    try:
        data[pos : pos + length].decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return length


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode``: byte-level BPE writes printable bytes
    as themselves and the others (space, control bytes, 0x7F-0xA0, 0xAD) as the characters
    from U+0100 on, in byte order — so 0x20, a space, is ``Ġ`` (U+0120)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table
