"""Plain-text tables that stay aligned in a terminal, wide (East-Asian) characters included."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

# What a terminal acts on instead of showing: C0 controls but newline and tab (ESC starts
# escape sequences, BEL rings, CR overwrites), DEL, C1 controls (U+009B is a CSI); the
# bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), which
# reorder the rest of the line, so that a table cell could show another text than it holds;
# and lone surrogates, which cannot even be encoded.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would act on rather than show written as
    its Python escape (``"\\x1b"``, ``"\\x07"``, ``"\\ud800"``); newlines and tabs stay.

    Tokens and texts come from users, files and tokenizers: printed raw, an ESC sequence in
    them could recolour, retitle or rewrite the terminal.
    """
    return _UNSAFE.sub(lambda m: repr(m.group())[1:-1], text)


def json_terminal_safe(text: str) -> str:
    """JSON text (as ``json.dumps(..., ensure_ascii=False)`` writes it) with the characters
    :func:`terminal_safe` escapes written as JSON escapes (``"\\u009b"``): still the same
    JSON, safe to print."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def display_width(text: str) -> int:
    """Columns ``text`` takes in a terminal: wide and full-width characters take two,
    combining marks none."""
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def pad(text: str, width: int, align: str = "<") -> str:
    """Pad ``text`` to ``width`` display columns, left (``<``) or right (``>``) aligned."""
    fill = " " * max(0, width - display_width(text))
    return text + fill if align == "<" else fill + text


def counted(n: int, noun: str) -> str:
    """``n`` things in words: ``"1 layer"``, ``"2 layers"``, ``"0 source/target pairs"``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """Render rows as an aligned table with a header rule.

    Args:
        headers: column titles.
        rows: cells, already formatted as strings.
        align: one ``<`` or ``>`` per column; default: first column left, others right.
    """
    align = align or "<" + ">" * (len(headers) - 1)
    widths = [display_width(h) for h in headers]
    for row in rows:
        widths = [max(w, display_width(cell)) for w, cell in zip(widths, row)]
    lines = [
        "  ".join(pad(h, w, a) for h, w, a in zip(headers, widths, align)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(pad(c, w, a) for c, w, a in zip(row, widths, align)).rstrip() for row in rows]
    return "\n".join(lines)


def table_width(table: str) -> int:
    return max(display_width(line) for line in table.splitlines())


def fmt(x: float) -> str:
    """A number to four decimals, the precision of the worked examples."""
    return "-inf" if x == float("-inf") else f"{x:.4f}"


def fmt_compact(x: float) -> str:
    """An input number as short as it can be written exactly to four decimals (1, 0.1)."""
    text = f"{x:.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def fmt_vector(values: Sequence[float], compact: bool = False) -> str:
    f = fmt_compact if compact else fmt
    return "[" + ", ".join(f(v) for v in values) + "]"
