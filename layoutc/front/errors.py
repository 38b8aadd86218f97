"""Diagnostics: every problem in a spec points at its source, the way compilers do.

    specs/x.lyt:12:14: error: unknown operation 'swap_halve'
       12 | swap_halves(w13_weight, dim=1); swap_halve(w13_bias)
          |                                 ^^^^^^^^^^
       hint: did you mean 'swap_halves'?
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

import attrs

from .ast import Pos
from .text import display, forbidden


@attrs.frozen
class Diagnostic:
    severity: str  # "error" | "warning" | "note"
    message: str
    pos: Pos | None = None
    hint: str | None = None
    tensors: tuple[str, ...] = ()  # tensors the finding is about
    related: tuple[tuple[str, Pos], ...] = ()  # (note, position) of other lines involved

    def format(self, filename: str, source: str | None) -> str:
        return format_diagnostic(self, filename, source)


_WINDOW = 120  # characters of a source line shown in an excerpt


def _shown(ch: str) -> str:
    """A character as the excerpt prints it: invisible and control characters escaped."""
    if ch == "\t":
        return " "  # Lark counts a tab as one column
    return ascii(ch)[1:-1] if forbidden(ch) else ch


def _excerpt(lines: Sequence[str], pos: Pos) -> list[str]:
    if not 1 <= pos.line <= len(lines):
        return []
    shown = [_shown(c) for c in lines[pos.line - 1]]  # column k of the source is shown[k - 1]
    text = "".join(shown)
    width = len(str(pos.line))
    end = pos.end_column if pos.end_line == pos.line and pos.end_column > pos.column else pos.column + 1
    end = min(max(end, pos.column + 1), len(shown) + 2)
    lead = sum(len(s) for s in shown[: pos.column - 1]) + max(0, pos.column - 1 - len(shown))
    marks = sum(len(s) for s in shown[pos.column - 1: end - 1]) + max(0, end - 1 - max(len(shown), pos.column - 1))
    marks = max(1, min(marks, _WINDOW // 2))
    if len(text) > _WINDOW:  # a window around the caret: generated or hostile lines can be megabytes
        first = max(0, lead - _WINDOW // 4)
        cut = text[first:first + _WINDOW]
        text = ("..." if first else "") + cut + ("..." if first + _WINDOW < len(text) else "")
        lead = lead - first + (3 if first else 0)
    caret = " " * lead + "^" * marks
    return [f"  {pos.line:>{width}} | {text}", f"  {' ' * width} | {caret}"]


def format_diagnostic(d: Diagnostic, filename: str, source: str | None) -> str:
    # Split on newlines only: str.splitlines() also breaks at characters the parser does not.
    lines = source.split("\n") if source is not None else []
    filename = display(filename)
    where = f"{filename}:{d.pos.line}:{d.pos.column}" if d.pos else filename
    out = [f"{where}: {d.severity}: {display(d.message)}"]
    if d.pos:
        out += _excerpt(lines, d.pos)
    for note, pos in d.related:
        out.append(f"{filename}:{pos.line}:{pos.column}: note: {note}")
        out += _excerpt(lines, pos)
    if d.hint:
        out.append(f"  hint: {display(d.hint)}")
    return "\n".join(out)


def suggest(name: str, choices: Sequence[str]) -> str | None:
    """``did you mean 'swap_halves'?`` for a name close to one of ``choices``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


class SpecError(Exception):
    """A spec could not be parsed, resolved or verified. Carries every error found."""

    def __init__(self, diagnostics: Iterable[Diagnostic], filename: str = "<spec>", source: str | None = None):
        self.diagnostics = tuple(diagnostics)
        self.filename = filename
        self.source = source
        super().__init__(self.render())

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def render(self) -> str:
        return "\n".join(d.format(self.filename, self.source) for d in self.diagnostics)


class Reporter:
    """Collects a pass's findings, one per problem: the same message at the same place is one finding
    naming every tensor it hits (a statement on a list of tensors fails once, not once per tensor)."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def __len__(self) -> int:
        return len(self.diagnostics)

    def __bool__(self) -> bool:
        return bool(self.diagnostics)

    def add(self, d: Diagnostic) -> None:
        for i, old in enumerate(self.diagnostics):
            if (old.severity, old.message, old.pos) == (d.severity, d.message, d.pos):
                more = tuple(t for t in d.tensors if t not in old.tensors)
                self.diagnostics[i] = attrs.evolve(old, tensors=old.tensors + more)
                return
        self.diagnostics.append(d)

    def error(self, message: str, pos: Pos | None = None, hint: str | None = None, tensors: Iterable[str] = (),
              related: Iterable[tuple[str, Pos]] = ()) -> None:
        self.add(Diagnostic("error", message, pos, hint, tuple(tensors), tuple(related)))

    def warning(self, message: str, pos: Pos | None = None, hint: str | None = None, tensors: Iterable[str] = (),
                related: Iterable[tuple[str, Pos]] = ()) -> None:
        self.add(Diagnostic("warning", message, pos, hint, tuple(tensors), tuple(related)))

    def extend(self, diags: Iterable[Diagnostic]) -> None:
        for d in diags:
            self.add(d)

    def raise_if_errors(self, filename: str, source: str | None) -> None:
        if any(d.severity == "error" for d in self.diagnostics):
            raise SpecError(self.diagnostics, filename, source)
