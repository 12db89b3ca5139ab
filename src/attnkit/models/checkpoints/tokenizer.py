"""Tokenizers read from ``tokenizer.json`` with the ``tokenizers`` library (no
``transformers`` import at load time).

Shape letters: ``s`` number of tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.models.checkpoints.errors import CheckpointError, require, short_repr
from attnkit.models.checkpoints.files import read_file


def check_unicode(text: str) -> None:
    """Refuse a string that cannot be encoded as UTF-8 (lone surrogates).

    Raises:
        ValueError: naming the position of the first bad character.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"the text is not valid Unicode: {text[err.start]!r} at character {err.start} is a lone surrogate "
            "(undecodable bytes?); give UTF-8 text"
        ) from None


def _is_library_error(err: BaseException) -> bool:
    """Whether ``err`` comes from the ``tokenizers`` library: its exceptions, and Rust
    panics, which it raises as ``pyo3_runtime.PanicException`` (a ``BaseException``)."""
    return isinstance(err, Exception) or type(err).__name__ == "PanicException"


@dataclass(frozen=True)
class TokenizedText:
    """A text split into tokens.

    Attributes:
        ids: token ids, ``[1, s]`` int64.
        tokens: the ``s`` token strings as the tokenizer has them (byte-level BPE writes a
            leading space as ``Ġ``, WordPiece a continuation as ``##``), special tokens
            (``[CLS]``, ``[SEP]``) included.
        offsets: the ``(start, end)`` character span of each token in the text; ``(0, 0)``
            for special tokens.
        special: whether each token is a special token added by the tokenizer.
    """

    ids: Tensor
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[bool]

    def __len__(self) -> int:
        return len(self.tokens)


