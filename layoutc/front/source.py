"""Spec text as every part of layoutc sees it: one reading of files, one rule for line ends,
no characters that display differently from what they are.

A spec is reviewed as text (``layoutc review``, ``git diff``), parsed by Lark, printed in
error excerpts and quoted in generated code. If those disagree about where a line ends, a
change can hide from one of them: a lone CR ends a line for Python and for git's display but
not for a ``#`` comment in a parser that only knows LF, so ``# note\\rswap_halves(...)`` reads as
a comment to one tool and as a statement to another. Hence one normalisation, used by all:

* ``\\r\\n`` and a lone ``\\r`` are line ends, as in Python and in every editor; the text the
  compiler works on has ``\\n`` only (line numbers are what an editor shows);
* a byte-order mark at the very start is dropped;
* every other control character, the Unicode line and paragraph separators (U+2028/2029,
  which Python's ``str.splitlines`` treats as line ends but Lark does not), and invisible
  format characters (bidirectional overrides, zero-width spaces: "Trojan Source") are errors,
  reported with their line and column. Tabs are allowed.

The hash of a spec's text (``ast.Spec.sha256``, part of its identity, :mod:`layoutc.lang.identity`) is
taken over the file's own bytes, so it is what ``sha256sum`` prints whatever the line ends.

Text that came from outside (a spec line, a file name, a ``-D`` value) is shown on terminals
through :func:`display` and reaches generated code only through :func:`comment` (one line,
escaped) or ``repr()``.
"""

from __future__ import annotations

import hashlib
import unicodedata
from pathlib import Path

from .ast import Pos
from .errors import Diagnostic, SpecError
from ..limits import MAX_SOURCE_BYTES
from .text import char_name, forbidden

_BOM = "\ufeff"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def normalize(text: str, filename: str = "<spec>") -> str:
    """The spec text with ``\\n`` line ends only; raises :class:`SpecError` for forbidden characters."""
    if text.startswith(_BOM):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    diags: list[Diagnostic] = []
    line, column = 1, 1
    for ch in text:
        if ch == "\n":
            line, column = line + 1, 1
            continue
        if forbidden(ch):
            hint = None
            if ch in "\u2028\u2029\x85\x0b\x0c":
                hint = "end lines with a newline"
            elif unicodedata.category(ch) == "Cf":
                hint = "invisible format characters can make a line display differently from what it is; delete it"
            diags.append(Diagnostic("error", f"the spec contains the character {char_name(ch)}",
                                    Pos(line, column, line, column + 1), hint))
            if len(diags) >= 5:
                break
        column += 1
    if diags:
        raise SpecError(diags, filename, text)
    return text


def decode(data: bytes, filename: str) -> str:
    """UTF-8 text of a spec file's bytes, or a :class:`SpecError` at the offending byte."""
    if len(data) > MAX_SOURCE_BYTES:
        raise SpecError([Diagnostic("error", f"the spec is {len(data)} bytes; layoutc reads specs of at most "
                                             f"{MAX_SOURCE_BYTES} bytes")], filename)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        head = data[: err.start]
        line = head.count(b"\n") + 1
        column = len(head[head.rfind(b"\n") + 1:].decode("utf-8", "replace")) + 1
        shown = head.decode("utf-8", "replace") + "\ufffd"
        raise SpecError([Diagnostic("error", f"the spec is not UTF-8 text ({err.reason}, byte 0x{data[err.start]:02x} "
                                             f"at offset {err.start})", Pos(line, column, line, column + 1),
                                    "save the file as UTF-8")], filename, shown) from None


def read_spec(path: str | Path) -> str:
    """The text of a spec file (not yet normalised: :func:`layoutc.front.parse.parse` does that, and the
    hash is over these bytes). Unreadable, oversized and non-UTF-8 files are :class:`SpecError`."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)  # a huge file (or /dev/zero behind a link) is not read whole
    except OSError as err:
        raise SpecError([Diagnostic("error", f"cannot read spec: {err.strerror or err}")], str(path)) from None
    return decode(data, str(path))
