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
    if flat.isprintable():
        return flat
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in flat)


# -- Markdown (review reports, ``--format markdown``) ----------------------------------------------
# Text from a spec (names, string parameters, statement text, messages quoting them) must stay text:
# a backtick in it must not close a code span, a '|' must not end a table cell, '**' must not make a
# verdict look bold, '<' must not open HTML.

_MD_SPECIAL = frozenset("\\`*_[]<>|~&")  # mark-up anywhere in a line
_MD_LEADING = frozenset("#+-=>!")  # mark-up at the start of a line (or of a list item)


def md_text(text: str) -> str:
    """``text`` as literal Markdown prose: every character that could mark something up escaped."""
    out = "".join("\\" + c if c in _MD_SPECIAL else c for c in display(text))
    if out[:1] in _MD_LEADING:
        out = "\\" + out
    digits = len(out) - len(out.lstrip("0123456789"))
    if digits and out[digits:digits + 1] in (".", ")"):  # "1. " would start an ordered list
        out = out[:digits] + "\\" + out[digits:]
    return out


def _backtick_run(text: str) -> int:
    run = longest = 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    return longest


def md_code(text: str, cell: bool = False) -> str:
    """``text`` as one inline code span, whatever it holds: the fence is longer than any run of
    backticks inside; with ``cell``, '|' is escaped so that the span can sit in a table cell."""
    shown = display(text)
    if cell:
        shown = shown.replace("|", "\\|")
    fence = "`" * (_backtick_run(shown) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip(" ") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def md_block(text: str) -> str:
    """``text`` as a fenced code block whose fence no line of it can close."""
    fence = "`" * max(3, _backtick_run(text) + 1)
    safe = "\n".join(display(line) for line in text.splitlines())
    return f"{fence}\n{safe}\n{fence}"