class Tokenizer:
    """A checkpoint's tokenizer.

    Args:
        backend: a ``tokenizers.Tokenizer``. Truncation and padding are switched off: a text
            that does not fit the model is an error, not a silently shortened input.
        eos_token_ids: the ids that end a generation.
        path: the file it was read from, named in errors.

    Attributes:
        backend: the ``tokenizers.Tokenizer``.
        eos_token_ids: the ids that end a generation.
        path: the file it was read from, or ``None``.
    """

    def __init__(self, backend: Any, *, eos_token_ids: Iterable[int] = (), path: Path | None = None) -> None:
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.eos_token_ids = frozenset(eos_token_ids)
        self.path = path

    @classmethod
    def from_file(cls, path: str | Path, *, eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """Read a ``tokenizer.json``.

        Raises:
            ValueError: a missing file.
            CheckpointError: an unreadable one: too large to read
                (:func:`attnkit.models.checkpoints.files.read_file`), not UTF-8, or refused by the
                ``tokenizers`` library (its errors and panics become this).
        """
        backend_class = require("tokenizers").Tokenizer
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path.parent} has no tokenizer.json")
        try:
            text = read_file(path).decode("utf-8")
        except UnicodeDecodeError as err:
            raise CheckpointError(path, f"is not UTF-8 text: {err.reason} at byte {err.start}") from None
        try:
            backend = backend_class.from_str(text)
        except BaseException as err:  # tokenizers raises untyped errors, and panics (BaseException)
            if not _is_library_error(err):
                raise
            raise CheckpointError(path, f"is not a valid tokenizer file: {short_repr(str(err), 300)}") from None
        return cls(backend, eos_token_ids=eos_token_ids, path=path)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def largest_id(self) -> int:
        """The largest id the tokenizer may produce, added tokens and the special tokens its
        post-processor inserts (``[CLS]``, ``<s>``) included (``-1`` for an empty
        vocabulary): ids need not be contiguous, so it may exceed ``vocab_size``."""
        vocabulary = self.backend.get_vocab(with_added_tokens=True).values()
        return max((*vocabulary, *self.post_processor_ids()), default=-1)

    def post_processor_ids(self) -> list[int]:
        """The ids the post-processor adds around a text (template, BERT and RoBERTa
        processors, and sequences of them), whatever the vocabulary says."""
        import json

        return _post_processor_ids(json.loads(self.backend.to_str()).get("post_processor"))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> TokenizedText:
        """Split ``text`` into tokens, with the special tokens the model expects.

        Args:
            text: any string of valid Unicode.
            add_special_tokens: add them (``False`` for a text that writes its own, as a
                chat template's does).

        Returns:
            A :class:`TokenizedText`.

        Raises:
            ValueError: text that is not valid Unicode (a lone surrogate, as Python gives
                for undecodable bytes on a command line), or that the tokenizer's own rules
                fail on (e.g. a pre-tokenizer pattern that backtracks without end).
        """
        check_unicode(text)
        try:
            enc = self.backend.encode(text, add_special_tokens=add_special_tokens)
        except BaseException as err:  # see from_file
            if not _is_library_error(err):
                raise
            source = self.path or "the tokenizer"
            unknown = self._unknown_words(text)
            if unknown:
                raise ValueError(
                    f"{source} has no token for {_listed(unknown, 10)}; its vocabulary is "
                    f"{_listed(self._vocabulary(), 40)}"
                ) from None
            raise ValueError(f"{source} failed on this text: {short_repr(str(err), 300)}") from None
        return TokenizedText(
            ids=torch.tensor([enc.ids], dtype=torch.long),  # [1, s]
            tokens=list(enc.tokens),
            offsets=[tuple(o) for o in enc.offsets],
            special=[bool(m) for m in enc.special_tokens_mask],
        )

    def _vocabulary(self) -> list[str]:
        """Every token, in the order of their ids."""
        vocab = self.backend.get_vocab(with_added_tokens=True)
        return sorted(vocab, key=vocab.__getitem__)

    def _unknown_words(self, text: str) -> list[str]:
        """The words of ``text`` that a word-level tokenizer without an unknown token has
        no id for (it refuses the whole text over them, with a message that names none),
        each once; empty for any other tokenizer."""
        model = self.backend.model
        if type(model).__name__ != "WordLevel" or model.unk_token in self.backend.get_vocab(with_added_tokens=True):
            return []
        if self.backend.normalizer is not None:
            text = self.backend.normalizer.normalize_str(text)
        pre = self.backend.pre_tokenizer
        words = [word for word, _ in pre.pre_tokenize_str(text)] if pre is not None else [text]
        vocab = self.backend.get_vocab(with_added_tokens=True)
        return list(dict.fromkeys(word for word in words if word not in vocab))

    def decode(self, ids: Iterable[int] | Tensor, *, skip_special_tokens: bool = False) -> str:
        """The text of token ids.

        Args:
            ids: token ids, a list or a 1-D tensor; ids the tokenizer has no token for
                are left out.
            skip_special_tokens: leave out special tokens.
        """
        if isinstance(ids, Tensor):
            ids = ids.reshape(-1).tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        """The token string of one id (as in :attr:`TokenizedText.tokens`).

        A model's embedding may have more rows than its tokenizer has ids (T5: 32,128 rows,
        32,100 ids), so a model can produce an id the tokenizer lacks: it is shown as the
        placeholder ``<id N>`` (:func:`missing_token`), and :meth:`decode` leaves it out,
        as transformers' decode does.

        Raises:
            ValueError: a negative id.
        """
        if int(token_id) < 0:
            raise ValueError(f"token ids must be >= 0, got {token_id}")
        token = self.backend.id_to_token(int(token_id))
        return missing_token(int(token_id)) if token is None else token

    def stream(self, ids: Iterable[int]) -> Iterator[str]:
        """Decode ids one by one into text pieces as soon as they are printable.

        Byte-level tokenizers may split one character over several tokens, so a piece is
        released only once the text no longer ends in a partial character (U+FFFD). Each
        step decodes a short window (from the token before the last released piece) rather
        than everything so far, which keeps long generations linear; the window starts one
        token early because some decoders treat a sequence's first token specially.

        Args:
            ids: an iterable of token ids (e.g. a generator producing them).

        Yields:
            Text pieces that join to ``decode(all ids)``.
        """
        seen: list[int] = []
        window_start = released = 0  # decode from window_start; ids before `released` are out
        for token_id in ids:
            seen.append(int(token_id))
            done = self.decode(seen[window_start:released])
            text = self.decode(seen[window_start:])
            if len(text) > len(done) and not text.endswith("\ufffd"):
                yield text[len(done) :]
                window_start, released = released, len(seen)
        if released < len(seen):
            done = self.decode(seen[window_start:released])
            yield self.decode(seen[window_start:])[len(done) :]


def _post_processor_ids(spec: Any) -> list[int]:
    """The ids a ``tokenizer.json`` post-processor (its JSON) inserts: ``special_tokens``'
    ``ids`` of a template, the ``[token, id]`` pairs ``cls``/``sep`` of BERT's and RoBERTa's,
    and those of each processor of a ``Sequence``."""
    if not isinstance(spec, dict):
        return []
    ids: list[int] = []
    for processor in spec.get("processors") or []:
        ids += _post_processor_ids(processor)
    special = spec.get("special_tokens")
    for token in special.values() if isinstance(special, dict) else []:
        ids += [i for i in (token.get("ids") or []) if isinstance(i, int)] if isinstance(token, dict) else []
    for pair in (spec.get("cls"), spec.get("sep")):
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], int):
            ids.append(pair[1])
    return ids


def missing_token(token_id: int) -> str:
    """The placeholder shown for an id the tokenizer has no token for: ``<id 32105>``."""
    return f"<id {token_id}>"


def _listed(items: list[str], most: int) -> str:
    """``'a', 'b', 'c'``, the first ``most`` items and how many more there are."""
    shown = ", ".join(repr(item) for item in items[:most])
    return shown if len(items) <= most else f"{shown} and {len(items) - most} more"
