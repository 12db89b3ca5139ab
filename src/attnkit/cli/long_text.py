"""The text of ``attnkit inspect --long``: TEXT, or the start of ``--file FILE``, tokenized
no further than the tokens the run can use.

A long-context run takes at most the model's context (or ``--max-tokens``) tokens, so only a
prefix of a file is read: about :data:`FIRST_BYTES_PER_TOKEN` bytes per token wanted, read
again four times longer while it holds too few tokens, and never more than
:data:`MAX_BYTES_PER_TOKEN` bytes per token. A 19 MB book read for 100 tokens costs a
kilobyte, and a file that is not a regular file (``/dev/zero``, a pipe, a folder) is
refused before the model loads.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from attnkit.cli import CommandError

# Bytes of --file read per token wanted: first (English prose takes about 4 per token), and
# at most (more than the longest token of any vocabulary: only text without words or
# spaces, e.g. one 19 MB "word" that a tokenizer reads as one unknown token, gets there).
FIRST_BYTES_PER_TOKEN = 8
MAX_BYTES_PER_TOKEN = 256


@contextmanager
def open_regular_file(path: str) -> Iterator[IO[bytes]]:
    """``path`` opened for reading in binary, checked to be a regular file (opening does not
    wait on a pipe with no writer).

    Raises:
        CommandError: a file that cannot be opened or is not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise CommandError(f"cannot read --file {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CommandError(f"--file {path} is not a regular file: give a text file")
    with os.fdopen(fd, "rb") as file:
        yield file


def check_long_text(text: str | None, path: str | None) -> None:
    """Check TEXT, or that ``--file`` is a regular file that can be read, before the model
    loads.

    Raises:
        CommandError: an empty TEXT, or a file that cannot be read or is not a regular file.
    """
    if path is None:
        if not str(text).strip():
            raise CommandError("the text is empty")
        return
    with open_regular_file(path):
        pass


def long_token_ids(model: Any, text: str | None, path: str | None, max_tokens: int | None) -> Any:
    """The ids ``[s]`` of TEXT or of the start of ``--file`` (its first ``max_tokens``),
    checked against the model's context.

    Raises:
        CommandError: a file that cannot be read or decoded, an empty text, or more tokens
            than the model's context.
    """
    if path is None:
        ids, whole = model.tokenizer.encode(str(text)).ids[0], True
    else:
        # One token more than the run can take tells a text longer than the limit.
        limit = model.max_length if max_tokens is None else min(max_tokens, model.max_length)
        ids, whole = _file_prefix_ids(model, path, limit + 1)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if ids.numel() > model.max_length:
        count = f"{ids.numel()} tokens, more" if whole else "more tokens"
        raise CommandError(f"the text has {count} than {model.name}'s {model.max_length}; keep fewer with --max-tokens")
    return ids


def _file_prefix_ids(model: Any, path: str, wanted: int) -> tuple[Any, bool]:
    """The ids ``[n]`` of the start of ``path``, at least ``wanted`` of them unless the file
    (or :data:`MAX_BYTES_PER_TOKEN` bytes per token) ends first, and whether they are the
    whole file's.

    A prefix that stops inside the file is cut at its last space, so that no word is cut.

    Raises:
        CommandError: a file that cannot be read, is not UTF-8, or holds no text.
    """
    most = wanted * MAX_BYTES_PER_TOKEN
    size = wanted * FIRST_BYTES_PER_TOKEN
    data = b""
    with open_regular_file(path) as file:
        while True:
            try:
                data += file.read(size + 1 - len(data))  # a byte more tells whether the file goes on
                whole = len(data) <= size
                text = codecs.getincrementaldecoder("utf-8")().decode(data[:size], final=whole)
            except (OSError, UnicodeDecodeError) as err:
                raise CommandError(f"cannot read --file {path}: {getattr(err, 'strerror', None) or err}") from None
            last = whole or size >= most
            if text.strip():
                ids = model.tokenizer.encode(text if whole else _before_last_space(text)).ids[0]
                if last or ids.numel() >= wanted:
                    return ids, whole
            elif last:
                raise CommandError(f"the text of --file {path} is empty")
            size = min(4 * size, most)


def _before_last_space(text: str) -> str:
    """``text`` without its last word and the space before it (all of it when it is one word)."""
    space = re.search(r"\s", text[::-1])  # the last white space, found from the end
    head = text[: len(text) - space.start() - 1].rstrip() if space else ""
    return head or text
