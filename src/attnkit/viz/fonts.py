"""Fonts for pictures whose labels are not all Latin: Hangul, kana, Han characters.

matplotlib draws with DejaVu Sans, which has no Hangul: "배가" would come out as two empty
boxes. :func:`choose_fonts` looks for installed fonts whose character map (read with
matplotlib's own FreeType binding) covers every character of the labels, and
:func:`font_context` draws with the default font first and those as per-glyph fallbacks.
If no installed font has some characters, it warns once, naming the Debian package to
install (:data:`CJK_FONT_PACKAGE`), instead of silently drawing boxes.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

# The Debian/Ubuntu package with fonts for Korean, Japanese and Chinese (Noto Sans CJK).
CJK_FONT_PACKAGE = "fonts-noto-cjk"

# Tried first, in this order, when the default font lacks characters: common CJK fonts
# with Korean forms first. Any other installed font is tried after them.
PREFERRED_FAMILIES = (
    "Noto Sans CJK KR",
    "Noto Sans KR",
    "NanumGothic",
    "NanumBarunGothic",
    "Source Han Sans K",
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "UnDotum",
    "Baekmuk Gulim",
)

# matplotlib's own last-resort font maps every code point to a placeholder glyph (a box
# naming the Unicode block), so its character map says nothing about real glyphs.
_PLACEHOLDER_FONTS = ("Last Resort",)


@dataclass(frozen=True)
class FontChoice:
    """The fonts that can draw some text.

    Attributes:
        families: font family names for matplotlib's ``font.family``: the default font
            first, then the fallbacks that cover what it lacks.
        missing: the characters that no installed font covers, sorted; empty when all can
            be drawn.
    """

    families: tuple[str, ...]
    missing: str


def plain_text(text: str) -> str:
    """``text`` escaped so that matplotlib draws it as written: every ``$`` becomes ``\\$``,
    so no pair of them opens mathtext (``"It costs $$ today"`` would otherwise fail to
    parse, and ``"$x^2$"`` be typeset). Outside ``$…$`` matplotlib gives no other
    character a meaning, and draws ``\\$`` as ``$``. Every label, title and tick label of
    attnkit's figures goes through it.
    """
    return text.replace("$", "\\$")


def needed_characters(texts: Iterable[str]) -> frozenset[str]:
    """The characters that need a glyph: all but white space and control characters."""
    return frozenset(ch for text in texts for ch in text if not ch.isspace() and ch.isprintable())


def choose_fonts(texts: Iterable[str]) -> FontChoice:
    """The fonts that can draw ``texts``: matplotlib's default font, plus installed fonts
    for the characters it lacks (:data:`PREFERRED_FAMILIES` first, then any other).

    Fonts installed after matplotlib built its font cache (a Debian font package installed
    later) are found too: the system's font folders are scanned when the known fonts fall
    short.

    Args:
        texts: the labels, titles and other text of a picture.

    Returns:
        :class:`FontChoice`.

    Raises:
        ImportError: matplotlib is missing.
    """
    from matplotlib import font_manager

    needed = needed_characters(texts)
    default = _default_font(font_manager)
    missing = needed - _charmap(default.fname, default.index)
    families = [default.name]
    if missing:
        fallbacks, missing = _cover(font_manager, missing, exclude={default.name})
        if missing and _register_system_fonts(font_manager):
            more, missing = _cover(font_manager, missing, exclude={default.name, *fallbacks})
            fallbacks += more
        families += fallbacks
    return FontChoice(tuple(families), "".join(sorted(missing)))


def font_covers(family: str, text: str) -> bool:
    """Whether the installed font ``family`` has a glyph for every character of ``text``
    (white space and control characters aside).

    Raises:
        ValueError: no installed font of that family.
    """
    from matplotlib import font_manager

    entry = _entries(font_manager).get(family)
    if entry is None:
        raise ValueError(f"no installed font of family {family!r}")
    return needed_characters([text]) <= _charmap(entry.fname, entry.index)


@contextlib.contextmanager
def font_context(texts: Iterable[str]) -> Iterator[FontChoice]:
    """Draw with fonts that cover ``texts`` (:func:`choose_fonts`) inside the block.

    matplotlib's settings are changed only inside the block. When some characters have no
    font, one warning names them and the package to install, and matplotlib's own
    warning per missing glyph is silenced.

    Args:
        texts: every text the picture will show.

    Yields:
        The :class:`FontChoice` in use.
    """
    import matplotlib

    choice = choose_fonts(texts)
    with contextlib.ExitStack() as stack:
        stack.enter_context(matplotlib.rc_context({"font.family": list(choice.families)}))
        if choice.missing:
            warnings.warn(
                f"no installed font has glyphs for {choice.missing!r}: these characters will show as empty "
                f"boxes in the picture. Install a font that has them (for Korean, Japanese and Chinese on "
                f"Debian or Ubuntu: apt-get install {CJK_FONT_PACKAGE})",
                UserWarning,
                stacklevel=3,
            )
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        yield choice


def _default_font(font_manager: Any) -> Any:
    """The font entry matplotlib draws with by default."""
    path = font_manager.findfont(font_manager.FontProperties())
    return next(e for e in font_manager.fontManager.ttflist if e.fname == path)


def _entries(font_manager: Any) -> dict[str, Any]:
    """One regular, upright entry per usable family (another style when it has none)."""
    entries: dict[str, Any] = {}
    for entry in font_manager.fontManager.ttflist:
        if entry.name.startswith(_PLACEHOLDER_FONTS) or not str(entry.fname).lower().endswith((".ttf", ".otf", ".ttc")):
            continue
        regular = entry.style == "normal" and entry.weight in (400, "normal", "regular")
        if entry.name not in entries or regular:
            entries.setdefault(entry.name, entry)
            if regular:
                entries[entry.name] = entry
    return entries


def _cover(font_manager: Any, missing: frozenset[str], *, exclude: set[str]) -> tuple[list[str], frozenset[str]]:
    """Greedily pick fonts for the ``missing`` characters, preferred families first.

    Returns:
        ``(families picked, characters still missing)``.
    """
    entries = _entries(font_manager)
    order = [name for name in PREFERRED_FAMILIES if name in entries]
    order += sorted(name for name in entries if name not in PREFERRED_FAMILIES)
    picked = []
    for name in order:
        if not missing:
            break
        if name in exclude:
            continue
        covered = missing & _charmap(entries[name].fname, entries[name].index)
        if covered:
            picked.append(name)
            missing -= covered
    return picked, missing


def _register_system_fonts(font_manager: Any) -> bool:
    """Add the system's font files that matplotlib's cached font list lacks.

    Returns:
        Whether any font was added.
    """
    known = {str(e.fname) for e in font_manager.fontManager.ttflist}
    added = False
    for path in font_manager.findSystemFonts():
        if path in known:
            continue
        try:
            font_manager.fontManager.addfont(path)
            added = True
        except (OSError, RuntimeError, ValueError):  # an unreadable or unsupported file
            continue
    return added


@functools.cache
def _charmap(path: str, index: int = 0) -> frozenset[str]:
    """The characters a font file (face ``index`` of a collection) has glyphs for (its
    Unicode character map, which FreeType selects when it opens the face)."""
    from matplotlib.ft2font import FT2Font

    try:
        cmap = FT2Font(path, face_index=index).get_charmap()
    except (OSError, RuntimeError, ValueError):  # a damaged or unsupported file
        return frozenset()
    return frozenset(chr(code) for code in cmap)
