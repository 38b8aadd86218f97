"""Pure text helpers for what layoutc shows and writes: which characters are invisible or end a
line somewhere, and how text from outside (a spec line, a file name, a ``-D`` value) is shown on a
terminal (:func:`display`) or written into generated code (:func:`comment`, else ``repr()``).

No layoutc imports: diagnostics, the parser and the code generator all use it.
"""

from __future__ import annotations

import unicodedata

#: Categories of characters a spec may not contain (tab and newline excepted): controls,
#: format characters (bidi overrides, zero-width joiners), line/paragraph separators, surrogates.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_ALLOWED_CONTROLS = frozenset("\t\n")


def forbidden(ch: str) -> bool:
    """True for a character that may not appear in a spec (after line ends are normalised)."""
    return ch not in _ALLOWED_CONTROLS and unicodedata.category(ch) in _FORBIDDEN_CATEGORIES


def char_name(ch: str) -> str:
    """``U+2028 LINE SEPARATOR``: how an error names an invisible character."""
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'control character')}"


def display(text: str) -> str:
    """``text`` safe to print on a terminal: control, format and separator characters escaped
    (``\\r`` -> ``\\r``, ESC -> ``\\x1b``), everything else as is."""
    if all(not forbidden(c) and c != "\n" for c in text):
        return text
    return "".join(ascii(c)[1:-1] if (forbidden(c) or c == "\n") else c for c in text)


def comment(text: str) -> str:
    """A one-line comment body for generated code: whitespace runs collapsed, anything that is not a
    printable character escaped, so no text from a spec or a file name can end the comment."""
    flat = " ".join(text.split())
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in flat)
