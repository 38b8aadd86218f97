"""Generated Python in lines of at most 120 characters, with the same syntax tree.

A line the emitters write longer than the width is broken after a comma inside brackets (where
Python continues a line by itself), the continuation aligned with the bracket it is in; a trailing
comment that does not fit goes on its own line above. Nothing inside a string literal or a comment
is broken. :func:`wrap` checks that the module parses to the same tree before and after, so a
wrapped converter runs exactly the code it ran before: only the layout of the text changes.
:func:`wrap_parts` wraps a module given as parts (whole top-level statements) one part at a time, each
part once per process (the copied run time, a layer kernel shared by a spec's variants).
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from typing import Sequence

from . import memo

WIDTH = 120
#: Parts up to this many characters are kept once wrapped (larger ones, rare, are wrapped every time).
KEEP_CHARS = 65536


def _scan(line: str, depth: int = 0) -> tuple[list[tuple[int, int]], int | None]:
    """(position after each ``, `` inside brackets outside strings, its bracket depth), and where a
    trailing comment starts (None: none). ``depth``: brackets open where the line starts."""
    breaks: list[tuple[int, int]] = []
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
        elif c in "'\"":
            quote = c * 3 if line.startswith(c * 3, i) else c
            i += len(quote)
            continue
        elif c == "#":
            return breaks, i
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif c == "," and depth and line.startswith(", ", i):
            breaks.append((i + 2, depth))
        i += 1
    return breaks, None


def wrap_line(line: str, width: int = WIDTH, hang: str | None = None, depth: int = 0) -> list[str]:
    """``line`` as lines of at most ``width`` characters where a break is possible: after the
    outermost comma that fits, continuations indented 8 more than the line (``hang``)."""
    if len(line) <= width:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    breaks, hash_at = _scan(line, depth)
    if hash_at is not None and not line[:hash_at].strip():  # a comment line: more comment lines
        return textwrap.wrap(line[hash_at:].lstrip("# "), width, initial_indent=f"{indent}# ",
                             subsequent_indent=f"{indent}#   ", break_long_words=False,
                             break_on_hyphens=False) or [line]
    if hash_at is not None:  # the trailing comment on its own line, above the code
        code, note = line[:hash_at].rstrip(), line[hash_at:]
        return wrap_line(f"{indent}{note}", width) + wrap_line(code, width, hang, depth)
    hang = indent + " " * 8 if hang is None else hang
    fitting = [b for b in breaks if b[0] - 1 <= width and len(hang) < b[0]]
    if not fitting:
        return [line]
    outer = min(d for _, d in fitting)
    at = max(b for b, d in fitting if d == outer)
    head, rest = line[:at].rstrip(), line[at:].lstrip()
    return [head, *wrap_line(hang + rest, width, hang, outer)]


def wrap_source(source: str, width: int = WIDTH) -> str:
    """Every line of ``source`` through :func:`wrap_line`, but for the lines inside a string that
    spans lines (a docstring, an embedded source: text, kept as it is)."""
    inside: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            inside.update(range(tok.start[0], tok.end[0] + 1))
    out: list[str] = []
    for number, line in enumerate(source.split("\n"), start=1):
        out += [line] if number in inside else wrap_line(line, width)
    return "\n".join(out)


def wrap(source: str, width: int = WIDTH) -> str:
    """``source`` (a module) wrapped, checked to parse to the same tree."""
    wrapped = wrap_source(source, width)
    if ast.dump(ast.parse(wrapped)) != ast.dump(ast.parse(source)):
        raise AssertionError("wrapping generated code changed its syntax tree")
    return wrapped


def wrap_parts(parts: Sequence[str], sep: str = "\n", width: int = WIDTH) -> str:
    """``wrap(sep.join(parts))``, but each part wrapped and checked on its own, and kept by its text
    (:mod:`layoutc.lower.memo`). Each part must be whole top-level statements, comments or blank lines: it
    starts at column 0 outside any bracket or string, and parses alone. Lines are wrapped one at a time
    and a module's tree is its statements' trees in order, so the parts wrapped and joined are the bytes
    of the whole wrapped, and the parts' checks are the whole's."""
    if sep.strip("\n"):
        raise ValueError("parts are joined by line breaks only")
    return sep.join(_wrap_part(part, width) for part in parts)


def _wrap_part(part: str, width: int) -> str:
    if max(map(len, part.split("\n"))) <= width:
        return part  # no line to break: wrap() gives the same text back
    if len(part) > KEEP_CHARS:
        return wrap(part, width)
    return memo.get("wrap", (part, width), lambda: wrap(part, width))
